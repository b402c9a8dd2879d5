"""What a notebook of notebooks/ owns: its database and the size of its runs (SPEC §7).

Each notebook writes its own DuckDB file, `.data/<notebook>.duckdb` next to it (Jupyter runs
a notebook in its own folder), started afresh on every execution: notebooks never write the
live server's database nor each other's. Notebooks 01 and 02 first look for the main job's
run (`main_run`: the README's first command writes `pdlab.duckdb` at the project root,
`pdlab lab` passes its `--db` as `PDLAB_DB`) and only read it; without one they simulate
their own, saying so.

`run_size` is the knob of a notebook's config cell: "default" runs in a minute or two on a
small machine, "full" is the paper-sized run (paper 000 §6: 9 nodes, an hour of simulated
time) and takes many minutes; "quick" (seconds) is what the tests execute, chosen with the
environment variable `PDLAB_QUICK=1` whatever the cell says.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

from cluster.core import ConfigError

DATA_DIR = Path(".data")
SIZES = ("quick", "default", "full")
QUICK_ENV = "PDLAB_QUICK"
DB_ENV = "PDLAB_DB"  # `pdlab lab --db` (default: the main job's pdlab.duckdb)
MAIN_DB = Path("..") / "pdlab.duckdb"  # the main job's, seen from notebooks/


class MainRun(NamedTuple):
    """The main job's run a notebook reads (never writes)."""

    db: Path
    run_id: str


def main_run(db: str | os.PathLike[str] | None = None) -> MainRun | None:
    """The main job's run: the last finished simulated run (`pdlab simulate`, source "sim")
    of `db`, else of $PDLAB_DB (what `pdlab lab --db` names), else of `../pdlab.duckdb`;
    None when none of them holds one (a live lab run is not a finished one)."""
    from telemetry import TelemetryError, open_reader

    env = os.environ.get(DB_ENV)
    candidates = [Path(db)] if db is not None else [*([Path(env)] if env else []), MAIN_DB]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            runs = open_reader(path).runs()
        except TelemetryError:  # not a pdlab database, or locked for longer than a reader waits
            continue
        done = runs.filter((runs["source"] == "sim") & (runs["status"] == "finished"))
        if done.height:
            return MainRun(path, str(done["run_id"][-1]))
    return None


def run_size(chosen: str = "default") -> str:
    """The size a notebook runs at: `chosen` (its config cell), or "quick" when
    $PDLAB_QUICK is 1 (the tests)."""
    if chosen not in SIZES:
        raise ConfigError(f"run size must be one of {', '.join(SIZES)}, got {chosen!r}")
    return "quick" if os.environ.get(QUICK_ENV) == "1" else chosen


def notebook_db(name: str, fresh: bool = True, data_dir: str | os.PathLike[str] = DATA_DIR) -> Path:
    """`<data_dir>/<name>.duckdb`, the notebook's own database (the folder is created).

    With `fresh`, what an earlier execution left there (the file, its write-ahead log and
    live segments) is removed first, so the database holds only this execution's runs.
    """
    if not name or Path(name).name != name or name.startswith("."):
        raise ConfigError(f"a notebook database is named by a plain file stem, got {name!r}")
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"{name}.duckdb"
    if fresh:
        for leftover in (db, db.with_name(db.name + ".wal")):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(db.with_name(db.name + ".live"), ignore_errors=True)
    return db
