"""The planes inside the simulator: retention changes reuse, the unified pool preempts,
priorities order the queues, dispatch places programs (paper 003 §3.3-3.4)."""

from __future__ import annotations

import math

import pytest

from cluster.core import MemorySink
from cluster.sim.entities import SimRequest
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sim.unified_memory import UnifiedMemory


def _check_pool(sim: Simulator) -> None:
    """Pool accounting: reservations are the running calls' tokens, pins their blocks."""
    for node in sim.nodes.values():
        mem = node.memory
        mem.l1.check_invariants()
        if not isinstance(mem, UnifiedMemory):
            continue
        holders = node.prefilling + node.decode_batch + node.join_queue
        assert mem.pool.reserved_tokens == sum(r.kv_private for r in holders) + mem.epoch_reserved
        assert all(r.kv_private == 0 and not r.kv_pinned for r in node.queue)
        pins: dict[int, int] = {}
        for r in holders:
            for h in r.kv_pinned:
                pins[h] = pins.get(h, 0) + 1
        assert {h: e.pins for h, e in mem.pool.entries.items() if e.pins} == pins


def test_retention_decides_reuse_across_tool_gaps(pressure_config):
    hits = {}
    for ret in ("evict-always", "lru", "ttl", "branch-count"):
        s = Simulator(pressure_config(retention=ret, l1_tokens=400_000)).run()
        hits[ret] = s["kv_hit_rate"]
    # Discarding at completion leaves only the shared system prompt to reuse.
    assert hits["evict-always"] < 0.5 * hits["lru"]
    assert hits["ttl"] >= hits["lru"] - 0.02 and hits["branch-count"] >= hits["lru"] - 0.02


def test_evict_always_leaves_no_private_kv_of_a_program_in_a_tool_gap(pressure_config):
    sim = Simulator(pressure_config(retention="evict-always", l1_tokens=400_000))
    sim.step_until(120.0)
    node = sim.nodes[0]
    waiting = [run for run in sim.runs.values() if run.pcb.in_tool]
    assert waiting
    for run in waiting:
        for _nodes, path in run.kv_paths.values():
            private = [h for h in path if sim.cp.block_count(0, h) <= 1]
            assert not any(h in node.memory.l1.entries for h in private[-3:])
        assert not run.pcb.kv_resident and not run.pcb.kv_protected


def test_unified_pool_preempts_and_recomputes_under_pressure():
    base = dict(
        workload="putnam",
        nodes=1,
        split="collocated",
        agents=16,
        duration_s=300,
        warmup_s=0,
        planner="static",
        host_kv=False,
        retention="lru",
        scheduling="plas",
        seed=3,
    )
    sink = MemorySink()
    sim = Simulator(SimConfig(l1_tokens=50_000, **base), sink=sink)  # type: ignore[arg-type]
    t = 0.0
    while t < 300.0:
        t += 5.0
        sim.step_until(t)
        _check_pool(sim)
    summary = sim.finish()
    assert summary["preemptions_total"] == sim.preemptions > 0
    preempted = [r for r in sim.requests if r.preemptions]
    assert preempted and all(r.t_done is None or r.t_done >= r.t_first_token for r in preempted)
    assert (
        sum(run.preemptions for run in sim.runs.values())
        + sum(row["preemptions"] for row in sink.rows("programs"))
        == sim.preemptions
    )
    # Recompute re-prefills the generated tokens: more prefill work than uncached input.
    per_req: dict[str, int] = {}
    for row in sink.rows("prefill_iteration_requests"):
        per_req[row["request_id"]] = per_req.get(row["request_id"], 0) + row["t_uc"]
    assert any(per_req[r.request_id] > r.t_in - r.t_c for r in preempted if r.t_done)
    big = Simulator(SimConfig(l1_tokens=2_000_000, **base)).run()  # type: ignore[arg-type]
    assert big["preemptions_total"] == 0 and big["requests"] > summary["requests"]


def test_priority_orders_the_queue_and_plas_uses_attained_service(pressure_config):
    sim = Simulator(pressure_config(scheduling="plas", l1_tokens=60_000, agents=10))
    orders_checked = 0
    t = 0.0
    while t < 300.0:
        t += 3.0
        sim.step_until(t)
        q = sim.nodes[0].queue
        keys = [SimRequest.sort_key(r) for r in q]
        assert keys == sorted(keys)
        orders_checked += len(q) > 1
        for r in q:
            assert r.priority <= r.run.pcb.attained_service_s + 1e-9
    assert orders_checked > 0


def test_fcfs_fifo_equals_a_sorted_queue_keyed_by_release_time(pressure_config):
    """The default FCFS appends; a user policy q = r goes through the sorted queue. Without
    re-routing both orders are the release order, so the runs are identical."""
    from cluster.policies import SchedulingPolicy

    class ReleaseTime(SchedulingPolicy):
        def priority(self, pcb, now):
            return now

    keep = ("requests", "mean_e2e_s", "kv_hit_rate", "p95_ttft_s", "mean_queueing_s")
    a = Simulator(pressure_config(l1_tokens=80_000, agents=10)).run()
    b = Simulator(pressure_config(l1_tokens=80_000, agents=10, scheduling=ReleaseTime)).run()
    assert a["scheduling"] == "fcfs" and b["scheduling"] == "ReleaseTime"
    assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
    assert a["mean_queueing_s"] > 0


def test_session_affinity_keeps_programs_on_their_node_and_round_robin_spreads():
    base = SimConfig(
        workload="cc",
        nodes=3,
        split="collocated",
        agents=9,
        duration_s=300,
        warmup_s=0,
        planner="static",
        seed=4,
    )
    import dataclasses

    def placements(dispatch: str, **params: object) -> dict[str, set[int]]:
        sink = MemorySink()
        cfg = dataclasses.replace(base, dispatch=dispatch, dispatch_params=params)
        s = Simulator(cfg, sink=sink).run()
        assert s["dispatch"] == dispatch
        out: dict[str, set[int]] = {}
        for row in sink.rows("requests"):
            out.setdefault(row["program_id"], set()).add(row["prefill_node"])
        return out

    sticky = placements("session-affinity", max_inflight=1000)
    assert sticky and all(len(nodes) == 1 for nodes in sticky.values())
    assert len(set().union(*sticky.values())) == 3  # and programs spread over the nodes
    rr = placements("round-robin")
    assert sum(len(nodes) > 1 for nodes in rr.values()) > len(rr) // 2


def test_unified_pool_with_ample_memory_matches_the_tiered_hit_rate(pressure_config):
    tiered = Simulator(pressure_config(host_kv=True, l1_tokens=None)).run()
    unified = Simulator(pressure_config(l1_tokens=2_000_000, retention="lru")).run()
    assert unified["preemptions_total"] == 0
    assert unified["kv_hit_rate"] == pytest.approx(tiered["kv_hit_rate"], abs=0.01)
    assert unified["requests"] == pytest.approx(tiered["requests"], rel=0.05)


def test_tiered_cluster_with_a_retention_policy_protects_host_kv():
    cfg = SimConfig(
        workload="cc",
        nodes=4,
        split="2P2D",
        agents=12,
        duration_s=300,
        warmup_s=0,
        planner="static",
        retention="branch-count",
        l2_tokens=600_000,
        seed=3,
    )
    sim = Simulator(cfg)
    sim.step_until(200.0)
    protected = [
        h
        for n in sim.nodes.values()
        for h, m in n.memory.l2.meta.items()
        if m[0] == math.inf  # type: ignore[attr-defined]
    ]
    assert protected
    summary = sim.finish()
    assert summary["retention"] == "branch-count" and summary["requests"] > 50
