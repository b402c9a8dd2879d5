"""Check a database's tables against the documented schema before analysing them (SPEC §3).

pdlab's writer validates every row it stores, but `pdlab fit` and `pdlab report` also read
databases written by other tools. Their tables are read through views that cast stored
types to the documented ones (telemetry.reader), so a column that is merely stored as
another type works; what cannot work is caught here first, as one line naming the table,
the column and what is allowed:

- a required column is missing (a misspelt `attention_pairs` for `attn_pairs` would
  otherwise read as NULL and silently exclude every row; a close name is suggested);
- a column holds values its documented type cannot take (text in a number column, 1.5 in
  an integer id, a string where a list of coefficients belongs);
- an id column (run_id, node_id, iter_id, request_id, ...) holds NULLs: such rows belong
  to no run, node or iteration.

Only tables present in the database file are checked (live segments were validated when
written). `precheck` adds the run's status: a run that never finished is reported.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from typing import Any

import duckdb

from telemetry import database
from telemetry.errors import TelemetryError
from telemetry.reader import DB_ALIAS, TelemetryReader
from telemetry.schema import TABLES, Column
from telemetry.status import unfinished_note
from telemetry.stored_types import stored_as_is, type_family
from telemetry.validate import ALLOWED_VALUES

ID_COLUMNS = ("run_id", "node_id", "iter_id", "request_id", "program_id", "branch_id")
_MAX_SHOWN = 3  # problems named in one error line


def check_tables(
    source: str | os.PathLike[str] | TelemetryReader, tables: Iterable[str] | None = None
) -> None:
    """Raise `TelemetryError` if a SPEC §3 table of the database file breaks the schema."""
    reader = source if isinstance(source, TelemetryReader) else TelemetryReader(source)
    database.check_database(reader.db_path, must_exist=True)
    with reader.connect() as con:
        check_connection(con, str(reader.db_path), tables)


def check_connection(
    con: duckdb.DuckDBPyConnection, label: str, tables: Iterable[str] | None = None
) -> None:
    """`check_tables` on a reader connection (the database attached as `DB_ALIAS`)."""
    wanted = list(TABLES) if tables is None else [t for t in tables if t in TABLES]
    stored = _stored_types(con)
    problems: list[str] = []
    for table in wanted:
        if table in stored:
            problems += _table_problems(con, table, stored[table])
    if problems:
        more = len(problems) - _MAX_SHOWN
        tail = f"; and {more} more" if more > 0 else ""
        raise TelemetryError(f"{label}: " + "; ".join(problems[:_MAX_SHOWN]) + tail)


def precheck(
    db_path: str | os.PathLike[str], run_id: str | None, tables: Iterable[str] | None = None
) -> str | None:
    """Check the database and its tables; return a note if the run never finished.

    `run_id` None means the database's only run (skipped when it holds several: the
    caller's own resolution then names them). Raises `TelemetryError`.
    """
    reader = TelemetryReader(database.check_database(db_path, must_exist=True))
    check_tables(reader, tables)
    ids = reader.runs()["run_id"].to_list()
    rid = run_id if run_id is not None else (ids[0] if len(ids) == 1 else None)
    if rid is None or rid not in ids:
        return None
    return unfinished_note(reader.db_path, rid, reader.run_state(rid))


def _stored_types(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = ? AND schema_name = 'main'",
        [DB_ALIAS],
    ).fetchall()
    out: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        out.setdefault(table, {})[column] = dtype
    return out


def _table_problems(con: duckdb.DuckDBPyConnection, table: str, types: dict[str, str]) -> list[str]:
    problems = []
    cols = TABLES[table]
    names = [c.name for c in cols]
    extra = [n for n in types if n not in names]
    missing = [c.name for c in cols if not c.nullable and c.name not in types]
    for name in missing:
        close = difflib.get_close_matches(name, extra, n=1, cutoff=0.6)
        hint = f"; found {close[0]!r}: misspelt?" if close else ""
        problems.append(
            f"table {table} lacks the required column {name}{hint} "
            f"(required: {', '.join(c.name for c in cols if not c.nullable)})"
        )
    present = [c for c in cols if c.name in types]
    for col in present:
        problem = _type_problem(con, table, col, types[col.name])
        if problem:
            problems.append(problem)
    ids = [c for c in present if c.name in ID_COLUMNS and not c.nullable]
    if ids:
        counts = con.execute(
            "SELECT "
            + ", ".join(f'count(*) FILTER (WHERE "{c.name}" IS NULL)' for c in ids)
            + f" FROM {DB_ALIAS}.main.{table}"
        ).fetchone()
        for col, n in zip(ids, counts or (), strict=True):
            if n:
                problems.append(
                    f"{table}.{col.name} is NULL in {n} row(s) (allowed: {ALLOWED_VALUES[col.sql]}, "
                    "never NULL: an id names the run, node or item a row belongs to)"
                )
    return problems


def _bad_values_sql(col: Column, q: str) -> str | None:
    """SQL true for a stored value that the column's documented type cannot take."""
    if col.sql in ("INTEGER", "BIGINT"):
        as_double = f"TRY_CAST({q} AS DOUBLE)"
        return (
            f"{as_double} IS NULL OR NOT isfinite({as_double}) OR {as_double} <> floor({as_double}) "
            f"OR TRY_CAST({as_double} AS {col.sql}) IS NULL"
        )
    if col.sql == "DOUBLE":
        return f"TRY_CAST({q} AS DOUBLE) IS NULL"
    if col.sql in ("VARCHAR", "JSON"):
        return None  # every value has a text form
    return f"TRY_CAST({q} AS {col.sql}) IS NULL"


def _type_problem(
    con: duckdb.DuckDBPyConnection, table: str, col: Column, dtype: str
) -> str | None:
    if stored_as_is(col, dtype):
        return None
    allowed = f"allowed: {ALLOWED_VALUES[col.sql]}"
    where = f"{table}.{col.name} is stored as {dtype}"
    family = type_family(dtype)
    numeric = col.sql in ("INTEGER", "BIGINT", "DOUBLE")
    if (numeric and family in ("bool", "time", "list", "other")) or (
        col.sql == "DOUBLE[]" and family != "list" and family != "str"
    ):
        return f"{where}, which cannot hold {col.sql} values ({allowed})"
    q = f'"{col.name}"'
    cond = _bad_values_sql(col, q)
    if cond is None:
        return None
    row = con.execute(
        f"SELECT {q}::VARCHAR, count(*) OVER () FROM {DB_ALIAS}.main.{table} "
        f"WHERE {q} IS NOT NULL AND ({cond}) LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    value, n = row
    return f"{where} and holds {_show(value)} in {n} row(s) ({allowed})"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
