"""`pdlab fit` on the simulator's own logs recovers the hardware profile (issue #4 must-show).

Prefill: every coefficient within 2% of the profile. Decode: every raw coefficient within
5%; Eq. 2 omits the context-length term the simulator's ground truth includes (paper 000
App. B.4), so the raw fit absorbs it into d0-d2. We show that the omitted term explains the difference: (a) fitting the same
rows with the logged context term removed recovers the profile within 2%, and (b) the raw
fit matches, within 2%, the best the Eq. 2 form can do on noise-free ground truth.
"""

import numpy as np
import pytest

import telemetry
from cluster.hardware.profiles import PRESETS
from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from models import DecodeRegressor
from toolkit.fit.run import fit_run, to_json

PROFILE = PRESETS["gb300"]


@pytest.fixture(scope="module")
def run_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("fit") / "sim.duckdb"
    # A small GPU cache makes host restores frequent, so c3 is identifiable. Two hours give
    # each prefill node ~7,000 iterations: with 3% noise the standard error of the small
    # quadratic term c2 is then ~0.6%, so the 2% bound is a real check, not a coin toss
    # (at 30 minutes, ~2,600 iterations, its 95% bootstrap interval is +-2.2%).
    cfg = SimConfig(
        workload="cc",
        nodes=4,
        split="2P2D",
        agents=80,
        duration_s=7200,
        warmup_s=0,
        planner="static",
        stagger_s=300,
        telemetry="compact",
        seed=1,
        l1_tokens=400_000,
    )
    simulate(cfg, db)
    return db


def _rel(a, b):
    return [abs(x - y) / y for x, y in zip(a, b, strict=True)]


def test_prefill_coefficients_within_2_percent(run_db):
    fit = to_json(fit_run(run_db))
    prefill = [
        n["prefill"]
        for n in fit["nodes"]
        if n["prefill"].get("coef") and n["prefill"]["samples"] > 1500
    ]
    assert len(prefill) == 2  # the two prefill nodes
    for e in prefill:
        assert max(_rel(e["coef"], PROFILE.prefill)) < 0.02, e
        assert e["mape"] < 0.035  # 3% multiplicative noise


def test_decode_difference_is_the_omitted_context_term(run_db):
    fit = to_json(fit_run(run_db))
    rows = telemetry.open_reader(run_db).sql(
        "select node_id, batch_size, t_fwd, ctx_tokens, duration_s from decode_iterations"
    )
    decode = {
        n["node_id"]: n["decode"]
        for n in fit["nodes"]
        if n["decode"].get("coef") and n["decode"]["samples"] > 5000
    }
    assert len(decode) == 2
    for node, entry in decode.items():
        x = rows.filter(rows["node_id"] == node)
        b = x["batch_size"].to_numpy()
        xs = np.column_stack([b, x["t_fwd"].to_numpy()])
        ctx = PROFILE.decode_ctx_s_per_token * x["ctx_tokens"].to_numpy()
        # (a) remove the logged context term: the profile comes back.
        corrected = DecodeRegressor(PROFILE.top_k, PROFILE.num_experts).fit(
            xs, x["duration_s"].to_numpy() - ctx
        )
        assert max(_rel(corrected.coef_, PROFILE.decode)) < 0.02
        # (b) the raw fit equals the best Eq. 2 fit of the noise-free truth with the term.
        truth = np.array([PROFILE.decode_times(int(bi), np.array([0.0]))[0] for bi in b]) + ctx
        best = DecodeRegressor(PROFILE.top_k, PROFILE.num_experts).fit(xs, truth)
        assert max(_rel(entry["coef"], best.coef_)) < 0.02
        assert entry["mape"] < 0.035
        # and the raw fit itself is within the 5% the issue allows for decode.
        assert max(_rel(entry["coef"], PROFILE.decode)) < 0.05, entry
