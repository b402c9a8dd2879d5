"""Serving-overhead distributions (models.overheads) and Eq. 3-4's per-pass overhead term."""

from __future__ import annotations

import numpy as np
import pytest

from models import DecodeModel, MeanWork, NodeModel, PrefillModel, cluster_throughput
from models.occupancy import PassOverhead
from models.overheads import PROBS, ServingOverheads, StageFit, with_pass_overheads


def test_a_lognormal_delay_is_recovered_and_draws_keep_its_mean() -> None:
    rng = np.random.default_rng(1)
    x = rng.lognormal(mean=np.log(0.02), sigma=0.6, size=4000)  # a 20 ms median stage
    fit = StageFit.fit("handoff", x)
    assert fit.samples == 4000
    assert fit.log_mu == pytest.approx(np.log(0.02), abs=0.03)
    assert fit.log_sigma == pytest.approx(0.6, abs=0.03)
    assert fit.quantiles_s[10] == pytest.approx(np.median(x))
    assert list(fit.quantiles_s) == sorted(fit.quantiles_s) and len(fit.quantiles_s) == len(PROBS)
    # the bins average to the sample mean exactly; draws to it within their noise
    assert fit.draw_mean_s == pytest.approx(x.mean(), rel=1e-9)
    s = ServingOverheads({"handoff": fit}).sampler(0)
    draws = np.array([s.draw("handoff") for _ in range(20000)])
    assert draws.mean() == pytest.approx(x.mean(), rel=0.03)
    assert np.quantile(draws, 0.9) == pytest.approx(np.quantile(x, 0.9), rel=0.1)


def test_a_per_sequence_cost_is_separated_from_the_per_pass_one() -> None:
    rng = np.random.default_rng(2)
    seqs = rng.integers(1, 6, size=3000)
    x = 0.004 + 0.0015 * (seqs - 1) + rng.exponential(0.001, size=seqs.size)
    fit = StageFit.fit("decode_pass", x, seqs)
    assert fit.per_seq_s == pytest.approx(0.0015, rel=0.05)
    assert fit.mean_s == pytest.approx(0.005, rel=0.05)  # at one sequence
    assert fit.mean_at(3) == pytest.approx(0.008, rel=0.05)
    s = ServingOverheads({"decode_pass": fit}).sampler(0)
    assert np.mean([s.draw("decode_pass", 4) for _ in range(5000)]) == pytest.approx(
        0.0095, rel=0.05
    )


def test_no_overheads_add_nothing_and_bad_stages_are_refused() -> None:
    none = ServingOverheads()
    assert not none and none.ttft_s == 0.0 and none.sampler(0).draw("ingress") == 0.0
    with pytest.raises(ValueError, match="unknown overhead stage 'proxy'"):
        StageFit.fit("proxy", [0.1, 0.2])
    with pytest.raises(ValueError, match="no finite durations"):
        StageFit.fit("ingress", [float("nan")])
    # negative durations (clock offsets between hosts) count as 0
    assert StageFit.fit("ingress", [-0.01, 0.01]).quantiles_s[0] == 0.0
    fits = {s: StageFit.fit(s, [0.01] * 5) for s in ("ingress", "handoff", "last_out")}
    assert ServingOverheads(fits).ttft_s == pytest.approx(0.02)  # last_out is after it


def test_eq3_and_eq4_charge_each_pass_cpu_overhead_and_default_to_the_paper() -> None:
    base = NodeModel(
        PrefillModel(1e-3, 2e-5, 1e-9, 0.0), DecodeModel(2e-3, 1e-3, 1e-4, 2, 16), 500.0
    )
    w = MeanWork(t_uc=400.0, attn_pairs=400.0 * 200.0 + 400.0 * 401.0 / 2, t_c=200.0, t_out=20.0)
    fits = {
        "prefill_pass": StageFit.fit("prefill_pass", [0.005] * 5),
        "decode_pass": StageFit.fit("decode_pass", [0.002, 0.003, 0.004], [1, 2, 3]),
    }
    over = with_pass_overheads(base, ServingOverheads(fits))
    assert over.prefill_overhead == PassOverhead(0.005, 0.0)
    assert over.decode_overhead == PassOverhead(pytest.approx(0.002), pytest.approx(0.001))
    # Eq. 3: the request's share of its passes' overhead (t_uc / t_bar of a pass)
    assert over.prefill_request_time(w) - base.prefill_request_time(w) == pytest.approx(
        0.005 * 400.0 / 500.0
    )
    # Eq. 4: each iteration of a batch of 4 costs o0 + 3 o1 more, shared by 4 requests
    extra = (0.002 + 3 * 0.001) * 20.0 / 4.0
    assert over.decode_request_time(w, 4.0) - base.decode_request_time(w, 4.0) == pytest.approx(
        extra
    )
    assert cluster_throughput([over], [over], w, 4.0) < cluster_throughput([base], [base], w, 4.0)
    # without overheads: the paper's equations, bit for bit
    same = with_pass_overheads(base, ServingOverheads())
    assert same.prefill_request_time(w) == base.prefill_request_time(w)
    assert same.decode_request_time(w, 4.0) == base.decode_request_time(w, 4.0)
