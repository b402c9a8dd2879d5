"""The runs a database holds, one line each, and removing runs (`pdlab runs`, SPEC §3).

`run_catalog(db)` lists every run: the runs rows, and runs that have rows but no runs row
(external engines write such databases). Per run: its kind (`runs.source`: sim, vllm-bench,
twin, ...), start (`runs.started_at`), end, status (telemetry.status) and rows per table,
live segments included. The end is the recorded end of a run pdlab wrote
(`pdlab_run_status.ended_at`), else the end an importer read from the run's files
(`config.finished_at`), else the start plus the last request's completion, else unknown.

`remove_runs(db, ids)` deletes each run's rows from every SPEC §3 table and from pdlab's
bookkeeping tables (`pdlab_run_status`, `pdlab_live_finalized`) in one transaction: all
runs go or none does. A run whose writer still runs is refused; a crashed run's live
directory is removed after the commit (its segments are the run's rows too).
`delete_run_rows` is the same deletion inside a caller's transaction (an import with
`--replace`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import duckdb

from telemetry import database, live, store
from telemetry.errors import TelemetryError
from telemetry.reader import DB_ALIAS, TelemetryReader
from telemetry.schema import FINALIZED_TABLE, RUN_STATUS_TABLE, TABLES
from telemetry.status import run_states, writer_alive


class RunEntry(NamedTuple):
    """One run of a database (module docstring)."""

    run_id: str
    kind: str  # runs.source; "" when the run has no runs row
    started: datetime | None
    finished: datetime | None
    status: str
    rows: dict[str, int]  # table -> rows of this run (tables with none left out)
    config: dict[str, Any]

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.run_id,
            "kind": self.kind,
            "started": None if self.started is None else self.started.isoformat(),
            "finished": None if self.finished is None else self.finished.isoformat(),
            "rows": self.total_rows,
            "status": self.status,
            "rows_by_table": self.rows,
        }


def _config(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        doc = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _iso(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts.replace(tzinfo=None) - (ts.utcoffset() or timedelta(0)) if ts.tzinfo else ts


def run_catalog(db_path: str | os.PathLike[str]) -> list[RunEntry]:
    """Every run of the database, oldest first (module docstring)."""
    reader = TelemetryReader(db_path)
    with reader.connect() as con:
        counts: dict[str, dict[str, int]] = {}
        for table in TABLES:
            for rid, n in con.execute(
                f"SELECT run_id, count(*) FROM {table} GROUP BY run_id"
            ).fetchall():
                counts.setdefault(str(rid), {})[table] = int(n)
        runs = con.execute(
            "SELECT run_id, source, started_at, config FROM runs ORDER BY started_at, run_id"
        ).fetchall()
        last_done = dict(
            con.execute("SELECT run_id, max(t_done) FROM requests GROUP BY run_id").fetchall()
        )
        ids = [str(r[0]) for r in runs] + sorted(set(counts) - {str(r[0]) for r in runs})
        q = "SELECT 1 FROM duckdb_databases() WHERE database_name = ?"
        attached = bool(con.execute(q, [DB_ALIAS]).fetchall())
        states = run_states(con, reader.db_path, ids, DB_ALIAS if attached else None)
        ended = _ended(con) if attached else {}
    out = []
    by_id = {str(r[0]): r for r in runs}
    for rid in ids:
        _, source, started, raw = by_id.get(rid, (rid, "", None, None))
        cfg = _config(raw)
        finished = ended.get(rid) or _iso(cfg.get("finished_at"))
        if finished is None and started is not None and last_done.get(rid) is not None:
            finished = started + timedelta(seconds=float(last_done[rid]))
        out.append(
            RunEntry(
                rid, str(source or ""), started, finished, states[rid].status,
                counts.get(rid, {}), cfg,
            )
        )  # fmt: skip
    return out


def _ended(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """run -> recorded end (pdlab_run_status), where the database has that table."""
    tables = store.table_columns(con, DB_ALIAS)
    if RUN_STATUS_TABLE not in tables:
        return {}
    q = f"SELECT run_id, ended_at FROM {DB_ALIAS}.main.{RUN_STATUS_TABLE} WHERE ended_at IS NOT NULL"
    return {str(r): t for r, t in con.execute(q).fetchall()}


def delete_run_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Delete the run's rows from every table that exists (in the caller's transaction)."""
    store.remove_run(con, run_id)
    existing = store.table_columns(con)
    for table in (RUN_STATUS_TABLE, FINALIZED_TABLE):
        if table in existing:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def remove_runs(
    db_path: str | os.PathLike[str],
    run_ids: list[str],
    timeout_s: float = store.LOCK_TIMEOUT_S,
) -> dict[str, dict[str, int]]:
    """Delete the runs (module docstring); returns the rows removed per run and table."""
    db = database.check_database(db_path, must_exist=True)
    if not run_ids:
        raise TelemetryError("name at least one run to remove")
    catalog = {e.run_id: e for e in run_catalog(db)}
    unknown = [r for r in run_ids if r not in catalog]
    if unknown:
        raise TelemetryError(
            f"unknown run(s) {', '.join(map(repr, unknown))} in {db}; runs: "
            f"{', '.join(catalog) or 'none'}"
        )
    running = [r for r in run_ids if writer_alive(db, r)]
    if running:
        raise TelemetryError(
            f"run(s) {', '.join(map(repr, running))} are still being written; stop their "
            "writer first"
        )
    ids = list(dict.fromkeys(run_ids))
    with store.transaction(db, timeout_s, f"remove run(s) {', '.join(ids)}", (), False) as con:
        for rid in ids:
            delete_run_rows(con, rid)
    for rid in ids:
        base = live.run_dir(db, rid)
        if base.exists():
            live.remove_run_dir(base)
    return {rid: dict(catalog[rid].rows) for rid in ids}


def runs_referring_to(entries: list[RunEntry], run_id: str) -> list[str]:
    """Runs whose config names `run_id` as the run they replay (`twin_of`)."""
    return [e.run_id for e in entries if e.config.get("twin_of") == run_id]
