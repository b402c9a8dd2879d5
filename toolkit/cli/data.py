"""`pdlab data list|path`: the real data pdlab ships and where a full copy is used from.

`list` shows every data set of `cluster.data.catalog` (what, source, license), its bundled
size and which copy is read: a full copy (`$PDLAB_DATA_DIR`, or `../shared/data` next to a
checkout) when it holds the data set, else the copy bundled with pdlab. `path NAME` prints
the path used, for the shell:

    pdlab import lss-bench $(pdlab data path vllm-rtx4090-llama31-8b) --db real.duckdb
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from toolkit.cli.style import HELP_STYLE

data_app = typer.Typer(
    help="The real data pdlab ships (traces, real runs, GPU profiles) and full copies.",
    no_args_is_help=True,
    **HELP_STYLE,
)


def _bundled_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    gz = path.with_name(path.name + ".gz")
    return path.stat().st_size if path.is_file() else gz.stat().st_size if gz.is_file() else 0


def _entries() -> list[dict[str, Any]]:
    from cluster.data import BUNDLED, DATASETS, data_path, data_root

    out = []
    for d in DATASETS:
        root = data_root(d.path)
        out.append(
            {
                "name": d.name,
                "path": d.path,
                "what": d.what,
                "source": d.source,
                "license": d.license,
                "bundled_bytes": _bundled_bytes(BUNDLED / d.path),
                "used_from": "bundled" if root == BUNDLED else "full copy",
                "used_path": str(data_path(d.path)),
            }
        )
    return out


@data_app.command("list")
def list_command(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per data set, in a list."),
) -> None:
    """Every data set: what it is, its source and license, and which copy is read."""
    from cluster.data import BUNDLED, DATA_ENV, full_roots

    entries = _entries()
    if as_json:
        typer.echo(json.dumps(entries, indent=1))
        return
    total = sum(e["bundled_bytes"] for e in entries)
    full = ", ".join(str(r) for r in full_roots()) or "none"
    typer.echo(f"bundled copy: {BUNDLED} ({total / 1e6:.1f} MB, files over 256 KiB gzipped)")
    typer.echo(
        f"full copies (used first): {full}  (${DATA_ENV}: {os.environ.get(DATA_ENV) or 'unset'})"
    )
    for e in entries:
        typer.echo("")
        typer.echo(f"{e['name']}  ({e['path']}, {e['bundled_bytes'] / 1e6:.2f} MB bundled)")
        typer.echo(f"  {e['what']}")
        typer.echo(f"  source: {e['source']}; license: {e['license']}")
        typer.echo(f"  read from: {e['used_from']}: {e['used_path']}")


@data_app.command("path")
def path_command(
    name: str = typer.Argument(
        ..., help="A data set name (`pdlab data list`) or a path under the data root."
    ),
) -> None:
    """Print the path of a data set: the full copy's when there is one, else the bundled."""
    from cluster.core import ConfigError
    from cluster.data import dataset_path

    try:
        typer.echo(str(dataset_path(name)))
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
