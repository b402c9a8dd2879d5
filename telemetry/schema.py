"""The DuckDB telemetry contract of SPEC §3, defined once.

Every table, column, type and constraint lives in `TABLES`; DDL, Arrow schemas and
boundary validation are all derived from it. Times are seconds (DOUBLE) since the run's
start; `runs.started_at` anchors wall time. Every table has `run_id`. Tables may gain
columns in later schema versions; they never lose or rename one.
"""

from __future__ import annotations

import pyarrow as pa

from telemetry.columns import RUN_ID, Column
from telemetry.columns import column as _c
from telemetry.schema_groups import GROUP_TABLES
from telemetry.schema_imported import imported_tables
from telemetry.schema_serving import CPU, OVERHEAD, SERVING_TABLES
from telemetry.silicon_table import SILICON_VALIDATION_COLUMNS

SCHEMA_VERSION = 1
META_TABLE = "pdlab_meta"
FINALIZED_TABLE = "pdlab_live_finalized"
# How each run written by pdlab ended: finished (closed), failed (the writing process raised;
# the rows written until then are kept), recovered (its writer died; `pdlab recover` folded
# its live segments in). A bookkeeping table like the two above, not part of SPEC §3.
RUN_STATUS_TABLE = "pdlab_run_status"
RUN_STATUS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {RUN_STATUS_TABLE} (run_id VARCHAR PRIMARY KEY, "
    "status VARCHAR NOT NULL, ended_at TIMESTAMP, detail VARCHAR)"
)


NODE = _c(
    "node_id", "INTEGER", "the node (`nodes.node_id` of the run)", nonnegative=True, node_ref=True
)
T = _c("t", "DOUBLE", "when it happened, since the run's start", "s", nonnegative=True)
TIER = ("gpu", "host")
PHASES = ("prefill", "decode", "collocated")
# Distinct experts the iteration's tokens were routed to, averaged over the model's MoE
# layers (paper 000 Eq. 2: compare with E·φ(B) = E·(1 − (1 − k/E)^(t_fwd·B))). Engines that
# count them send it (pdlab's torch engine); NULL for SGLang, the simulator and dense models.
EXPERTS_ACTIVE = _c(
    "experts_active",
    "DOUBLE",
    "distinct routed experts the pass's tokens activated, mean over MoE layers (compare "
    "E*phi(B)); NULL when the engine does not count them",
    "experts",
    nullable=True,
    nonnegative=True,
)
_S = "s"
_TOK = "tokens"


TABLES: dict[str, tuple[Column, ...]] = {
    "runs": (
        RUN_ID,
        _c("started_at", "TIMESTAMP", "wall-clock start of the run (UTC); anchors every `t`"),
        _c("source", "VARCHAR", "what wrote it: 'sim', 'live-sim', 'sglang', 'synth', ..."),
        _c("config", "JSON", "the run's configuration (e.g. the SimConfig)", nullable=True),
    ),
    "nodes": (
        RUN_ID,
        _c("node_id", "INTEGER", "the node's id within the run", nonnegative=True),
        _c("name", "VARCHAR", "display name"),
        _c("hardware", "VARCHAR", "hardware and model description"),
        _c(
            "moe_top_k",
            "INTEGER",
            "k: routed experts per token (phi(B), App. B.3)",
            nonnegative=True,
        ),
        _c(
            "moe_experts",
            "INTEGER",
            "E: routed experts of the MoE model (0 = dense: phi = 0)",
            nonnegative=True,
        ),
    ),
    "prefill_iterations": (
        RUN_ID,
        NODE,
        _c("iter_id", "BIGINT", "the iteration's id, unique per node", nonnegative=True),
        _c(
            "t_start",
            "DOUBLE",
            "when the pass started, since the run's start",
            _S,
            nonnegative=True,
        ),
        _c("duration_s", "DOUBLE", "T_P: how long the pass took", _S, positive=True),
        _c("num_reqs", "INTEGER", "requests (chunks) in the pass", nonnegative=True),
        _c("t_uc", "BIGINT", "sum of t_uc: uncached (new) tokens computed", _TOK, nonnegative=True),
        _c(
            "attn_pairs",
            "DOUBLE",
            "sum of A: query-key pairs, A = t_uc*t_c + t_uc(t_uc+1)/2",
            "pairs",
            nonnegative=True,
        ),
        _c(
            "t_rst",
            "BIGINT",
            "sum of t_rst: tokens restored from host memory",
            _TOK,
            nonnegative=True,
        ),
        _c(
            "t_c",
            "BIGINT",
            "sum of t_c: cached prefix tokens (and earlier chunks)",
            _TOK,
            nonnegative=True,
        ),
        EXPERTS_ACTIVE,
        OVERHEAD,
        CPU,
    ),
    "prefill_iteration_requests": (
        RUN_ID,
        NODE,
        _c(
            "iter_id",
            "BIGINT",
            "the prefill iteration (`prefill_iterations.iter_id`)",
            nonnegative=True,
        ),
        _c("request_id", "VARCHAR", "the request (`requests.request_id`)"),
        _c("t_uc", "BIGINT", "the request's uncached tokens in this pass", _TOK, nonnegative=True),
        _c("t_c", "BIGINT", "its cached prefix and earlier chunks", _TOK, nonnegative=True),
        _c("t_rst", "BIGINT", "its tokens restored from host memory", _TOK, nonnegative=True),
    ),
    "decode_iterations": (
        RUN_ID,
        NODE,
        _c("iter_id", "BIGINT", "the iteration's id, unique per node", nonnegative=True),
        _c(
            "t_start",
            "DOUBLE",
            "when the pass started, since the run's start",
            _S,
            nonnegative=True,
        ),
        _c("duration_s", "DOUBLE", "T_D(B): how long the pass took", _S, positive=True),
        _c("batch_size", "INTEGER", "B: requests decoding in the pass", positive=True),
        _c(
            "t_fwd",
            "DOUBLE",
            "tokens fed per request (> 1 with speculative decoding)",
            _TOK,
            positive=True,
        ),
        _c("ctx_tokens", "BIGINT", "total context of the batch's requests", _TOK, nonnegative=True),
        EXPERTS_ACTIVE,
        OVERHEAD,
        CPU,
    ),
    "requests": (
        RUN_ID,
        _c("request_id", "VARCHAR", "the request's id"),
        _c("program_id", "VARCHAR", "the agent program it belongs to"),
        _c("branch_id", "VARCHAR", "its branch (cluster-wide id)"),
        _c("t_arrival", "DOUBLE", "arrival time, since the run's start", _S, nonnegative=True),
        _c(
            "prefill_node",
            "INTEGER",
            "node that prefilled it",
            nullable=True,
            nonnegative=True,
            node_ref=True,
        ),
        _c(
            "decode_node",
            "INTEGER",
            "node that decoded it",
            nullable=True,
            nonnegative=True,
            node_ref=True,
        ),
        _c("t_in", "BIGINT", "input (prompt) length", _TOK, nonnegative=True),
        _c("t_c", "BIGINT", "input tokens found cached", _TOK, nonnegative=True),
        _c(
            "t_fetch",
            "BIGINT",
            "input tokens fetched from another node's host memory",
            _TOK,
            nonnegative=True,
        ),
        _c("t_out", "BIGINT", "output length", _TOK, nonnegative=True),
        _c(
            "t_prefill_start",
            "DOUBLE",
            "when its prefill started",
            _S,
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "t_first_token",
            "DOUBLE",
            "when its first token was out (TTFT = this - t_arrival)",
            _S,
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "t_done",
            "DOUBLE",
            "when it finished (E2E = this - t_arrival)",
            _S,
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "t_ideal_c",
            "BIGINT",
            "tokens an unlimited cache shared by all nodes would have held (h*)",
            _TOK,
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "t_sent",
            "DOUBLE",
            "when the client sent it, since the client's first send, on the client's own clock "
            "(imported benchmarks: compare only with other t_sent values; t_arrival is when the "
            "engine queued it); NULL when not recorded",
            _S,
            nullable=True,
            nonnegative=True,
        ),
    ),
    "branch_events": (
        RUN_ID,
        T,
        _c("branch_id", "VARCHAR", "the branch"),
        _c("program_id", "VARCHAR", "its agent program"),
        _c(
            "kind",
            "VARCHAR",
            "what happened",
            allowed=("start", "fork", "subagent", "append", "compact", "finish"),
        ),
        _c("parent_id", "VARCHAR", "the parent branch (fork, subagent)", nullable=True),
        _c(
            "version",
            "INTEGER",
            "the branch version (bumped when it leaves its path: compaction)",
            nonnegative=True,
        ),
    ),
    "kv_events": (
        RUN_ID,
        T,
        NODE,
        _c("tier", "VARCHAR", "GPU (L1) or host memory (L2)", allowed=TIER),
        _c(
            "kind",
            "VARCHAR",
            "what happened to the block",
            allowed=("stored", "removed", "cleared"),
        ),
        _c("block_hash", "BIGINT", "the block's chained hash (NULL for cleared)", nullable=True),
        _c("parent_hash", "BIGINT", "the previous block's hash (stored rows)", nullable=True),
        _c(
            "num_tokens",
            "INTEGER",
            "tokens in the block (0 when the engine does not say)",
            _TOK,
            nonnegative=True,
        ),
    ),
    "branch_counts": (
        RUN_ID,
        T,
        NODE,
        _c("block_hash", "BIGINT", "the block"),
        _c(
            "count",
            "INTEGER",
            "R_{b,n}: active branches counting the block on the node",
            nonnegative=True,
        ),
    ),
    "evictions": (
        RUN_ID,
        T,
        NODE,
        _c("tier", "VARCHAR", "the tier it left", allowed=TIER),
        _c("block_hash", "BIGINT", "the block"),
        _c("branch_count", "INTEGER", "its R_{b,n} when evicted", nonnegative=True),
        _c(
            "last_access",
            "DOUBLE",
            "T_b: its last access, since the run's start",
            _S,
            nonnegative=True,
        ),
        _c("policy", "VARCHAR", "the eviction or retention policy that chose it"),
    ),
    "phase_switches": (
        RUN_ID,
        NODE,
        _c("t_decided", "DOUBLE", "when the switch was decided", _S, nonnegative=True),
        _c(
            "t_done",
            "DOUBLE",
            "when the node served its new phase (NULL: not yet)",
            _S,
            nullable=True,
            nonnegative=True,
        ),
        _c("from_phase", "VARCHAR", "phase before", allowed=PHASES),
        _c("to_phase", "VARCHAR", "phase after", allowed=PHASES),
        _c("trigger", "VARCHAR", "who decided it", allowed=("planner", "manual")),
        _c("drained", "INTEGER", "queued requests moved to peers", nonnegative=True),
        # KV blocks the node held when it switched and could no longer serve (relaunch,
        # stranded KV, SGLang's role switch releasing its prefix cache); 0 when kept.
        _c(
            "lost_kv_blocks",
            "BIGINT",
            "KV blocks the node could no longer serve after the switch (0: kept)",
            "blocks",
            nullable=True,
            nonnegative=True,
        ),
    ),
    "planner_windows": (
        RUN_ID,
        T,
        _c("current_prefill", "INTEGER", "prefill nodes of the current split", nonnegative=True),
        _c(
            "candidate_prefill", "INTEGER", "prefill nodes of the candidate split", nonnegative=True
        ),
        _c(
            "mean_gain",
            "DOUBLE",
            "mean over slices of the throughput gain g_i (Eq. 6)",
            "requests/s",
        ),
        _c("std_gain", "DOUBLE", "standard deviation of g_i", "requests/s", nonnegative=True),
        _c("slices", "INTEGER", "m: slices of the window", nonnegative=True),
        _c("qualified", "BOOLEAN", "mean(g) > 2 std(g) / sqrt(m)"),
        _c("chosen", "BOOLEAN", "the split switched to"),
    ),
    "router_decisions": (
        RUN_ID,
        T,
        _c("request_id", "VARCHAR", "the request routed"),
        NODE,
        _c("policy", "VARCHAR", "the router policy"),
        _c(
            "predicted_ttft_s",
            "DOUBLE",
            "the TTFT it predicted for the chosen node (Eq. 7)",
            _S,
            nullable=True,
        ),
        _c(
            "cached_tokens",
            "BIGINT",
            "input tokens cached on the chosen node",
            _TOK,
            nonnegative=True,
        ),
        _c(
            "fetch_tokens",
            "BIGINT",
            "x: input tokens to fetch from another node",
            _TOK,
            nonnegative=True,
        ),
    ),
    "model_fits": (
        RUN_ID,
        _c("node_id", "INTEGER", "the node fitted", nonnegative=True),
        _c("phase", "VARCHAR", "which model", allowed=("prefill", "decode")),
        _c("fitted_at", "TIMESTAMP", "when it was fitted (UTC)"),
        _c(
            "coef",
            "DOUBLE[]",
            "c0..c3 (Eq. 1) or d0..d2 (Eq. 2), then a form's extra terms",
            "s, s/token, s/pair, s/token | s, s, s/request",
        ),
        _c("samples", "BIGINT", "training iterations", nonnegative=True),
        _c(
            "mape",
            "DOUBLE",
            "held-out mean absolute percentage error (0.03 = 3%)",
            "fraction",
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "form",
            "VARCHAR",
            "the model form fitted (models.forms): 'paper' is Eq. 1 / Eq. 2, others add terms "
            "and coef holds them in the form's order; NULL in older rows",
            nullable=True,
        ),
        _c(
            "target",
            "VARCHAR",
            "what was fitted: duration_s (wall seconds) or cpu_s (the engine thread's CPU "
            "seconds, where measured); NULL in older rows",
            nullable=True,
        ),
    ),
    # One row per finished agent program (paper 003 §3.1: JCT and preemptions per program;
    # attained service A_p = sum over its calls of first admission to completion).
    "programs": (
        RUN_ID,
        _c("program_id", "VARCHAR", "the program"),
        _c("workload", "VARCHAR", "its workload (putnam, cc, osworld, a trace format, ...)"),
        _c("t_arrival", "DOUBLE", "when it arrived", _S, nonnegative=True),
        _c("t_done", "DOUBLE", "when its last call finished", _S, nullable=True, nonnegative=True),
        _c(
            "jct_s",
            "DOUBLE",
            "job completion time (t_done - t_arrival)",
            _S,
            nullable=True,
            nonnegative=True,
        ),
        _c("turns", "INTEGER", "LLM calls it made", nonnegative=True),
        _c("preemptions", "INTEGER", "times a call of it was preempted", nonnegative=True),
        _c(
            "attained_service_s",
            "DOUBLE",
            "A_p: sum over its calls of first admission to completion",
            _S,
            nonnegative=True,
        ),
    ),
    "engine_metrics": (
        RUN_ID,
        T,
        NODE,
        _c("metric", "VARCHAR", "the engine's Prometheus sample name (e.g. vllm:num_requests_running)"),
        _c("labels", "VARCHAR", "the sample's labels as JSON", nullable=True),
        _c("value", "DOUBLE", "its value: a gauge, or a counter's total since the engine started"),
    ),
    # `pdlab validate silicon`: one row per row of a silicon CSV (telemetry/silicon_table.py).
    "silicon_validation": (RUN_ID, *(_c(**c) for c in SILICON_VALIDATION_COLUMNS)),
}
# Imported real runs and their references (telemetry.schema_imported).
TABLES.update(imported_tables(_c, RUN_ID))

# Live PD clusters' request stages and fitted serving overheads (telemetry.schema_serving)
# come right after `requests`.
_items = list(TABLES.items())
_at = list(TABLES).index("requests") + 1
TABLES = dict([*_items[:_at], *SERVING_TABLES.items(), *_items[_at:]])

# Tables of DP×EP engine groups (telemetry.schema_groups), each row on a node (DP rank).
TABLES |= {
    name: (RUN_ID, NODE, *(_c(n, sql, doc, unit, **kw) for n, sql, doc, unit, kw in specs))
    for name, specs in GROUP_TABLES.items()
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
    stmts.append(RUN_STATUS_DDL)
    return stmts
