"""Boundary validation of telemetry batches against the SPEC §3 schema.

A batch arrives as columns (dict of arrays, Arrow table/batch, polars DataFrame) or as a
list of row dicts and leaves as a `pa.Table` with exactly `arrow_schema(table)`. Every check
is one vectorized pyarrow.compute pass over a column; only when a check fails do we look for
the first offending row, so the happy path stays fast enough for >= 1M rows/s ingest. The
first failure raises a `TelemetryError` naming table, row (0-based in the batch), column, the
value and what is allowed; nothing of a rejected batch is kept by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from telemetry.errors import TelemetryError
from telemetry.schema import TABLES, Column, arrow_schema

ArrowColumn: TypeAlias = pa.Array | pa.ChunkedArray

ALLOWED_VALUES = {
    "VARCHAR": "strings",
    "JSON": "JSON text (strings)",
    "INTEGER": "integers from -2147483648 to 2147483647",
    "BIGINT": "64-bit integers",
    "DOUBLE": "finite numbers",
    "BOOLEAN": "booleans",
    "TIMESTAMP": "timestamps (datetime)",
    "DOUBLE[]": "lists of finite numbers",
}

# Which Arrow source types may be cast (safely) into each DuckDB type. Strings never turn
# into numbers, numbers never into strings, booleans never into integers: those casts
# succeed in Arrow but hide producer bugs.
_FAMILY: dict[str, Callable[[pa.DataType], bool]] = {
    "VARCHAR": lambda t: (
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    ),
    "INTEGER": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "DOUBLE": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "BOOLEAN": pa.types.is_boolean,
    "TIMESTAMP": pa.types.is_timestamp,
    "DOUBLE[]": lambda t: (
        (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
        and (
            pa.types.is_integer(t.value_type)
            or pa.types.is_floating(t.value_type)
            # [] or [None, ...]: Arrow infers list<null>, which casts to list<double>
            or pa.types.is_null(t.value_type)
        )
    ),
}
_FAMILY["JSON"] = _FAMILY["VARCHAR"]
_FAMILY["BIGINT"] = _FAMILY["INTEGER"]


def fail(table: str, row: int | None, column: str | None, what: str) -> TelemetryError:
    where = table if row is None else f"{table} row {row}"
    if column is not None:
        where += f", column {column}"
    return TelemetryError(f"{where}: {what}", table=table, row=row, column=column)


def show(value: Any) -> str:
    return "null" if value is None else repr(value)


_CONSTANTS: dict[str, pa.Array] = {}  # the last run ids' columns, sliced for each batch
_CONSTANTS_KEPT = 4


def constant_string(value: str, n: int) -> pa.Array:
    """`n` copies of `value` as a string array: a slice of the longest one made for `value`
    so far (every batch of a run repeats its run id), built from buffers (no Python loop)."""
    kept = _CONSTANTS.get(value)
    if kept is None or len(kept) < n:
        if len(_CONSTANTS) >= _CONSTANTS_KEPT:
            _CONSTANTS.pop(next(iter(_CONSTANTS)))
        kept = _CONSTANTS[value] = _build_constant(value, max(n, 1 << 16))
    return kept.slice(0, n)


def _build_constant(value: str, n: int) -> pa.Array:
    raw = value.encode()
    if n * len(raw) >= 2**31:
        return pa.array([value] * n, pa.large_string()).cast(pa.string())
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def validate_batch(
    table: str, data: Any, run_id: str, node_ids: Collection[int] | None = None
) -> pa.Table:
    """Return `data` as a table of exactly `arrow_schema(table)`, or raise `TelemetryError`.

    `run_id` fills a missing run_id column (a present one must equal it). `node_ids` are the
    nodes of the run that `node_ref` columns may name; None skips that check.
    """
    if table not in TABLES:
        raise TelemetryError(f"unknown telemetry table {table!r}; tables are: {', '.join(TABLES)}")
    cols = TABLES[table]
    raw, n = _columns_of(table, data)
    names = {c.name for c in cols}
    for name in raw:
        if name not in names:
            raise fail(
                table,
                None,
                name,
                f"unexpected column; allowed columns: {', '.join(names_of(cols))}",
            )
    out: list[ArrowColumn] = []
    for col in cols:
        if col.name not in raw:
            if col.name == "run_id":
                out.append(constant_string(run_id, n))
                continue
            if not col.nullable:
                required = [c.name for c in cols if not c.nullable and c.name != "run_id"]
                raise fail(
                    table, None, col.name, f"missing column; required: {', '.join(required)}"
                )
            out.append(pa.nulls(n, col.arrow))
            continue
        arr = _coerce(table, col, raw[col.name])
        _check(table, col, arr, run_id, node_ids)
        out.append(arr)
    return pa.Table.from_arrays(out, schema=arrow_schema(table))


def names_of(cols: Sequence[Column]) -> list[str]:
    return [c.name for c in cols]


def _columns_of(table: str, data: Any) -> tuple[dict[str, Any], int]:
    if isinstance(data, pl.DataFrame):
        data = data.to_arrow()
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        if len(set(data.column_names)) != data.num_columns:
            raise fail(table, None, None, f"duplicate column names {data.column_names}")
        return {name: data.column(name) for name in data.column_names}, data.num_rows
    if isinstance(data, Mapping):
        raw = {str(k): _array_like(table, str(k), v) for k, v in data.items()}
    elif isinstance(data, Sequence) and not isinstance(data, str | bytes):
        raw = _rows_to_columns(table, data)
    else:
        raise fail(
            table,
            None,
            None,
            f"unsupported batch type {type(data).__name__}; pass a dict of columns, a pyarrow "
            "Table or RecordBatch, a polars DataFrame or a list of row dicts",
        )
    lengths = {k: len(v) for k, v in raw.items()}
    if len(set(lengths.values())) > 1:
        raise fail(table, None, None, f"columns have different lengths: {lengths}")
    return raw, next(iter(lengths.values()), 0)


def _array_like(table: str, name: str, values: Any) -> Any:
    if isinstance(values, pl.Series):
        return values.to_arrow()
    if isinstance(values, pa.Array | pa.ChunkedArray | np.ndarray):
        return values
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise fail(table, None, name, f"expected a sequence of values, got {type(values).__name__}")
    return list(values)


def _rows_to_columns(table: str, rows: Sequence[Any]) -> dict[str, list[Any]]:
    keys: dict[str, None] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise fail(
                table, i, None, f"a row must be a dict of column values, got {type(row).__name__}"
            )
        keys.update(dict.fromkeys(row))
    return {k: [row.get(k) for row in rows] for k in keys}


def _coerce(table: str, col: Column, values: Any) -> ArrowColumn:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        arr = values
    else:
        try:
            arr = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raise _locate_python(table, col, values) from None
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if arr.type == col.arrow:
        return arr
    if not (pa.types.is_null(arr.type) or _FAMILY[col.sql](arr.type)):
        valid = pc.index(pc.is_valid(arr), True).as_py()
        row = max(valid, 0)
        raise fail(
            table,
            row,
            col.name,
            f"{show(arr[row].as_py())} of type {arr.type} cannot be stored in a {col.sql} "
            f"column (allowed: {ALLOWED_VALUES[col.sql]})",
        )
    if pa.types.is_timestamp(arr.type) and arr.type.tz is not None:
        arr = arr.cast(pa.timestamp(arr.type.unit))  # Arrow keeps the UTC instant
    try:
        return pc.cast(arr, col.arrow, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        row = _first_failing_cast(arr, col.arrow)
        raise fail(
            table,
            row,
            col.name,
            f"{show(arr[row].as_py())} cannot be stored as {col.sql} without loss "
            f"(allowed: {ALLOWED_VALUES[col.sql]})",
        ) from None


def _first_failing_cast(arr: ArrowColumn, target: pa.DataType) -> int:
    """Bisect to the first element whose safe cast fails (O(n log n) vectorized work)."""
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(arr.slice(lo, mid - lo), target, safe=True)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo


def _locate_python(table: str, col: Column, values: Sequence[Any]) -> TelemetryError:
    """A Python sequence with mixed types: name the first element that does not fit."""
    for i, v in enumerate(values):
        try:
            single = pa.array([v])
            ok = pa.types.is_null(single.type) or _FAMILY[col.sql](single.type)
            if ok:
                pc.cast(single, col.arrow, safe=True)
        except (
            pa.ArrowInvalid,
            pa.ArrowTypeError,
            pa.ArrowNotImplementedError,
            TypeError,
            OverflowError,  # an integer beyond 64 bits
        ):
            ok = False
        if not ok:
            return fail(
                table,
                i,
                col.name,
                f"{show(v)} of type {type(v).__name__} cannot be stored in a {col.sql} column "
                f"(allowed: {ALLOWED_VALUES[col.sql]})",
            )
    return fail(table, None, col.name, f"values cannot be converted to {col.sql}")


def _all(mask: ArrowColumn) -> bool:
    return pc.all(mask).as_py() is not False  # an empty column is all good (null result)


def _first(mask: ArrowColumn) -> int:
    return int(pc.index(mask.fill_null(False), True).as_py())


def _check(
    table: str, col: Column, arr: ArrowColumn, run_id: str, node_ids: Collection[int] | None
) -> None:
    name = col.name
    if arr.null_count and not col.nullable:
        row = _first(pc.is_null(arr))
        raise fail(table, row, name, f"null is not allowed ({name} is required)")
    if name == "run_id":
        if not _all(pc.equal(arr, run_id)):
            row = _first(pc.not_equal(arr, run_id))
            raise fail(table, row, name, f"{show(arr[row].as_py())} is not this run ({run_id!r})")
        return
    if col.sql == "DOUBLE":
        total = pc.sum(arr).as_py()
        if total is not None and not math.isfinite(total):
            row = _first(pc.invert(pc.is_finite(arr)))
            if row >= 0:
                raise fail(
                    table,
                    row,
                    name,
                    f"{show(arr[row].as_py())} is not finite (NaN and ±inf are not allowed)",
                )
    if col.sql == "DOUBLE[]":
        _check_lists(table, col, arr)
    if col.nonnegative or col.positive:
        low = pc.min(arr).as_py()
        if low is not None and (low < 0 or (col.positive and low <= 0)):
            if col.positive:
                row = _first(pc.less_equal(arr, 0))
                subject = "durations" if "duration" in name else name
                what = f"is not > 0 ({subject} must be positive)"
            else:
                row = _first(pc.less(arr, 0))
                what = f"is not >= 0 ({name} must be nonnegative)"
            raise fail(table, row, name, f"{show(arr[row].as_py())} {what}")
    if col.allowed is not None:
        _check_member(table, name, arr, pa.array(col.allowed), f"allowed: {', '.join(col.allowed)}")
    if col.node_ref and node_ids is not None:
        known = sorted(node_ids)
        hint = f"nodes of run {run_id!r}: {', '.join(map(str, known)) or 'none registered (add_nodes first)'}"
        _check_member(table, name, arr, pa.array(known, pa.int32()), hint)


def _check_member(table: str, name: str, arr: ArrowColumn, allowed: pa.Array, hint: str) -> None:
    ok = pc.or_kleene(pc.is_in(arr, value_set=allowed), pc.is_null(arr))
    if not _all(ok):
        row = _first(pc.invert(ok))
        raise fail(table, row, name, f"{show(arr[row].as_py())} is not allowed ({hint})")


def _check_lists(table: str, col: Column, arr: ArrowColumn) -> None:
    lists = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    values = pc.list_flatten(lists)
    if len(values) == 0:
        return
    bad = pc.or_(pc.is_null(values), pc.invert(pc.is_finite(values.fill_null(0.0))))
    at = _first(bad)
    if at >= 0:
        row = int(pc.list_parent_indices(lists)[at].as_py())
        raise fail(
            table,
            row,
            col.name,
            f"{show(lists[row].as_py())} holds {show(values[at].as_py())} "
            f"(allowed: {ALLOWED_VALUES[col.sql]})",
        )


def check_new_nodes(batch: pa.Table, existing: Collection[int]) -> None:
    """Node ids of a nodes batch must be new to the run and unique within the batch."""
    seen = set(existing)
    for row, node_id in enumerate(batch.column("node_id").to_pylist()):
        if node_id in seen:
            raise fail("nodes", row, "node_id", f"{node_id} is already a node of this run")
        seen.add(node_id)
