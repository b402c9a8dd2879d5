"""Which stored DuckDB types serve a documented column as they are (SPEC §3).

Databases written by other tools may store a column as another type than the schema's: node
ids as DOUBLE, durations as VARCHAR. Readers use a stored column as it is when its type is of
the column's family (any integer type for an INTEGER id, any number for a DOUBLE) and cast
it otherwise (telemetry.reader); telemetry.check names the values a cast cannot take.
"""

from __future__ import annotations

from telemetry.schema import Column

# DuckDB column types by family, to tell which stored types a reader can use as they are.
_INT_TYPES = frozenset(
    [
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "UHUGEINT",
    ]
)
_FLOAT_TYPES = frozenset(("FLOAT", "DOUBLE", "REAL"))


def type_family(duckdb_type: str) -> str:
    """'int', 'float', 'str', 'bool', 'time', 'list' or 'other' for a DuckDB type name."""
    t = duckdb_type.upper()
    if t.endswith("[]") or t.startswith(("LIST", "STRUCT", "MAP")):
        return "list"
    if t in _INT_TYPES:
        return "int"
    if t in _FLOAT_TYPES or t.startswith("DECIMAL"):
        return "float"
    if t in ("VARCHAR", "JSON") or t.startswith("VARCHAR"):
        return "str"
    if t == "BOOLEAN":
        return "bool"
    if t.startswith(("TIMESTAMP", "DATE")):
        return "time"
    return "other"


def stored_as_is(col: Column, duckdb_type: str) -> bool:
    """Whether a stored column of `duckdb_type` serves `col` without a cast (same family)."""
    family = type_family(duckdb_type)
    if col.sql in ("INTEGER", "BIGINT"):
        return family == "int"
    if col.sql == "DOUBLE":
        return family in ("int", "float")
    if col.sql in ("VARCHAR", "JSON"):
        return family == "str"
    if col.sql == "BOOLEAN":
        return family == "bool"
    if col.sql == "TIMESTAMP":
        return family == "time"
    return duckdb_type.upper() in ("DOUBLE[]", "FLOAT[]", "INTEGER[]", "BIGINT[]")
