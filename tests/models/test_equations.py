"""Equations of paper 000 §5 against hand-computed values."""

import math

import numpy as np
import pytest

from models import (
    DecodeModel,
    FetchModel,
    NodeModel,
    PrefillModel,
    RequestWork,
    attn_pairs,
    cluster_throughput,
    gain_test,
    phi,
    predicted_ttft,
)
from models.gain import choose


def test_attn_pairs_counts_causal_pairs():
    # 3 new tokens after 2 cached: token i attends to 2 cached + i new -> 3+4+5 = 12
    assert attn_pairs(3, 2) == 12
    assert attn_pairs(1, 0) == 1
    np.testing.assert_allclose(attn_pairs(np.array([3.0, 1.0]), np.array([2.0, 0.0])), [12, 1])


def test_phi_matches_expert_coverage_formula():
    assert phi(1, 8, 256) == pytest.approx(8 / 256)
    assert phi(10, 8, 256, t_fwd=2) == pytest.approx(1 - (1 - 8 / 256) ** 20)
    assert phi(64, 8, 0) == 0.0  # dense
    assert phi(10_000, 8, 256) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="top_k"):
        phi(1, 300, 256)


def test_prefill_and_decode_iteration_times():
    p = PrefillModel(0.01, 1e-5, 1e-10, 1e-7)
    assert p.iteration_time(1000, 2e6, 500) == pytest.approx(0.01 + 0.01 + 2e-4 + 5e-5)
    assert p.batch_time([3], [2], [0]) == pytest.approx(0.01 + 3e-5 + 12e-10)
    d = DecodeModel(0.012, 0.02, 1e-4, top_k=8, num_experts=256, t_fwd=2)
    assert d.iteration_time(16) == pytest.approx(0.012 + 0.02 * (1 - (1 - 8 / 256) ** 32) + 16e-4)
    assert d.iteration_time(0) == 0.0


def test_request_occupancy_eq3_eq4():
    node = NodeModel(
        PrefillModel(0.02, 1e-5, 1e-10, 1e-7), DecodeModel(0.01, 0.02, 1e-4), 4096, 0.5
    )
    w = RequestWork(t_uc=2048, t_c=10_000, t_out=500, t_acc=2)
    expect = (
        0.02 * 2048 / 4096 + 1e-5 * 2048 + 1e-10 * attn_pairs(2048, 10_000) + 1e-7 * 0.5 * 10_000
    )
    assert node.prefill_request_time(w) == pytest.approx(expect)
    t_iter = node.decode.iteration_time(8)
    assert node.decode_request_time(w, 8) == pytest.approx(t_iter * 500 / (8 * 2))
    assert node.prefill_rate(w) == pytest.approx(1 / expect)


def test_cluster_throughput_is_min_of_phases():
    node = NodeModel(PrefillModel(0.02, 1e-5, 1e-10, 0.0), DecodeModel(0.01, 0.02, 1e-4))
    w = RequestWork(t_uc=4096, t_c=20_000, t_out=300)
    theta = cluster_throughput([node] * 3, [node] * 6, w, mean_decode_requests=60)
    p = 3 * node.prefill_rate(w)
    d = 6 * node.decode_rate(w, 10)
    assert theta == pytest.approx(min(p, d))
    assert cluster_throughput([], [node], w, 10) == 0.0


def test_gain_test_threshold():
    burst = [0.0] * 9 + [10.0]  # one slice only
    c = gain_test(4, burst)
    assert c.mean_gain == pytest.approx(1.0)
    assert not c.qualified  # 1.0 < 2 * std / sqrt(10)
    sustained = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.0]
    assert gain_test(5, sustained).qualified
    best = choose([gain_test(5, sustained), gain_test(6, [x * 2 for x in sustained]), c])
    assert best is not None and best.prefill_count == 6


def test_predicted_ttft_charges_exposed_fetch_and_copy_price():
    fm = FetchModel()
    assert fm.time(511) == 0.0
    assert fm.time(1_000_000) == pytest.approx(1.45)
    # fetch (1.45 s) outlasts the 1 s wait: 0.45 s exposed
    assert predicted_ttft(1.0, 0.2, 1_000_000, 0.0) == pytest.approx(1.0 + 0.2 + 0.45)
    # a long wait hides the fetch; the copy price still applies
    assert predicted_ttft(5.0, 0.2, 1_000_000, 1e-7) == pytest.approx(5.2 + 0.1)
    assert math.isclose(predicted_ttft(0.0, 0.1), 0.1)


def test_request_work_validation():
    with pytest.raises(ValueError, match="t_uc"):
        RequestWork(t_uc=-1)
    with pytest.raises(ValueError, match="t_acc"):
        RequestWork(t_uc=1, t_acc=0)
