"""Tables of engine groups (DP×EP), declared as plain column specs for `telemetry.schema`.

`pdlab engine --dp N --ep N` serves one MoE model from N torch engine processes that run
their MoE layers' all-to-alls together, as vLLM's DP+EP engines do; these tables keep
what each rank did, pass by pass. Each spec is (name, DuckDB type, meaning, unit, checks);
`telemetry.schema` turns them into `Column`s after `run_id` and `node_id` (the DP rank).
"""

from __future__ import annotations

from typing import Any

ColumnSpec = tuple[str, str, str, str, dict[str, Any]]
_S, _TOK = "s", "tokens"

GROUP_TABLES: dict[str, tuple[ColumnSpec, ...]] = {
    # Every forward pass of a DP rank, dummy passes included: the ranks' passes at equal
    # (wave, step) ran their MoE all-to-alls together (vLLM's DP lockstep).
    "dp_passes": (
        ("pass_id", "BIGINT", "the pass's number on its node (1, 2, ...)", "",
         {"positive": True}),
        ("wave", "BIGINT", "the DP wave (a spell of the group running) it belongs to", "",
         {"nonnegative": True}),
        ("step", "BIGINT", "its step within the wave (equal on every rank for one pass)", "",
         {"positive": True}),
        ("kind", "VARCHAR", "prefill, decode, or dummy (an idle rank's one-token pass)", "",
         {"allowed": ("prefill", "decode", "dummy")}),
        ("iter_id", "BIGINT", "the `prefill_iterations` / `decode_iterations` row of a real "
         "pass (NULL for a dummy pass)", "", {"nullable": True, "nonnegative": True}),
        ("t_start", "DOUBLE", "when the pass started, since the run's start", _S,
         {"nonnegative": True}),
        ("duration_s", "DOUBLE", "how long it took, waits at the all-to-all included", _S,
         {"positive": True}),
    ),
    # Each MoE layer of a rank's pass after the dispatch all-to-all: the per-rank expert
    # load with which the busiest rank paces the group.
    "moe_layer_loads": (
        ("pass_id", "BIGINT", "the pass (`dp_passes.pass_id` of the node)", "",
         {"positive": True}),
        ("layer", "INTEGER", "the MoE layer (0 = first)", "", {"nonnegative": True}),
        ("tokens_in", "BIGINT", "the node's own tokens entering the layer", _TOK,
         {"nonnegative": True}),
        ("tokens_received", "BIGINT", "tokens dispatched to the node (each token once, "
         "whatever number of its top-k experts the node owns)", _TOK, {"nonnegative": True}),
        ("experts_activated", "INTEGER", "distinct experts of the node that ran", "experts",
         {"nonnegative": True}),
        ("comm_s", "DOUBLE", "time in the layer's collectives (counts, dispatch, combine), "
         "waits for the other ranks included", _S, {"nullable": True, "nonnegative": True}),
    ),
}  # fmt: skip
