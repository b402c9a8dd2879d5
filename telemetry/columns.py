"""One column of the telemetry schema (`telemetry.schema`): its types, checks and meaning."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Column:
    """One column: DuckDB type, Arrow type, the checks applied at the boundary, and what it
    means (`doc`, with `unit`), from which docs/telemetry.md is generated."""

    name: str
    sql: str
    arrow: pa.DataType
    nullable: bool = False
    nonnegative: bool = False
    positive: bool = False
    allowed: tuple[str, ...] | None = None  # categorical values
    node_ref: bool = False  # must name a node of the run
    doc: str = ""
    unit: str = ""


def column(name: str, sql: str, doc: str = "", unit: str = "", **kw: object) -> Column:
    arrow = {
        "VARCHAR": pa.string(),
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "TIMESTAMP": pa.timestamp("us"),
        "JSON": pa.string(),
        "DOUBLE[]": pa.list_(pa.float64()),
    }[sql]
    return Column(name, sql, arrow, doc=doc, unit=unit, **kw)  # type: ignore[arg-type]


RUN_ID = column("run_id", "VARCHAR", "the run the row belongs to (`runs.run_id`)")
