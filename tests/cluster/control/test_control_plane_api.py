"""The control plane's methods for what callers used to do by hand, and their invariants.

Undoing a placement (a failed attempt), rolling back or upgrading a pending switch, holding a
node out of routing for reasons of an engine's own (down, relaunching) alongside a switch,
planner and router settings, dropping a restarted engine's blocks, and the read-only
accessors. Random sequences of switches and holds keep the switch bookkeeping consistent.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig, SwitchError
from cluster.control.state import RouteRequest
from cluster.core import ConfigError, KVEvent, KVEventKind, MemorySink
from models import DecodeModel, NodeModel, PrefillModel

NODE = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))
BT = 16


class Backend:
    """Records the switches the control plane asks for (the engines' side)."""

    def __init__(self) -> None:
        self.begun: list[tuple[int, str, str]] = []

    def begin_switch(self, node: int, to_phase: str, mode: str, now: float) -> None:
        self.begun.append((node, to_phase, mode))


def plane(
    phases: str = "PPDD", sink: MemorySink | None = None, **cfg: object
) -> tuple[ControlPlane, Backend]:
    ph = {i: ("prefill" if c == "P" else "decode") for i, c in enumerate(phases)}
    backend = Backend()
    config = ControlPlaneConfig(block_tokens=BT, **({"planner": "static"} | cfg))  # type: ignore[arg-type]
    cp = ControlPlane(ph, {n: NODE for n in ph}, config, sink=sink, backend=backend)
    return cp, backend


def req(rid: str, now: float = 1.0, t_in: int = 64) -> RouteRequest:
    path = [hash((rid, i)) for i in range(t_in // BT)]
    return RouteRequest(rid, "prog", f"b-{rid}", path, t_in, now)


def test_release_placement_undoes_router_pending_work_and_decode_binding() -> None:
    """Also a fix: the proxy's hand-written undo told the router only `on_done`, so the
    Dynamo router kept a failed attempt's prompt blocks as active prefill forever."""
    cp, _ = plane(router="dynamo")
    r = req("r1")
    d = cp.admit(r)
    dec = cp.bind_decode(r, d.node_id, 100)
    assert cp.view.pending(d.node_id) and cp.view.decode_load(dec) == 1
    assert cp._router.active_prefill[d.node_id] == 4  # type: ignore[attr-defined]  # 64/16
    cp.release_placement("r1", d.node_id, dec)
    assert cp.view.pending(d.node_id) == [] and cp.view.decode_load(dec) == 0
    assert cp._router.active_prefill[d.node_id] == 0  # type: ignore[attr-defined]
    cp.release_placement("r1", d.node_id, dec)  # twice: nothing goes negative
    assert cp.view.decode_load(dec) == 0
    cp.check_invariants()
    # The request is still in service until it finishes or is abandoned for good.
    assert cp.in_service == 1
    cp.on_request_abandoned(2.0)
    assert cp.in_service == 0


def test_reroute_from_a_node_forgets_it_there() -> None:
    cp, _ = plane(router="round-robin")
    r = req("r1")
    first = cp.admit(r).node_id
    again = cp.reroute(r, from_node=first)
    assert again.node_id != first
    assert [w.request_id for w in cp.view.pending(again.node_id)] == ["r1"]
    assert cp.view.pending(first) == []
    # Counts move as for any same-phase move: the source releases once the target confirms.
    assert cp.branch("b-r1").nodes == sorted({first, again.node_id})  # type: ignore[union-attr]
    cp.on_prefill_done(r, again.node_id, 2.0)
    assert cp.branch("b-r1").nodes == [again.node_id]  # type: ignore[union-attr]
    cp.check_invariants()


def test_cancel_switch_rolls_back_without_a_row() -> None:
    sink = MemorySink()
    cp, backend = plane(sink=sink)
    sw = cp.request_switch(0, "decode", 5.0)
    assert backend.begun == [(0, "decode", "in-place")]
    assert cp.pending_switch(0) == sw and cp.unavailable_reasons(0) == {"switch"}
    assert cp.available("prefill") == [1]
    back = cp.cancel_switch(0)
    assert back == sw and cp.pending_switch(0) is None
    assert cp.phase_of(0) == "prefill" and cp.available("prefill") == [0, 1]
    assert cp.num_switches == 0 and sink.rows("phase_switches") == []
    with pytest.raises(SwitchError, match="no switch in progress"):
        cp.cancel_switch(0)
    cp.check_invariants()


def test_a_node_down_stays_out_of_routing_when_its_switch_completes() -> None:
    cp, _ = plane("PPPD")
    cp.request_switch(0, "decode", 1.0)
    cp.mark_unavailable(0, "engine down")
    cp.complete_switch(0, 2.0, drained=3)
    assert cp.phase_of(0) == "decode" and cp.unavailable_reasons(0) == {"engine down"}
    assert cp.available("decode") == [3]
    cp.mark_available(0, "engine down")
    assert cp.available("decode") == [0, 3]
    # A switch given up while the node is also down: it stays out until it is up again.
    cp.request_switch(2, "decode", 3.0)
    cp.mark_unavailable(2, "engine down")
    cp.cancel_switch(2)
    assert cp.phase_of(2) == "prefill" and cp.available("prefill") == [1]
    with pytest.raises(SwitchError, match="node 1 is the last available prefill node"):
        cp.request_switch(1, "decode", 4.0)
    cp.mark_available(2, "engine down")
    assert cp.available("prefill") == [1, 2]
    cp.check_invariants()


def test_holds_are_checked() -> None:
    cp, _ = plane()
    with pytest.raises(ConfigError, match="unknown node 9"):
        cp.mark_unavailable(9, "engine down")
    with pytest.raises(ConfigError, match="control plane's own hold reason"):
        cp.mark_unavailable(0, "switch")
    cp.mark_unavailable(0, "engine down")
    cp.mark_unavailable(0, "relaunching")
    cp.mark_available(0, "engine down")
    assert cp.unavailable_reasons(0) == {"relaunching"}
    # The last available prefill node cannot switch while the other one is held.
    with pytest.raises(SwitchError, match="last available prefill node"):
        cp.request_switch(1, "decode", 1.0)


def test_a_switch_upgraded_to_relaunch_drops_the_nodes_kv() -> None:
    sink = MemorySink()
    cp, _ = plane(sink=sink)
    cp.on_kv_events([KVEvent(0.5, 0, KVEventKind.STORED, "gpu", (11, 12, 13), None, BT)])
    assert cp.node_blocks(0) == 3
    cp.request_switch(0, "decode", 1.0)
    with pytest.raises(SwitchError, match="switch mode must be one of"):
        cp.set_switch_mode(0, "teleport")  # type: ignore[arg-type]
    assert cp.set_switch_mode(0, "relaunch").mode == "relaunch"
    cp.complete_switch(0, 4.0, drained=2)
    assert cp.node_blocks(0) == 0
    (row,) = sink.rows("phase_switches")
    assert (row["lost_kv_blocks"], row["drained"], row["t_done"]) == (3, 2, 4.0)
    with pytest.raises(SwitchError, match="no switch in progress"):
        cp.set_switch_mode(0, "relaunch")


def test_drop_node_blocks_of_a_restarted_engine() -> None:
    cp, _ = plane()
    cp.on_kv_events([KVEvent(0.5, 1, KVEventKind.STORED, "gpu", (21, 22), None, BT)])
    cp.on_kv_events([KVEvent(0.5, 0, KVEventKind.STORED, "gpu", (21,), None, BT)])
    assert cp.drop_node_blocks(1) == 2
    assert cp.node_blocks(1) == 0 and cp.node_blocks(0) == 1
    assert cp.directory_stats()["block_tokens"] == BT


def test_set_planner_keeps_the_next_evaluation_consistent_and_is_all_or_nothing() -> None:
    cp, _ = plane(planner="gain", window_s=600.0, slices=10, planner_mode="advise")
    cp.start_disaggregation(cp.phases(), 100.0)
    assert cp.planner_settings().next_evaluation_t == 700.0
    cp.tick(300.0)  # the clock moves; no evaluation is due
    s = cp.set_planner(window_s=60.0)
    assert (s.window_s, s.next_evaluation_t) == (60.0, 360.0)  # at most one window away
    assert cp.set_planner(window_s=6000.0).next_evaluation_t == 360.0  # never later
    with pytest.raises(ConfigError, match=r"slices must be in \[2, 100\] slices, got 1"):
        cp.set_planner(mode="off", slices=1)
    assert cp.planner_settings().mode == "advise"  # nothing changed
    with pytest.raises(ConfigError, match="planner mode must be one of auto, advise, off"):
        cp.set_planner(mode="sometimes")
    s = cp.set_planner(mode="off", slices=4)
    assert (s.mode, s.slices) == ("off", 4)
    static, _ = plane(planner="static")
    with pytest.raises(ConfigError, match="planner 'static' has no window"):
        static.set_planner(window_s=60.0)


def test_set_router_keeps_the_routers_memory_for_the_same_policy() -> None:
    cp, _ = plane(router="cache-aware")
    cp.admit(req("r1"))
    router = cp._router
    s = cp.set_router("cache-aware", 5e-7)
    assert cp._router is router and s == ("cache-aware", 5e-7, "async")
    cp.set_router("round-robin")
    assert cp.router_settings() == ("round-robin", 5e-7, "async")  # price kept
    with pytest.raises(ConfigError, match="unknown router policy 'nope'; choose one of: "):
        cp.set_router("nope")
    with pytest.raises(ConfigError, match=r"copy_price must be in \[0, 0.01\] s/token, got -1"):
        cp.set_router(copy_price_s_per_token=-1.0)
    assert cp.router_settings().policy == "round-robin"


def test_reads_are_copies_or_read_only_views() -> None:
    cp, _ = plane()
    cp.request_switch(0, "decode", 1.0)
    with pytest.raises(TypeError):
        cp.switches[1] = cp.switches[0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        cp.num_switches = 3  # type: ignore[misc]
    cp.phases()[1] = "decode"
    cp.models().clear()
    assert cp.phase_of(1) == "prefill" and set(cp.models()) == {0, 1, 2, 3}
    cp.admit(req("r1"))
    b = cp.branch("b-r1")
    assert b is not None and b.program_id == "prog" and b.version == 1
    assert cp.active_branches() == ["b-r1"] and cp.branch("nope") is None


OPS = st.lists(
    st.tuples(
        st.sampled_from(["switch", "complete", "cancel", "down", "up", "relaunch"]),
        st.integers(0, 4),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_switches_and_holds_keep_the_bookkeeping(ops: list[tuple[str, int]]) -> None:
    cp, _ = plane("PPPDD")
    down: set[int] = set()
    t = 0.0
    for op, n in ops:
        t += 1.0
        try:
            if op == "switch":
                to = "decode" if cp.phase_of(n) == "prefill" else "prefill"
                cp.request_switch(n, to, t)
            elif op == "complete":
                cp.complete_switch(n, t)
            elif op == "cancel":
                cp.cancel_switch(n)
            elif op == "relaunch":
                cp.set_switch_mode(n, "relaunch")
            elif op == "down":
                cp.mark_unavailable(n, "engine down")
                down.add(n)
            else:
                cp.mark_available(n, "engine down")
                down.discard(n)
        except SwitchError:
            pass
        cp.check_invariants()
        held = {m for m in range(5) if cp.pending_switch(m) is not None} | down
        assert cp.unavailable_nodes() == held
        for phase in ("prefill", "decode"):
            assert cp.available(phase) == sorted(
                m for m in range(5) if cp.phase_of(m) == phase and m not in held
            )
    # Every node of a phase can be held, but a switch never empties a phase by itself.
    assert {cp.phase_of(m) for m in range(5)} == {"prefill", "decode"}
