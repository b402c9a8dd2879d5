"""The DuckDB side of telemetry (SPEC §3): schema, short transactions, consolidation.

DuckDB lets one process open a file read-write, or many processes read-only, never both.
So nothing here keeps the file open: every write is one short transaction (runs and nodes
rows, `write_rows`, the final consolidation of a run's live segments), retried with backoff
while a reader holds the file. When another process holds the lock DuckDB 2.0 raises
`duckdb.IOException` ("Could not set lock on file ... Conflicting lock is held"); a second
attach of the same file inside one process raises `duckdb.ResourceInUseException` ("Unique
file handle conflict"); on Windows the IOException says the file "is being used by another
process". All three are retried; anything else propagates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from telemetry import database, live
from telemetry.errors import TelemetryError
from telemetry.schema import (
    FINALIZED_TABLE,
    META_TABLE,
    RUN_STATUS_DDL,
    RUN_STATUS_TABLE,
    SCHEMA_VERSION,
    TABLES,
    ddl,
)
from telemetry.validate import check_new_nodes, validate_batch

LOCK_TIMEOUT_S = 30.0
_LOCK_MARKERS = (
    "could not set lock",
    "conflicting lock",
    "unique file handle conflict",
    "being used by another process",
)
_RIO = getattr(duckdb, "ResourceInUseException", duckdb.IOException)
R = TypeVar("R")


def is_lock_error(exc: BaseException) -> bool:
    if not isinstance(exc, duckdb.IOException | _RIO):
        return False
    text = str(exc).lower()
    return any(m in text for m in _LOCK_MARKERS)


def retry_locked(fn: Callable[[], R], db_path: Path, timeout_s: float, what: str) -> R:
    """Call `fn` until it stops failing with a lock error or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return fn()
        except (duckdb.IOException, _RIO) as exc:
            if not is_lock_error(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise TelemetryError(
                    f"could not {what}: {db_path} stayed locked by another connection for "
                    f"{timeout_s:g} s (DuckDB: {exc})"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 1.6, 0.1)


def sql_str(value: str | os.PathLike[str]) -> str:
    return "'" + os.fspath(value).replace("'", "''") + "'"


def sql_list(paths: Iterable[Path]) -> str:
    return "[" + ", ".join(sql_str(p) for p in paths) + "]"


def parquet_source(files: list[Path]) -> str:
    return f"read_parquet({sql_list(files)}, union_by_name = true)"


def table_columns(
    con: duckdb.DuckDBPyConnection, catalog: str | None = None
) -> dict[str, list[str]]:
    where = "database_name = current_database()" if catalog is None else "database_name = ?"
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        f"WHERE {where} AND schema_name = 'main' ORDER BY table_name, column_index",
        [] if catalog is None else [catalog],
    ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def table_types(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, dict[str, str]]:
    """Table -> column -> DuckDB type name of the `main` schema of an attached database."""
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = ? AND schema_name = 'main' ORDER BY table_name, column_index",
        [catalog],
    ).fetchall()
    out: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        out.setdefault(table, {})[column] = dtype
    return out


def check_version(
    con: duckdb.DuckDBPyConnection, db_path: Path, prefix: str, exact: bool = True
) -> int | None:
    rows = con.execute(
        f"SELECT value FROM {prefix}{META_TABLE} WHERE key = 'schema_version'"
    ).fetchall()
    if not rows:
        return None
    version = int(rows[0][0])
    if version > SCHEMA_VERSION or (exact and version != SCHEMA_VERSION):
        raise TelemetryError(
            f"{db_path} holds telemetry schema version {version}; this pdlab "
            f"{'writes' if exact else 'reads up to'} version {SCHEMA_VERSION} (export the runs "
            "with a matching pdlab, or write to a new database)"
        )
    return version


def ensure_schema(
    con: duckdb.DuckDBPyConnection,
    db_path: Path,
    tables: Iterable[str] = TABLES,
    claim: bool = True,
) -> None:
    """Create missing tables and columns; check (and with `claim`, record) the version.

    Tables written by external engines may lack columns added in later schema versions;
    those are added (nullable, since old rows have no value).
    """
    existing = table_columns(con)
    if META_TABLE in existing:
        check_version(con, db_path, "")
    elif claim:
        con.execute(f"CREATE TABLE {META_TABLE} (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute(f"INSERT INTO {META_TABLE} VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    for table in tables:
        if table not in existing:
            con.execute(ddl(table))
            continue
        for col in TABLES[table]:
            if col.name not in existing[table]:
                con.execute(f'ALTER TABLE {table} ADD COLUMN "{col.name}" {col.sql}')
    if claim and FINALIZED_TABLE not in existing:
        con.execute(
            f"CREATE TABLE {FINALIZED_TABLE} (run_id VARCHAR PRIMARY KEY, finalized_at TIMESTAMP)"
        )
    if claim and RUN_STATUS_TABLE not in existing:
        con.execute(RUN_STATUS_DDL)


@contextmanager
def transaction(
    db_path: Path,
    timeout_s: float = LOCK_TIMEOUT_S,
    what: str = "write telemetry",
    tables: Iterable[str] = TABLES,
    claim: bool = True,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the DB read-write (retrying while locked), ensure the schema, run one transaction."""
    database.check_database(db_path)
    with live.write_intent(db_path):
        con = retry_locked(lambda: database.connect(db_path), db_path, timeout_s, what)
        try:
            con.begin()
            ensure_schema(con, db_path, tables, claim)
            yield con
            con.commit()
        except BaseException:
            con.rollback()
            raise
        finally:
            con.close()


def run_exists(con: duckdb.DuckDBPyConnection, db_path: Path, run_id: str) -> bool:
    existing = table_columns(con)
    for table in ("runs", FINALIZED_TABLE):
        if table in existing:
            q = f"SELECT 1 FROM {table} WHERE run_id = ? LIMIT 1"
            if con.execute(q, [run_id]).fetchall():
                return True
    return False


def insert(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    con.register("pdlab_batch", data)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM pdlab_batch")
    finally:
        con.unregister("pdlab_batch")


def consolidate(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    segs: dict[str, list[Path]],
    status: str = "finished",
    detail: str | None = None,
) -> bool:
    """Insert a run's segments and mark it finalized with `status`, in the caller's transaction.

    Returns False when the run was already finalized (a crash after commit, before the live
    directory was removed): then nothing is inserted twice.
    """
    q = f"SELECT 1 FROM {FINALIZED_TABLE} WHERE run_id = ?"
    if con.execute(q, [run_id]).fetchall():
        return False
    for table, files in segs.items():
        if table not in TABLES:
            continue
        keys = live.WRITTEN_THROUGH.get(table)
        anti = ""
        if keys:
            match = " AND ".join(f"d.{k} = s.{k}" for k in keys)
            anti = f" WHERE NOT EXISTS (SELECT 1 FROM {table} d WHERE {match})"
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {parquet_source(files)} s{anti}")
    con.execute(f"INSERT INTO {FINALIZED_TABLE} VALUES (?, now()::TIMESTAMP)", [run_id])
    con.execute(
        f"INSERT OR REPLACE INTO {RUN_STATUS_TABLE} VALUES (?, ?, now()::TIMESTAMP, ?)",
        [run_id, status, detail],
    )
    return True


def finalize_run(
    db_path: Path,
    run_id: str,
    timeout_s: float = LOCK_TIMEOUT_S,
    status: str = "finished",
    detail: str | None = None,
) -> bool:
    """Move a run's live segments into the DB in one transaction (the live dir stays)."""
    segs = live.segments(db_path, run_id)
    what = f"finalize run {run_id!r} (its segments stay in {live.run_dir(db_path, run_id)})"
    with transaction(db_path, timeout_s, what) as con:
        return consolidate(con, run_id, segs, status, detail)


def segment_rows(segs: dict[str, list[Path]]) -> dict[str, int]:
    """Rows per table in a run's segments (from the Parquet footers; no data is read)."""
    return {t: sum(pq.ParquetFile(f).metadata.num_rows for f in files) for t, files in segs.items()}


def remove_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Delete a run's rows from every SPEC §3 table (inside the caller's transaction)."""
    existing = table_columns(con)
    for table in TABLES:
        if table in existing:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def recover(db_path: str | os.PathLike[str], timeout_s: float = LOCK_TIMEOUT_S) -> list[str]:
    """Finalize the live runs whose writer is gone (crashed or killed); return their ids.

    Each is marked `recovered` (telemetry.status). A run whose writer process still holds
    its lock is left alone. Live directories of runs that were already finalized (crash
    between commit and cleanup) are removed.
    """
    db = database.check_database(db_path)
    done: list[str] = []
    for run_id in live.live_run_ids(db):
        base = live.run_dir(db, run_id)
        lock = live.RunLock(base / live.LOCK_NAME)
        if not lock.try_acquire():
            continue
        try:
            rows = segment_rows(live.segments(db, run_id))
            data = sum(n for t, n in rows.items() if t not in live.WRITTEN_THROUGH)
            detail = f"its writer died; {data} rows recovered from its live segments"
            inserted = finalize_run(db, run_id, timeout_s, "recovered", detail)
        finally:
            lock.release()
        live.remove_run_dir(base)
        if inserted:
            done.append(run_id)
    return done


def known_run_ids(con: duckdb.DuckDBPyConnection, db_path: Path) -> list[str]:
    ids = set(live.live_run_ids(db_path))
    if "runs" in table_columns(con):
        ids.update(r[0] for r in con.execute("SELECT DISTINCT run_id FROM runs").fetchall())
    return sorted(ids)


def db_node_ids(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    if "nodes" not in table_columns(con):
        return set()
    rows = con.execute("SELECT node_id FROM nodes WHERE run_id = ?", [run_id]).fetchall()
    return {int(r[0]) for r in rows}


def write_rows(
    db_path: str | os.PathLike[str],
    table: str,
    data: Any,
    run_id: str,
    timeout_s: float = LOCK_TIMEOUT_S,
) -> int:
    """Validate `data` and insert it into `table` for `run_id` in one transaction.

    For small, final tables written after a run (model_fits from `pdlab fit`, importers).
    Works on databases created by external engines: a missing table is created, and no
    pdlab bookkeeping tables are added. Returns the number of rows inserted.
    """
    db = Path(db_path)
    if table not in TABLES:
        raise TelemetryError(f"unknown telemetry table {table!r}; tables are: {', '.join(TABLES)}")
    live.check_run_id(run_id)
    with transaction(db, timeout_s, f"write {table} rows", tables=[table], claim=False) as con:
        if table == "runs":
            if run_exists(con, db, run_id) or live.run_dir(db, run_id).exists():
                raise TelemetryError(f"run {run_id!r} already exists in {db}")
        else:
            known = known_run_ids(con, db)
            if run_id not in known:
                raise TelemetryError(
                    f"unknown run {run_id!r} in {db}; runs: {', '.join(known) or 'none'}"
                )
        nodes = db_node_ids(con, run_id)
        batch = validate_batch(table, data, run_id, nodes)
        if table == "nodes":
            check_new_nodes(batch, nodes)
        insert(con, table, batch)
        return batch.num_rows
