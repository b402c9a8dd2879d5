"""The cluster simulator prices a live cluster's serving overheads where a request spends them.

Three requests, far apart (no queueing), on a 1P1D cluster: with constant overhead stages
each request's first token reaches the client exactly ingress + hand-off + first-token-out
later than the prefill's end (the hand-off replacing the profile's KV transfer), its last
token last-token-out after the decode's end, and every decode pass costs its CPU overhead
more; with no overheads the run is the simulator as before.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cluster.hardware.profiles import PRESETS
from cluster.sim.config import SimConfig
from cluster.sim.simulator import Simulator
from models.overheads import ServingOverheads, StageFit

T_IN, T_OUT = 512, 8
# no noise, one token per decode iteration: every difference is exact
PROFILE = replace(PRESETS["gb300"], noise=0.0, t_fwd=1.0, t_acc=1.0)


def _run(tmp_path, overheads: ServingOverheads | None):  # type: ignore[no-untyped-def]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 10_000.0 * i, "input_length": T_IN, "output_length": T_OUT})
            + "\n"
            for i in range(3)
        )
    )
    cfg = SimConfig(
        workload=str(trace),
        workload_params={"block_tokens": 16, "cycle": False},
        nodes=2,
        split="1P1D",
        agents=1,
        duration_s=100.0,
        warmup_s=0.0,
        planner="static",
        profile=PROFILE,
        telemetry="compact",
        overheads=overheads,
    )
    sim = Simulator(cfg)
    sim.run()
    reqs = sorted(sim.requests, key=lambda r: r.t_arrival)
    assert len(reqs) == 3 and all(r.t_done is not None for r in reqs)
    return sim, reqs


def _constant(**stages: float) -> ServingOverheads:
    return ServingOverheads({s: StageFit.fit(s, [v] * 5) for s, v in stages.items()})


def test_request_stages_land_on_ttft_and_e2e_where_they_happen(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base_sim, base = _run(tmp_path, None)
    stages = {"ingress": 0.1, "handoff": 0.05, "first_out": 0.02, "last_out": 0.03}
    _, over = _run(tmp_path, _constant(**stages))
    p = base_sim.profile
    transfer = p.transfer_base_s + p.transfer_s_per_token * T_IN
    for b, o in zip(base, over, strict=True):
        assert o.t_arrival == b.t_arrival
        # the prefill ends `ingress` later; the first token reaches the client through the
        # decode node: hand-off, then out through the proxy
        ttft_b, ttft_o = b.t_first_token - b.t_arrival, o.t_first_token - o.t_arrival
        assert ttft_o == pytest.approx(ttft_b + 0.1 + 0.05 + 0.02, abs=1e-9)
        # the decode starts after the measured hand-off instead of the profile's transfer
        e2e_b, e2e_o = b.t_done - b.t_arrival, o.t_done - o.t_arrival
        assert e2e_o == pytest.approx(e2e_b + 0.1 + (0.05 - transfer) + 0.03, abs=1e-9)


def test_each_decode_pass_costs_its_cpu_overhead_and_a_short_answer_waits_for_prefills(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    _, base = _run(tmp_path, _constant(handoff=0.05))
    _, over = _run(tmp_path, _constant(handoff=0.05, decode_pass=0.004))
    for b, o in zip(base, over, strict=True):
        assert o.t_first_token == pytest.approx(b.t_first_token, abs=1e-9)
        # T_OUT - 1 decode passes after the first token, each 4 ms longer
        assert o.t_done - b.t_done == pytest.approx((T_OUT - 1) * 0.004, abs=1e-9)
    # the proxy finishes a request once the prefill engine's answer is in too
    _, late = _run(tmp_path, _constant(handoff=0.05, prefill_out=5.0))
    for b, o in zip(base, late, strict=True):
        assert o.t_first_token == pytest.approx(b.t_first_token, abs=1e-9)
        assert o.t_done - o.t_first_token > 4.9


def test_no_overheads_is_the_simulator_as_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, a = _run(tmp_path, None)
    _, b = _run(tmp_path, ServingOverheads())
    assert [(r.t_first_token, r.t_done) for r in a] == [(r.t_first_token, r.t_done) for r in b]
