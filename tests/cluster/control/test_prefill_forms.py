"""The router priced with a node's fitted prefill form (models.forms) instead of Eq. 3 alone.

By default the control plane prices prefill with Eq. 3 (the goldens depend on it);
`ControlPlaneConfig.prefill_forms` or `ControlPlane.set_prefill_predictor` switch a node
to its form's prediction, which adds the KV read of a cached context (c4), the experts a
chunk touches (c5) and the small-chunk floor.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
from cluster.control.state import RouteRequest, form_prefill_time
from cluster.core import ConfigError
from cluster.sim.config import SimConfig
from cluster.sim.simulator import Simulator
from models import DecodeModel, NodeModel, PrefillModel, RequestWork

DECODE = DecodeModel(0.012, 0.015, 2.8e-4)
PAPER = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DECODE)
# the "roofline" form: a KV read per cached token (c4) and the experts touched (c5)
ROOFLINE = NodeModel(
    PrefillModel(0.03, 8e-5, 4e-10, 3e-7, c4=2e-7, c5=0.02, top_k=8, num_experts=256), DECODE
)


def plane(models: dict[int, NodeModel], **cfg: object) -> ControlPlane:
    phases = {n: ("decode" if n == max(models) else "prefill") for n in models}
    config = ControlPlaneConfig(block_tokens=16, planner="static", **cfg)  # type: ignore[arg-type]
    return ControlPlane(phases, models, config)  # type: ignore[arg-type]


def eq3(m: NodeModel, t_uc: float, t_c: float) -> float:
    p = m.prefill
    a = t_uc * t_c + t_uc * (t_uc + 1) / 2
    return p.c0 * t_uc / m.mean_new_tokens + p.c1 * t_uc + p.c2 * a + p.c3 * 0.0 * t_c


def test_a_context_term_prices_a_long_context_request_higher() -> None:
    """A 512-token chunk over a 100k-token cached context: the form reads the context's KV."""
    eq1 = plane({0: ROOFLINE, 1: PAPER})
    form = plane({0: ROOFLINE, 1: PAPER}, prefill_forms=True)
    t_uc, t_c = 512.0, 100_000.0
    base = eq1.view.prefill_time(0, t_uc, t_c)
    assert base == pytest.approx(eq3(ROOFLINE, t_uc, t_c))  # default unchanged: Eq. 3 only
    priced = form.view.prefill_time(0, t_uc, t_c)
    assert priced > base + 2e-7 * t_c * 0.99  # at least the KV read of the context
    assert priced == pytest.approx(ROOFLINE.prefill_request_time(RequestWork(t_uc, t_c)))
    # the longer the cached context, the larger the gap
    gap = [form.view.prefill_time(0, t_uc, c) - eq1.view.prefill_time(0, t_uc, c)
           for c in (1_000.0, 10_000.0, 100_000.0)]  # fmt: skip
    assert gap[0] < gap[1] < gap[2]


def test_a_paper_form_node_is_priced_as_eq3() -> None:
    form = plane({0: PAPER, 1: PAPER}, prefill_forms=True)
    for t_uc, t_c in ((1.0, 0.0), (4096.0, 0.0), (512.0, 60_000.0)):
        assert form.view.prefill_time(0, t_uc, t_c) == pytest.approx(eq3(PAPER, t_uc, t_c), 1e-12)
    assert form_prefill_time(PAPER, -5.0, -1.0) == 0.0  # negative counts clamp like Eq. 3


def test_a_per_node_predictor_changes_routing_predictions_and_can_be_removed() -> None:
    cp = plane({0: ROOFLINE, 1: ROOFLINE, 2: PAPER})
    req = RouteRequest("r1", "p", "b", [], 2048, 0.0)
    before = cp.route(req).predicted_ttft_s
    assert before is not None
    cp.set_prefill_predictor(0, form_prefill_time)
    cp.set_prefill_predictor(1, form_prefill_time)
    after = cp.route(req).predicted_ttft_s
    assert after is not None and after > before  # c5: the experts 2048 tokens touch
    assert cp.view.prefill_time(0, 2048, 0) > eq3(ROOFLINE, 2048, 0)
    cp.set_prefill_predictor(0, None)
    assert cp.view.prefill_time(0, 2048, 0) == pytest.approx(eq3(ROOFLINE, 2048, 0))
    with pytest.raises(ConfigError, match="unknown node 7"):
        cp.set_prefill_predictor(7, form_prefill_time)


def test_the_simulator_passes_the_setting_to_its_control_plane() -> None:
    cfg = SimConfig(nodes=2, split="1P1D", duration_s=10.0, warmup_s=0.0, profile="h200")
    assert Simulator(cfg).cp.form_priced_nodes() == frozenset()
    sim = Simulator(replace(cfg, prefill_forms=True))
    assert sim.cp.form_priced_nodes() == {0, 1}
