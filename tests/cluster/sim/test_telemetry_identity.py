"""Every telemetry table of a short full-telemetry run, pinned to digests taken on the code
before the speed work of issue #27 (e45337c): the batched branch-count rows and the writer's
changes must write the same rows, in the same order, with the same values.

The run is small (4 nodes, 24 agents, 150 simulated seconds) with small KV tiers, so it has
evictions, KV events of both tiers and branch counts of every kind of update.
"""

from __future__ import annotations

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry.digest import table_digests

PINNED = {
    "branch_counts": (26036, "6a375562d08a0490"),
    "branch_events": (473, "87dc39b78f35aafc"),
    "decode_iterations": (14107, "d53068e3698270f2"),
    "evictions": (14269, "b8ec285bc394b405"),
    "kv_events": (35126, "dbb393dd2463e681"),
    "nodes": (4, "2458c16cc353e866"),
    "prefill_iteration_requests": (487, "f292c71e30d7397b"),
    "prefill_iterations": (428, "2c8efd5c41c5b4a7"),
    "requests": (430, "294ed8b47db8b1a1"),
    "router_decisions": (461, "77235832d0f2e539"),
}


def test_full_telemetry_tables_are_byte_identical_to_the_pinned_run(tmp_path):
    cfg = SimConfig(
        workload="cc", nodes=4, split="2P2D", agents=24, duration_s=150.0, warmup_s=0.0,
        planner="gain", router="ttft", eviction="branch", seed=5,
        l1_tokens=150_000, l2_tokens=300_000,
    )  # fmt: skip
    db = tmp_path / "run.duckdb"
    summary = simulate(cfg, db)
    got = {t: v for t, v in table_digests(str(db), summary["run_id"]).items() if v[0]}
    assert got == PINNED
