"""Whether a run finished: recorded at its end, or read from its live directory (SPEC §3).

A run written by pdlab ends in one of three recorded ways (`pdlab_run_status`): `finished`
(its writer closed it), `failed` (the writing process raised; what it wrote is kept) or
`recovered` (its writer died, e.g. `kill -9`, and `pdlab recover` folded its live segments
into the database). Until then its state is read from the live directory: `running` while
a writer holds the directory's lock, `crashed` once the lock is free (the writer died and
nothing was recovered yet). Runs finalized by older pdlab versions count as finished; runs
written by other tools (no pdlab bookkeeping) are `unknown`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal, NamedTuple

import duckdb

from telemetry import live
from telemetry.schema import FINALIZED_TABLE, RUN_STATUS_TABLE

Status = Literal["finished", "failed", "recovered", "running", "crashed", "unknown"]
# States in which a run's rows stop before its configured end.
UNFINISHED: tuple[Status, ...] = ("running", "crashed", "failed", "recovered")


class RunState(NamedTuple):
    status: Status
    detail: str | None = None


def writer_alive(db_path: str | os.PathLike[str], run_id: str) -> bool:
    """Whether a process still holds the run's writer lock (its writer is running)."""
    lock = live.RunLock(live.run_dir(db_path, run_id) / live.LOCK_NAME)
    if not lock.path.parent.is_dir():
        return False
    if lock.try_acquire():
        lock.release()
        return False
    return True


def run_states(
    con: duckdb.DuckDBPyConnection,
    db_path: str | os.PathLike[str],
    run_ids: Iterable[str],
    catalog: str | None = None,
) -> dict[str, RunState]:
    """The state of each run; `con` has the database attached as `catalog` (None: no file)."""
    recorded: dict[str, RunState] = {}
    finalized: set[str] = set()
    if catalog is not None:
        tables = {
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() "
                "WHERE schema_name = 'main' AND database_name = ?",
                [catalog],
            ).fetchall()
        }
        if RUN_STATUS_TABLE in tables:
            q = f"SELECT run_id, status, detail FROM {catalog}.main.{RUN_STATUS_TABLE}"
            recorded = {r: RunState(s, d) for r, s, d in con.execute(q).fetchall()}
        if FINALIZED_TABLE in tables:
            q = f"SELECT run_id FROM {catalog}.main.{FINALIZED_TABLE}"
            finalized = {r[0] for r in con.execute(q).fetchall()}
    live_ids = set(live.live_run_ids(db_path))
    out: dict[str, RunState] = {}
    for run_id in run_ids:
        if run_id in recorded:
            out[run_id] = recorded[run_id]
        elif run_id in finalized:
            out[run_id] = RunState("finished")
        elif run_id in live_ids:
            if writer_alive(db_path, run_id):
                out[run_id] = RunState("running", "its writer is still running")
            else:
                out[run_id] = RunState(
                    "crashed", "its writer died before closing it (crashed or killed)"
                )
        else:
            out[run_id] = RunState("unknown")
    return out


def unfinished_note(db_path: str | os.PathLike[str], run_id: str, state: RunState) -> str | None:
    """One line saying that (and how) the run is unfinished, or None for a finished run."""
    if state.status not in UNFINISHED:
        return None
    why = f" ({state.detail})" if state.detail else ""
    if state.status == "running":
        return f"run {run_id} is still being written{why}: its rows so far are shown"
    if state.status == "crashed":
        return (
            f"run {run_id} never finished{why}: only the rows flushed before that are shown; "
            f"`pdlab recover {db_path}` folds them into the database"
        )
    if state.status == "failed":
        return f"run {run_id} failed{why}: only the rows written before the failure are stored"
    return f"run {run_id} was recovered after a crash{why}: its rows stop where it died"
