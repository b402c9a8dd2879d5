"""The DuckDB telemetry contract of SPEC §3, defined once.

Every table, column, type and constraint lives in `TABLES`; DDL, Arrow schemas and
boundary validation are all derived from it. Times are seconds (DOUBLE) since the run's
start; `runs.started_at` anchors wall time. Every table has `run_id`. Tables may gain
columns in later schema versions; they never lose or rename one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1
META_TABLE = "pdlab_meta"
FINALIZED_TABLE = "pdlab_live_finalized"


@dataclass(frozen=True, slots=True)
class Column:
    """One column: DuckDB type, Arrow type and the checks applied at the boundary."""

    name: str
    sql: str
    arrow: pa.DataType
    nullable: bool = False
    nonnegative: bool = False
    positive: bool = False
    allowed: tuple[str, ...] | None = None  # categorical values
    node_ref: bool = False  # must name a node of the run


def _c(name: str, sql: str, **kw: object) -> Column:
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
    return Column(name, sql, arrow, **kw)  # type: ignore[arg-type]


RUN_ID = _c("run_id", "VARCHAR")
NODE = _c("node_id", "INTEGER", nonnegative=True, node_ref=True)
T = _c("t", "DOUBLE", nonnegative=True)
TIER = ("gpu", "host")
PHASES = ("prefill", "decode", "collocated")

TABLES: dict[str, tuple[Column, ...]] = {
    "runs": (
        RUN_ID,
        _c("started_at", "TIMESTAMP"),
        _c("source", "VARCHAR"),
        _c("config", "JSON", nullable=True),
    ),
    "nodes": (
        RUN_ID,
        _c("node_id", "INTEGER", nonnegative=True),
        _c("name", "VARCHAR"),
        _c("hardware", "VARCHAR"),
        _c("moe_top_k", "INTEGER", nonnegative=True),
        _c("moe_experts", "INTEGER", nonnegative=True),
    ),
    "prefill_iterations": (
        RUN_ID,
        NODE,
        _c("iter_id", "BIGINT", nonnegative=True),
        _c("t_start", "DOUBLE", nonnegative=True),
        _c("duration_s", "DOUBLE", positive=True),
        _c("num_reqs", "INTEGER", nonnegative=True),
        _c("t_uc", "BIGINT", nonnegative=True),
        _c("attn_pairs", "DOUBLE", nonnegative=True),
        _c("t_rst", "BIGINT", nonnegative=True),
        _c("t_c", "BIGINT", nonnegative=True),
    ),
    "prefill_iteration_requests": (
        RUN_ID,
        NODE,
        _c("iter_id", "BIGINT", nonnegative=True),
        _c("request_id", "VARCHAR"),
        _c("t_uc", "BIGINT", nonnegative=True),
        _c("t_c", "BIGINT", nonnegative=True),
        _c("t_rst", "BIGINT", nonnegative=True),
    ),
    "decode_iterations": (
        RUN_ID,
        NODE,
        _c("iter_id", "BIGINT", nonnegative=True),
        _c("t_start", "DOUBLE", nonnegative=True),
        _c("duration_s", "DOUBLE", positive=True),
        _c("batch_size", "INTEGER", positive=True),
        _c("t_fwd", "DOUBLE", positive=True),
        _c("ctx_tokens", "BIGINT", nonnegative=True),
    ),
    "requests": (
        RUN_ID,
        _c("request_id", "VARCHAR"),
        _c("program_id", "VARCHAR"),
        _c("branch_id", "VARCHAR"),
        _c("t_arrival", "DOUBLE", nonnegative=True),
        _c("prefill_node", "INTEGER", nullable=True, nonnegative=True, node_ref=True),
        _c("decode_node", "INTEGER", nullable=True, nonnegative=True, node_ref=True),
        _c("t_in", "BIGINT", nonnegative=True),
        _c("t_c", "BIGINT", nonnegative=True),
        _c("t_fetch", "BIGINT", nonnegative=True),
        _c("t_out", "BIGINT", nonnegative=True),
        _c("t_prefill_start", "DOUBLE", nullable=True, nonnegative=True),
        _c("t_first_token", "DOUBLE", nullable=True, nonnegative=True),
        _c("t_done", "DOUBLE", nullable=True, nonnegative=True),
        _c("t_ideal_c", "BIGINT", nullable=True, nonnegative=True),
    ),
    "branch_events": (
        RUN_ID,
        T,
        _c("branch_id", "VARCHAR"),
        _c("program_id", "VARCHAR"),
        _c("kind", "VARCHAR", allowed=("start", "fork", "subagent", "append", "compact", "finish")),
        _c("parent_id", "VARCHAR", nullable=True),
        _c("version", "INTEGER", nonnegative=True),
    ),
    "kv_events": (
        RUN_ID,
        T,
        NODE,
        _c("tier", "VARCHAR", allowed=TIER),
        _c("kind", "VARCHAR", allowed=("stored", "removed", "cleared")),
        _c("block_hash", "BIGINT", nullable=True),
        _c("parent_hash", "BIGINT", nullable=True),
        _c("num_tokens", "INTEGER", nonnegative=True),
    ),
    "branch_counts": (
        RUN_ID,
        T,
        NODE,
        _c("block_hash", "BIGINT"),
        _c("count", "INTEGER", nonnegative=True),
    ),
    "evictions": (
        RUN_ID,
        T,
        NODE,
        _c("tier", "VARCHAR", allowed=TIER),
        _c("block_hash", "BIGINT"),
        _c("branch_count", "INTEGER", nonnegative=True),
        _c("last_access", "DOUBLE", nonnegative=True),
        _c("policy", "VARCHAR"),
    ),
    "phase_switches": (
        RUN_ID,
        NODE,
        _c("t_decided", "DOUBLE", nonnegative=True),
        _c("t_done", "DOUBLE", nullable=True, nonnegative=True),
        _c("from_phase", "VARCHAR", allowed=PHASES),
        _c("to_phase", "VARCHAR", allowed=PHASES),
        _c("trigger", "VARCHAR", allowed=("planner", "manual")),
        _c("drained", "INTEGER", nonnegative=True),
        # KV blocks the node held when it switched and could no longer serve (relaunch,
        # stranded KV, SGLang's role switch releasing its prefix cache); 0 when kept.
        _c("lost_kv_blocks", "BIGINT", nullable=True, nonnegative=True),
    ),
    "planner_windows": (
        RUN_ID,
        T,
        _c("current_prefill", "INTEGER", nonnegative=True),
        _c("candidate_prefill", "INTEGER", nonnegative=True),
        _c("mean_gain", "DOUBLE"),
        _c("std_gain", "DOUBLE", nonnegative=True),
        _c("slices", "INTEGER", nonnegative=True),
        _c("qualified", "BOOLEAN"),
        _c("chosen", "BOOLEAN"),
    ),
    "router_decisions": (
        RUN_ID,
        T,
        _c("request_id", "VARCHAR"),
        NODE,
        _c("policy", "VARCHAR"),
        _c("predicted_ttft_s", "DOUBLE", nullable=True),
        _c("cached_tokens", "BIGINT", nonnegative=True),
        _c("fetch_tokens", "BIGINT", nonnegative=True),
    ),
    "model_fits": (
        RUN_ID,
        _c("node_id", "INTEGER", nonnegative=True),
        _c("phase", "VARCHAR", allowed=("prefill", "decode")),
        _c("fitted_at", "TIMESTAMP"),
        _c("coef", "DOUBLE[]"),
        _c("samples", "BIGINT", nonnegative=True),
        _c("mape", "DOUBLE", nullable=True, nonnegative=True),
    ),
    # One row per finished agent program (paper 003 §3.1: JCT and preemptions per program;
    # attained service A_p = sum over its calls of first admission to completion).
    "programs": (
        RUN_ID,
        _c("program_id", "VARCHAR"),
        _c("workload", "VARCHAR"),
        _c("t_arrival", "DOUBLE", nonnegative=True),
        _c("t_done", "DOUBLE", nullable=True, nonnegative=True),
        _c("jct_s", "DOUBLE", nullable=True, nonnegative=True),
        _c("turns", "INTEGER", nonnegative=True),
        _c("preemptions", "INTEGER", nonnegative=True),
        _c("attained_service_s", "DOUBLE", nonnegative=True),
    ),
}

# Columns whose values must be finite (no NaN/inf) when present.
FLOAT_TYPES = ("DOUBLE",)


def columns(table: str) -> tuple[Column, ...]:
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(
            f"unknown telemetry table {table!r}; tables are: {', '.join(TABLES)}"
        ) from None


def arrow_schema(table: str) -> pa.Schema:
    return pa.schema([pa.field(c.name, c.arrow, nullable=c.nullable) for c in columns(table)])


def ddl(table: str) -> str:
    cols = ",\n  ".join(
        f"{c.name} {c.sql}{'' if c.nullable else ' NOT NULL'}" for c in columns(table)
    )
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {cols}\n)"


def all_ddl() -> list[str]:
    stmts = [ddl(t) for t in TABLES]
    stmts.append(
        f"CREATE TABLE IF NOT EXISTS {META_TABLE} (key VARCHAR PRIMARY KEY, value VARCHAR)"
    )
    stmts.append(
        f"CREATE TABLE IF NOT EXISTS {FINALIZED_TABLE} (run_id VARCHAR PRIMARY KEY, finalized_at TIMESTAMP)"
    )
    return stmts
