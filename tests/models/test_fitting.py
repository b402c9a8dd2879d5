"""Relative-error NNLS fitting of Eq. 1-2 (models.fitting): Gram algebra, failures, sklearn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import cross_val_score

from models.estimators import DecodeRegressor, PrefillRegressor
from models.fitting import (
    DECODE_TERMS,
    PREFILL_TERMS,
    FitError,
    GramStats,
    bootstrap_ci,
    decode_features,
    fit_from_gram,
    mape,
    prefill_features,
)
from models.work import attn_pairs

PREFILL = np.array([4.0e-3, 6.0e-5, 3.0e-10, 2.0e-6])
DECODE = np.array([1.2e-2, 8.0e-3, 1.5e-4])


def prefill_data(n: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """X = (sum t_uc, sum A, sum t_rst) of single-request chunks, y with lognormal noise."""
    rng = np.random.default_rng(seed)
    t_uc = np.exp(rng.uniform(np.log(16), np.log(8192), n)).round()
    t_c = np.where(rng.random(n) < 0.6, rng.integers(0, 131_072, n), 0).astype(float)
    t_rst = np.where(rng.random(n) < 0.3, (t_c * rng.random(n)).round(), 0.0)
    x = np.column_stack([t_uc, attn_pairs(t_uc, t_c), t_rst])
    y = prefill_features(x[:, 0], x[:, 1], x[:, 2]) @ PREFILL
    return x, y * np.exp(rng.normal(0, noise, n))


def decode_data(n: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.integers(1, 129, n), rng.integers(1, 5, n)]).astype(float)
    y = decode_features(x[:, 0], x[:, 1], 8, 256) @ DECODE
    return x, y * np.exp(rng.normal(0, noise, n))


def test_gram_stats_are_additive_over_row_sets():
    x, y = prefill_data(300, 0.03)
    design = prefill_features(x[:, 0], x[:, 1], x[:, 2])
    whole = GramStats.from_rows(design, y)
    parts = GramStats.from_rows(design[:100], y[:100]) + GramStats.from_rows(design[100:], y[100:])
    np.testing.assert_allclose(parts.xtx, whole.xtx, rtol=1e-12)
    np.testing.assert_allclose(parts.xty, whole.xty, rtol=1e-12)
    assert parts.n == whole.n == 300


def test_noiseless_data_recovers_coefficients_exactly():
    x, y = prefill_data(500, 0.0)
    coef, fixed = fit_from_gram(
        GramStats.from_rows(prefill_features(x[:, 0], x[:, 1], x[:, 2]), y), PREFILL_TERMS
    )
    np.testing.assert_allclose(coef, PREFILL, rtol=1e-7)
    assert fixed == ()
    xd, yd = decode_data(500, 0.0)
    coef, _ = fit_from_gram(
        GramStats.from_rows(decode_features(xd[:, 0], xd[:, 1], 8, 256), yd), DECODE_TERMS
    )
    np.testing.assert_allclose(coef, DECODE, rtol=1e-7)


def test_nnls_clamps_a_coefficient_that_least_squares_would_make_negative():
    rng = np.random.default_rng(1)
    b = rng.integers(1, 129, 400).astype(float)
    design = decode_features(b, 1.0, 8, 256)
    y = design @ np.array([0.02, -0.004, 2e-4])  # a negative expert-coverage effect
    coef, _ = fit_from_gram(GramStats.from_rows(design, y), DECODE_TERMS)
    assert coef[1] == 0.0
    assert np.all(coef >= 0)
    unconstrained = np.linalg.lstsq(design / y[:, None], np.ones_like(y), rcond=None)[0]
    assert unconstrained[1] < 0  # so the clamp did something


def test_a_feature_that_is_always_zero_is_fixed_at_zero():
    x, y = prefill_data(200, 0.0)
    x[:, 2] = 0.0  # no host restores
    y = prefill_features(x[:, 0], x[:, 1], x[:, 2]) @ PREFILL
    coef, fixed = fit_from_gram(
        GramStats.from_rows(prefill_features(x[:, 0], x[:, 1], x[:, 2]), y), PREFILL_TERMS
    )
    assert fixed == ("c3",)
    assert coef[3] == 0.0
    np.testing.assert_allclose(coef[:3], PREFILL[:3], rtol=1e-7)


def test_too_few_samples_names_the_counts():
    xd, yd = decode_data(5, 0.0)
    stats = GramStats.from_rows(decode_features(xd[:, 0], xd[:, 1], 8, 256), yd)
    with pytest.raises(FitError, match=r"5 iterations, need at least 8"):
        fit_from_gram(stats, DECODE_TERMS)


def test_a_single_batch_size_is_reported_as_degenerate():
    b = np.full(50, 16.0)
    y = 0.02 + 1e-4 * b * np.exp(np.random.default_rng(0).normal(0, 0.03, 50))
    with pytest.raises(
        FitError, match=r"degenerate samples: .*d0.*d1.*d2|do not vary independently"
    ):
        fit_from_gram(GramStats.from_rows(decode_features(b, 1.0, 8, 256), y), DECODE_TERMS)


def test_rows_with_nonpositive_times_are_rejected():
    with pytest.raises(ValueError, match="finite and > 0"):
        GramStats.from_rows(np.ones((3, 2)), np.array([1.0, 0.0, 2.0]))


def test_bootstrap_interval_covers_truth_and_shrinks_with_data():
    widths = []
    for n in (2_000, 20_000):
        x, y = prefill_data(n, 0.03, seed=3)
        design = prefill_features(x[:, 0], x[:, 1], x[:, 2])
        buckets = [GramStats.from_rows(design[i::32], y[i::32]) for i in range(32)]
        ci = np.array(bootstrap_ci(buckets, PREFILL_TERMS, resamples=200, seed=0))
        assert np.all(ci[:, 0] <= ci[:, 1])
        # Each interval holds the truth or misses it by less than its own width (the
        # relative-error estimator is biased by ~ -1.5 sigma^2 = -0.14%).
        width = ci[:, 1] - ci[:, 0]
        miss = np.maximum(ci[:, 0] - PREFILL, PREFILL - ci[:, 1])
        assert np.all(miss < width)
        widths.append(width / PREFILL)
    assert np.all(widths[1] < widths[0])
    with pytest.raises(FitError, match="two non-empty buckets"):
        bootstrap_ci([buckets[0]], PREFILL_TERMS)


def test_mape():
    assert mape(np.array([1.0, 2.0]), np.array([1.1, 1.8])) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="empty"):
        mape(np.array([]), np.array([]))


def test_regressors_work_with_sklearn_cross_validation():
    x, y = prefill_data(3000, 0.03)
    r2 = cross_val_score(PrefillRegressor(), x, y, cv=5)
    assert r2.shape == (5,) and np.all(r2 > 0.99)
    neg_mape = cross_val_score(
        PrefillRegressor(), x, y, cv=5, scoring="neg_mean_absolute_percentage_error"
    )
    assert 0.015 < -neg_mape.mean() < 0.035  # 3% lognormal noise -> ~2.4% MAPE
    xd, yd = decode_data(3000, 0.03)
    est = clone(DecodeRegressor(top_k=8, num_experts=256))
    assert est.get_params() == {"top_k": 8, "num_experts": 256}
    scores = cross_val_score(est, xd, yd, cv=4, scoring="neg_mean_absolute_percentage_error")
    assert 0.015 < -scores.mean() < 0.035
    fitted = DecodeRegressor().fit(xd, yd)
    np.testing.assert_allclose(fitted.coef_, DECODE, rtol=0.03)
    assert fitted.n_samples_ == 3000


def test_dense_decode_regressor_fixes_d1():
    xd, _ = decode_data(500, 0.0)
    y = 0.01 + 2e-4 * xd[:, 0]
    est = DecodeRegressor(top_k=0, num_experts=0).fit(xd, y)
    assert est.fixed_ == ("d1",)
    np.testing.assert_allclose(est.coef_, [0.01, 0.0, 2e-4], rtol=1e-7, atol=1e-15)


def test_regressors_reject_wrong_shapes():
    with pytest.raises(ValueError, match="3 columns"):
        PrefillRegressor().fit(np.ones((20, 2)), np.ones(20))
    with pytest.raises(ValueError, match="2 columns"):
        DecodeRegressor().predict(np.ones((4, 3)))


def test_the_simulator_imports_no_scikit_learn_and_the_estimators_still_import() -> None:
    """scikit-learn (seconds to import) loads only for the estimators (models.estimators)."""
    import subprocess
    import sys

    code = (
        "import sys, cluster.sim.simulator, cluster.sim.bench\n"
        "assert 'sklearn' not in sys.modules and 'scipy.stats' not in sys.modules\n"
        "from models import PrefillRegressor, DecodeRegressor\n"
        "assert 'sklearn' in sys.modules and PrefillRegressor.__module__ == 'models.estimators'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
