"""Gain planner on synthetic slice data (paper 000 §5.2, Eq. 6; Alg. E.3 outer loop)."""

import pytest

from cluster.control.planning import PLANNERS, GainPlanner, PlannerView, WindowStats
from models import DecodeModel, NodeModel, PrefillModel

NODE = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))
NODES = list(range(9))


def view(stats: WindowStats, now: float, prefill: int = 4, **kw) -> PlannerView:
    phases = {n: ("prefill" if n < prefill else "decode") for n in NODES}
    return PlannerView(now=now, phases=phases, models={n: NODE for n in NODES}, stats=stats, **kw)


def fill(
    stats: WindowStats,
    t0: float,
    t1: float,
    rate: float,
    t_uc: float,
    t_c: float,
    t_out: float,
    q: float,
):
    """Requests completing at `rate` per second with the given work, decode load q."""
    a = t_uc * t_c + t_uc * (t_uc + 1) / 2
    n = int((t1 - t0) * rate)
    for i in range(n):
        stats.record_request(t0 + (i + 0.5) / rate, t_uc, a, t_c, t_out, 1.7)
    stats.record_decode_load(t0, q)


def test_burst_confined_to_one_slice_never_triggers_a_switch():
    # Balanced decode-heavy work at the current 4P5D ... except one slice with a prefill
    # burst (sub-agents spawned together): uncached tokens x8 for 60 s.
    stats = WindowStats()
    fill(stats, 0, 600, 5.0, 1500, 40_000, 600, 40)
    fill(stats, 300, 360, 5.0, 12_000, 4_000, 600, 40)  # the burst
    d = GainPlanner().step(view(stats, 600.0))
    assert d is not None
    assert d.switches == () and d.chosen_prefill is None
    # The burst slice alone would favour more prefill nodes ...
    burst_only = GainPlanner(window_s=60, slices=2).evaluate(view(_only(stats, 300, 360), 360.0))
    assert burst_only is not None and any(
        c.mean_gain > 0 for c in burst_only.candidates if c.prefill_count > 4
    )
    # ... but over the window no candidate's mean gain exceeds 2 sigma / sqrt(m).
    for c in d.candidates:
        assert not c.qualified
        assert c.mean_gain <= 2 * c.std_gain / c.slices**0.5


def _only(stats: WindowStats, t0: float, t1: float) -> WindowStats:
    s = WindowStats()
    for t, r in zip(stats._req_t, stats._req, strict=True):
        if t0 <= t < t1:
            s.record_request(t, *r)
    s.record_decode_load(t0, 40)
    return s


def test_sustained_shift_triggers_and_choice_maximizes_mean_gain():
    stats = WindowStats()
    # Prefill-heavy for the whole window (OSWorld-like): every slice says "more prefill".
    fill(stats, 0, 600, 6.0, 6000, 40_000, 150, 10)
    d = GainPlanner().step(view(stats, 600.0, prefill=2))
    assert d is not None and d.chosen_prefill is not None and d.chosen_prefill > 2
    qualified = [c for c in d.candidates if c.qualified]
    assert qualified and d.chosen_prefill == max(qualified, key=lambda c: c.mean_gain).prefill_count
    # The chosen split changes the fewest nodes: exactly the decode nodes needed move.
    assert len(d.switches) == d.chosen_prefill - 2
    assert all(s.to_phase == "prefill" and s.node_id >= 2 for s in d.switches)
    # Every candidate 1..8 except the current split is evaluated.
    assert sorted(c.prefill_count for c in d.candidates) == [1, 3, 4, 5, 6, 7, 8]


def test_planner_skips_while_draining_and_during_cooldown():
    stats = WindowStats()
    fill(stats, 0, 600, 6.0, 6000, 40_000, 150, 10)
    g = GainPlanner(cooldown_s=120)
    assert g.step(view(stats, 600.0, prefill=2, draining=True)) is None
    assert g.step(view(stats, 600.0, prefill=2, last_switch_t=500.0)) is None
    assert g.step(view(stats, 600.0, prefill=2, last_switch_t=470.0)) is not None


def test_decode_nodes_to_move_are_the_least_busy():
    stats = WindowStats()
    fill(stats, 0, 600, 6.0, 6000, 40_000, 150, 10)
    running = {2: 9, 3: 1, 4: 7, 5: 0, 6: 3, 7: 8, 8: 2}
    d = GainPlanner().step(view(stats, 600.0, prefill=2, decode_running=running))
    moved = [s.node_id for s in d.switches]
    assert moved == sorted(running, key=lambda n: (running[n], n))[: len(moved)]


def test_registry_lists_planners():
    assert PLANNERS.names() == ["arrow", "dynamo", "gain", "static"]
    with pytest.raises(ValueError, match="choose one of"):
        PLANNERS.create("nope")


def test_decode_demand_counts_requests_in_service():
    """q covers requests queued for prefill too: they are decode demand prefill holds back."""
    from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
    from cluster.control.state import RouteRequest

    cp = ControlPlane(
        {0: "prefill", 1: "decode"}, {0: NODE, 1: NODE}, ControlPlaneConfig(planner="static")
    )
    for i in range(3):
        cp.admit(RouteRequest(f"r{i}", "p", f"b{i}", [], 1000, float(i)))
    assert cp.in_service == 3
    cp.on_request_done("r0", 0, 1, 4.0, t_uc=1000, t_c=0, attn_pairs=5e5, t_out=10, t_acc=1.0)
    assert cp.in_service == 2
    # time average over [0, 6): 1 (0-1) + 2 (1-2) + 3 (2-4) + 2 (4-6) = 1 + 2 + 6 + 4 = 13 / 6
    assert cp._stats.mean_load(0.0, 6.0) == pytest.approx(13 / 6)
