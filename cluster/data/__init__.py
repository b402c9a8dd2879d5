"""Real data that ships with pdlab, and where a full copy is used from (`pdlab data`).

The data sets of `catalog.DATASETS` (traces, real vLLM runs, GPU operator profiles, model
configs, the LLMServingSim A6000 artifact; each with its source and license) are bundled as
package data under `cluster/data/files/`, in the layout of a full copy, files over 256 KiB
gzip-compressed (`<name>.gz`). A full copy is used instead when there is one:

1. `$PDLAB_DATA_DIR`;
2. `<project root>/../shared/data`, when a checkout sits next to the project's shared data;
3. the bundled copy.

`data_path(rel)` is the first root holding `rel` (or `rel.gz`), so a partial full copy works
too; `data_dir()` is the first full root, else the bundled one (for callers that join paths
themselves and read `.gz` stand-ins). Nothing here reads tests/fixtures: a test tree is not
package data.
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster.core import ConfigError
from cluster.data.catalog import BY_NAME, DATASETS, Dataset

DATA_ENV = "PDLAB_DATA_DIR"
BUNDLED = Path(__file__).resolve().parent / "files"

__all__ = [
    "BUNDLED",
    "DATASETS",
    "DATA_ENV",
    "Dataset",
    "data_dir",
    "data_path",
    "data_root",
    "dataset_path",
    "full_roots",
    "origin",
]


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def full_roots() -> list[Path]:
    """Where a full copy may be: $PDLAB_DATA_DIR (when set), `../shared/data` (when it is
    a directory)."""
    out = []
    env = os.environ.get(DATA_ENV)
    if env:
        out.append(Path(env).expanduser())
    shared = project_root().parent / "shared" / "data"
    if shared.is_dir():
        out.append(shared)
    return out


def _present(path: Path) -> Path | None:
    if path.exists():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if path.suffix != ".gz" and gz.is_file() else None


def data_root(rel: str | os.PathLike[str]) -> Path:
    """The first root (full copies, then the bundled one) that holds `rel` or `rel.gz`."""
    for root in [*full_roots(), BUNDLED]:
        if _present(root / rel) is not None:
            return root
    roots = ", ".join(str(r) for r in [*full_roots(), BUNDLED])
    raise ConfigError(
        f"real data {os.fspath(rel)!r} not found (looked in {roots}); `pdlab data list` shows "
        f"what is bundled; set ${DATA_ENV} to a full copy for the rest"
    )


def data_path(rel: str | os.PathLike[str]) -> Path:
    """`rel` under the first root that holds it; a file's `.gz` copy when only that exists."""
    found = _present(data_root(rel) / rel)
    assert found is not None
    return found


def dataset_path(name: str) -> Path:
    """A data set by its catalog name (`sweagent`, `lss-a6000`, ...) or a path under a data
    root (`models/Qwen/Qwen3-32B.json`)."""
    if name in BY_NAME:
        return data_path(BY_NAME[name].path)
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ConfigError(f"{name!r}: give a data set name or a path under the data root")
    try:
        return data_path(name)
    except ConfigError:
        names = ", ".join(BY_NAME)
        raise ConfigError(
            f"unknown data set {name!r}: use one of {names}, or a path under a data root"
        ) from None


def origin(rel: str | os.PathLike[str]) -> str:
    """Which copy `rel` is read from, in words (what notebooks print in their config cell)."""
    root = data_root(rel)
    kind = "the bundled copy" if root == BUNDLED else "the full copy"
    return f"{os.fspath(rel)} from {kind} in {root}"


def data_dir() -> Path:
    """The first full copy's root, else the bundled copy's."""
    for root in full_roots():
        if root.is_dir():
            return root
    return BUNDLED
