"""The shipped retention, scheduling and dispatch policies as functions of PCB and signals."""

from __future__ import annotations

import math

import pytest

from cluster.policies import (
    EVICT,
    RELEASE,
    BranchCountRetention,
    MinWaste,
    PerToolTTL,
    PressureTTL,
    ProgramControlBlock,
    SessionAffinityDispatch,
    Signals,
    discard_waste,
    load_policy,
    pressure_factor,
    protect,
)
from cluster.policies.pcb import write_pcb


def _pcb(**fields: object) -> ProgramControlBlock:
    pcb = ProgramControlBlock("p", "w", 1.0)
    write_pcb(pcb, **fields)
    return pcb


def _signals(u: float, inflight: int = 0, kv_tokens: int = 0) -> Signals:
    return Signals(0.0, 0, {0: u}, {0: 0.0}, {0: inflight}, kv_tokens, 8192, 5e-5, 0.03)


def test_pressure_factor_is_saga_eq9():
    assert pressure_factor(None) == 1.0
    assert pressure_factor(0.5) == 1.0 and pressure_factor(0.7) == 1.0
    assert pressure_factor(0.8) == pytest.approx(0.75)
    assert pressure_factor(0.9) == pytest.approx(0.5) and pressure_factor(1.0) == 0.5
    p = PressureTTL(tau_s=4.0)
    p.signals = _signals(0.8)
    assert p.on_turn_complete(_pcb(), 10.0) == protect(13.0)


def test_per_tool_ttl_learns_the_quantile_of_each_tools_gaps():
    p = PerToolTTL(quantile=0.9, default_s=2.0)
    assert p.on_turn_complete(_pcb(tool_name="bash"), 0.0) == protect(2.0)
    for gap in range(1, 11):  # bash gaps 1..10 s, observed at the successors' releases
        p.on_turn_arrival(_pcb(tool_name="bash", last_completion_s=100.0), 100.0 + gap)
    p.on_turn_arrival(_pcb(tool_name="edit", last_completion_s=0.0), 0.5)
    assert p.on_turn_complete(_pcb(tool_name="bash"), 50.0) == protect(59.0)
    assert p.on_turn_complete(_pcb(tool_name="edit"), 50.0) == protect(50.5)
    assert p.on_turn_complete(_pcb(tool_name="search"), 50.0) == protect(52.0)


def test_discard_waste_matches_a_hand_computation():
    # n = 20,000 tokens, S = 8192, 192 decode tokens in flight -> c_h = 8000, 3 passes.
    t = (0.05 * 8000 + 30.0) / 1000.0
    own = t * (8000 + 16000 + 20000)
    slowdown = 3 * (0.05 * 8000 / 1000.0) * 100_000
    assert discard_waste(20_000, 8192, 192, 100_000, 0.05, 30.0) == pytest.approx(own + slowdown)
    assert discard_waste(0, 8192, 0, 0, 0.05, 30.0) == 0.0


def test_min_waste_retains_long_contexts_over_short_gaps_and_discards_otherwise():
    p = MinWaste(default_gap_s=1.0, a_ms_per_token=0.05, c_ms=30.0, chunk_tokens=8192)
    p.signals = _signals(0.5, inflight=4, kv_tokens=50_000)
    assert p.on_turn_complete(_pcb(context_tokens=30_000), 5.0) == protect(6.0)
    for _ in range(5):  # this tool's gaps are long: retaining costs more than recomputing
        p.on_turn_arrival(_pcb(tool_name="test", last_completion_s=0.0), 600.0)
    assert p.on_turn_complete(_pcb(context_tokens=2_000, tool_name="test"), 5.0) == EVICT


def test_branch_count_protects_while_the_branch_is_active():
    p = BranchCountRetention()
    assert p.on_turn_complete(_pcb(branch_ids=("root",), branch_id="root"), 3.0) == protect(
        math.inf
    )
    assert p.on_turn_complete(_pcb(branch_ids=(), branch_id="root"), 3.0) == RELEASE


def test_scheduling_priorities_follow_eq4():
    pcb = _pcb(attained_service_s=12.5, last_release_s=40.0)
    assert load_policy("scheduling", "fcfs").hooks["priority"](pcb, 40.0) == 40.0
    assert load_policy("scheduling", "program-fcfs").hooks["priority"](pcb, 40.0) == 1.0
    assert load_policy("scheduling", "plas").hooks["priority"](pcb, 40.0) == 12.5


def test_session_affinity_falls_back_when_its_node_is_over_capacity():
    p = SessionAffinityDispatch(max_inflight=4)
    pcb = _pcb(last_prefill_node=2)
    assert p.select(pcb, {0: 1, 1: 0, 2: 3}, 0.0) == 2
    assert p.select(pcb, {0: 1, 1: 0, 2: 4}, 0.0) == 1
    assert p.select(pcb, {0: 1, 1: 0}, 0.0) == 1  # its node is gone (switching)
    assert p.select(_pcb(), {0: 2, 1: 2}, 0.0) == 0  # no prior node: least loaded, lowest id
    rr = load_policy("dispatch", "round-robin")
    assert [rr.hooks["select"](pcb, {3: 0, 5: 0}, 0.0) for _ in range(3)] == [3, 5, 3]


def test_min_waste_linearizes_attention_cost_from_the_profile():
    """Without a per-device (a, c): a = c1 + c2 n / 2, so an attention-heavy profile makes
    re-prefilling a long context expensive enough to retain it over a short gap."""
    p = MinWaste(default_gap_s=2.0)
    p.signals = Signals(0.0, 0, {0: 0.5}, {0: 0.0}, {0: 4}, 60_000, 8192, 0.0, 0.105, 6.65e-9)
    assert p.on_turn_complete(_pcb(context_tokens=25_000), 0.0) == protect(2.0)
    p.signals = Signals(0.0, 0, {0: 0.5}, {0: 0.0}, {0: 4}, 60_000, 8192, 0.0, 0.105, 0.0)
    assert p.on_turn_complete(_pcb(context_tokens=25_000), 0.0) == EVICT
