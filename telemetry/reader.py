"""Readers of telemetry as polars DataFrames, including runs still being written (SPEC §3).

Each query opens an in-memory DuckDB connection, ATTACHes the database READ_ONLY and
defines one view per SPEC §3 table:

    typed empty template  UNION ALL BY NAME  <db table>  UNION ALL BY NAME  <live segments>

The template gives every view all schema columns even when the DB was created by an
external engine with fewer tables or columns, or does not exist yet. Live segments are
taken only from runs that are not in `pdlab_live_finalized`; the writer can consolidate a
run only while no reader holds the file, so a reader sees each row exactly once. The attach
is held for one query (or one `connect()` block), because it blocks the writer's commits.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from telemetry import database, live, store
from telemetry.errors import TelemetryError
from telemetry.schema import FINALIZED_TABLE, META_TABLE, TABLES
from telemetry.status import RunState, run_states
from telemetry.stored_types import stored_as_is

DB_ALIAS = "pdlab_db"
_ATTACHED: Counter[Path] = Counter()  # open connect() blocks per DB file in this process
LIVE_RUNS_VIEW = "pdlab_live_runs"


def _stored(table: str, types: dict[str, str]) -> str:
    """SELECT of a stored table; columns of another type family are cast to the schema's.

    A database written by another tool may store, say, node ids as DOUBLE or durations as
    VARCHAR; the cast gives every reader the documented types (a value that cannot be cast
    fails the query: `telemetry.check` names it first for fit and report).
    """
    schema = {c.name: c for c in TABLES[table]}
    cols = []
    for name, dtype in types.items():
        col = schema.get(name)
        if col is None or stored_as_is(col, dtype):
            cols.append(f'"{name}"')
        else:
            target = "VARCHAR" if col.sql == "JSON" else col.sql
            cols.append(f'CAST("{name}" AS {target}) AS "{name}"')
    return f"SELECT {', '.join(cols)} FROM {DB_ALIAS}.main.{table}"


def _template(table: str) -> str:
    cols = ", ".join(
        f'CAST(NULL AS {"VARCHAR" if c.sql == "JSON" else c.sql}) AS "{c.name}"'
        for c in TABLES[table]
    )
    return f"SELECT {cols} WHERE false"


class TelemetryReader:
    """Reads a telemetry database and the live segments next to it."""

    def __init__(
        self, db_path: str | os.PathLike[str], lock_timeout_s: float = store.LOCK_TIMEOUT_S
    ):
        self.db_path = Path(db_path)
        self.lock_timeout_s = lock_timeout_s

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """An in-memory connection with the DB attached read-only and the table views defined.

        Keep the block short: while it is open, writers cannot commit to the DB.
        """
        con = database.connect()
        key = self.db_path.resolve()
        try:
            self._define_views(con)
            _ATTACHED[key] += 1
            try:
                yield con
            finally:
                _ATTACHED[key] -= 1
        finally:
            con.close()

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        with self.connect() as con:
            rel = con.sql(query, params=list(params) if params is not None else None)
            return pl.DataFrame() if rel is None else rel.pl()

    def table(
        self,
        name: str,
        run_id: str | None = None,
        columns: Sequence[str] | None = None,
        where: str | None = None,
    ) -> pl.DataFrame:
        """Rows of one table, optionally of one run, some columns, and a SQL `where` filter."""
        if name not in TABLES:
            raise TelemetryError(
                f"unknown telemetry table {name!r}; tables are: {', '.join(TABLES)}"
            )
        allowed = [c.name for c in TABLES[name]]
        cols = list(columns) if columns is not None else allowed
        unknown = [c for c in cols if c not in allowed]
        if unknown:
            raise TelemetryError(
                f"{name}: unknown column(s) {', '.join(unknown)}; columns are: {', '.join(allowed)}"
            )
        conds, params = [], []
        if run_id is not None:
            conds.append("run_id = ?")
            params.append(run_id)
        if where:
            conds.append(f"({where})")
        select = ", ".join(f'"{c}"' for c in cols)
        query = f"SELECT {select} FROM {name}" + (f" WHERE {' AND '.join(conds)}" if conds else "")
        with self.connect() as con:
            if run_id is not None:
                self._check_run(con, name, run_id)
            return con.sql(query, params=params).pl()

    def runs(self) -> pl.DataFrame:
        """All runs, oldest first; `live` is true while a run's segments are not finalized.

        `status` says how each run ended (telemetry.status: finished, failed, recovered,
        running, crashed, unknown) and `status_detail` why.
        """
        with self.connect() as con:
            df = con.sql(
                f"SELECT r.*, r.run_id IN (SELECT run_id FROM {LIVE_RUNS_VIEW}) AS live "
                "FROM runs r ORDER BY r.started_at, r.run_id"
            ).pl()
            states = self._states(con, df["run_id"].to_list())
        return df.with_columns(
            pl.Series("status", [states[r].status for r in df["run_id"]], pl.String),
            pl.Series("status_detail", [states[r].detail for r in df["run_id"]], pl.String),
        )

    def run_state(self, run_id: str) -> RunState:
        """How the run ended, or that it is still running or crashed (telemetry.status)."""
        with self.connect() as con:
            return self._states(con, [run_id])[run_id]

    def _states(self, con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, RunState]:
        attached = con.execute(
            "SELECT 1 FROM duckdb_databases() WHERE database_name = ?", [DB_ALIAS]
        ).fetchall()
        return run_states(con, self.db_path, run_ids, DB_ALIAS if attached else None)

    def resolve_run(self, run_id: str | None) -> str:
        """`run_id` if known; with None, the only run (an error lists them if there are more)."""
        ids = self.runs()["run_id"].to_list()
        if run_id is None:
            if len(ids) == 1:
                return str(ids[0])
            if not ids:
                raise TelemetryError(f"{self.db_path} holds no runs")
            raise TelemetryError(
                f"{self.db_path} holds {len(ids)} runs; choose one of: {', '.join(ids)}"
            )
        if run_id not in ids:
            raise TelemetryError(
                f"unknown run {run_id!r} in {self.db_path}; runs: {', '.join(ids) or 'none'}"
            )
        return run_id

    def nodes(self, run_id: str | None = None) -> pl.DataFrame:
        rid = self.resolve_run(run_id)
        return self.sql("SELECT * FROM nodes WHERE run_id = ? ORDER BY node_id", [rid])

    def _check_run(self, con: duckdb.DuckDBPyConnection, table: str, run_id: str) -> None:
        q = "SELECT 1 FROM runs WHERE run_id = ? LIMIT 1"
        if con.execute(q, [run_id]).fetchall():
            return
        # Runs written by external engines may lack a runs row; data of the run still counts.
        if con.execute(f"SELECT 1 FROM {table} WHERE run_id = ? LIMIT 1", [run_id]).fetchall():
            return
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        raise TelemetryError(
            f"unknown run {run_id!r} in {self.db_path}; runs: {', '.join(known) or 'none'}"
        )

    def _define_views(self, con: duckdb.DuckDBPyConnection) -> None:
        db_tables: dict[str, dict[str, str]] = {}
        finalized: set[str] = set()
        if self.db_path.exists():
            database.check_database(self.db_path)
            if not _ATTACHED[self.db_path.resolve()]:
                # Yield to a waiting writer, unless this process already holds the file (the
                # writer cannot get it before that connection closes anyway).
                live.wait_for_writers(self.db_path, self.lock_timeout_s)
            attach = f"ATTACH {store.sql_str(self.db_path)} AS {DB_ALIAS} (READ_ONLY)"
            store.retry_locked(
                lambda: con.execute(attach), self.db_path, self.lock_timeout_s, "read telemetry"
            )
            db_tables = store.table_types(con, DB_ALIAS)
            prefix = f"{DB_ALIAS}.main."
            if META_TABLE in db_tables:
                store.check_version(con, self.db_path, prefix, exact=False)
            if FINALIZED_TABLE in db_tables:
                rows = con.execute(f"SELECT run_id FROM {prefix}{FINALIZED_TABLE}").fetchall()
                finalized = {r[0] for r in rows}
        # While the attach is held no run can be finalized, so the live segments listed now
        # stay in place for this connection. (Without a DB file there is no attach to hold: a
        # run finalized at that very moment can make the query fail; running it again works.)
        live_runs = [r for r in live.live_run_ids(self.db_path) if r not in finalized]
        segs: dict[str, list[Path]] = {}
        for run_id in live_runs:
            for table, files in live.segments(self.db_path, run_id).items():
                segs.setdefault(table, []).extend(files)
        for table in TABLES:
            parts = [_template(table)]
            if table in db_tables:
                parts.append(_stored(table, db_tables[table]))
            if segs.get(table):
                src = f"SELECT * FROM {store.parquet_source(segs[table])} s"
                keys = live.WRITTEN_THROUGH.get(table)
                if keys and table in db_tables:
                    match = " AND ".join(f"d.{k} = s.{k}" for k in keys)
                    src += (
                        f" WHERE NOT EXISTS (SELECT 1 FROM {DB_ALIAS}.main.{table} d WHERE {match})"
                    )
                parts.append(src)
            con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
        ids = ", ".join(store.sql_str(r) for r in live_runs)
        con.execute(
            f"CREATE VIEW {LIVE_RUNS_VIEW} AS "
            + (
                f"SELECT unnest([{ids}]) AS run_id"
                if ids
                else "SELECT NULL::VARCHAR AS run_id WHERE false"
            )
        )


def open_reader(db_path: str | os.PathLike[str]) -> TelemetryReader:
    """A reader of `db_path`; it must exist, or live segments of a run must exist beside it."""
    db = Path(db_path)
    if db.exists():
        database.check_database(db)
    elif not live.live_run_ids(db):
        raise TelemetryError(
            f"no telemetry at {db}: neither the database nor live segments ({live.live_root(db)}) exist"
        )
    return TelemetryReader(db)
