"""The router and the planner price a live cluster's serving overheads (models.overheads).

The predicted TTFT of the `ttft` router adds the expected overheads before the first token
(proxy, wake-up, KV hand-off, join, streaming) and prices a queue's passes with their CPU
overhead; without overheads it is Eq. 7 bit for bit. The control plane takes a measured
overhead through `set_ttft_overhead` (the live cluster's refits) or its config.
"""

from __future__ import annotations

import pytest

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
from cluster.control.routing import PredictedTTFTRouter
from cluster.control.state import ClusterState, ClusterView, NodeReport, QueuedWork, RouteRequest
from cluster.kv.directory import KVDirectory
from cluster.kv.hashing import chain_path as path
from models import DecodeModel, FetchModel, NodeModel, PrefillModel
from models.occupancy import PassOverhead

BT = 16
MODEL = NodeModel(PrefillModel(0.01, 4e-5, 6e-8, 0.0), DecodeModel(0.002, 0.01, 0.002, 2, 16), 64)


def _state(model: NodeModel = MODEL, overhead_s: float = 0.0) -> ClusterState:
    phases = {0: "prefill", 1: "prefill", 2: "decode"}
    return ClusterState(
        phases=phases,  # type: ignore[arg-type]
        models={n: model for n in phases},
        directory=KVDirectory(BT),
        fetch=FetchModel(),
        overhead_s=overhead_s,
    )


def _route(s: ClusterState, t_in: int = 300) -> float:
    r = RouteRequest("r", "p", "b", path("x", t_in // BT), t_in, 5.0)
    got = PredictedTTFTRouter().route(r, ClusterView(s)).predicted_ttft_s
    assert got is not None
    return got


def test_predicted_ttft_adds_the_expected_overheads_before_the_first_token() -> None:
    plain = _route(_state())
    assert _route(_state(overhead_s=0.0)) == plain  # Eq. 7 as is, bit for bit
    assert _route(_state(overhead_s=0.19)) == pytest.approx(plain + 0.19)


def test_a_queue_is_priced_with_its_passes_cpu_overhead() -> None:
    queued = tuple(QueuedWork(f"q{i}", 200, 0) for i in range(5))
    waits = []
    for model in (
        MODEL,
        NodeModel(MODEL.prefill, MODEL.decode, 64, prefill_overhead=PassOverhead(0.006)),
    ):
        s = _state(model)
        for n in (0, 1):
            s.report(NodeReport(n, 4.9, "prefill", queued, 0.0, 1))
        waits.append(ClusterView(s).prefill_wait(0, 5.0))
    # five queued requests of 200 new tokens: 200/64 passes each, 6 ms of overhead per pass
    assert waits[1] - waits[0] == pytest.approx(5 * 0.006 * 200 / 64)


def test_the_control_plane_takes_the_measured_overhead() -> None:
    phases = {0: "prefill", 1: "decode"}
    cfg = ControlPlaneConfig(block_tokens=BT, ttft_overhead_s=0.05)

    def plane() -> ControlPlane:
        return ControlPlane(phases, {n: MODEL for n in phases}, cfg)  # type: ignore[arg-type]

    r = RouteRequest("r", "p", "b", path("x", 20), 320, 1.0)
    cp = plane()
    assert cp.view.overhead_s == 0.05
    first = cp.route(r).predicted_ttft_s
    cp = plane()
    cp.set_ttft_overhead(0.25)  # what a live cluster's refit measured
    second = cp.route(r).predicted_ttft_s
    assert first is not None and second is not None
    assert second - first == pytest.approx(0.2)
    cp.set_ttft_overhead(-1.0)
    assert cp.view.overhead_s == 0.0
