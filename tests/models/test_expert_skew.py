"""phi(B) under skewed routing (models.expert_skew) and Eq. 2's MoE term fitted with it."""

from __future__ import annotations

import numpy as np
import pytest

from models.expert_skew import expert_pick_probability, fit_moe_term, phi_skewed
from models.iteration import DecodeModel, phi


def test_zero_skew_is_app_b3s_uniform_phi() -> None:
    b = np.array([1.0, 4.0, 32.0, 256.0, 4096.0])
    assert np.allclose(phi_skewed(b, 8, 128, 0.0), phi(b, 8, 128))
    assert phi(b, 8, 128, skew=0.0) is not None and np.allclose(phi(b, 8, 128, skew=0.0), phi(b, 8, 128))


def test_skew_touches_fewer_experts_and_keeps_each_tokens_k_picks() -> None:
    q = expert_pick_probability(8, 128, 1.0)
    assert q.sum() <= 8.0 + 1e-9 and q[0] > q[-1] and q.max() <= 1.0
    b = np.array([4.0, 64.0, 512.0])
    uniform, skewed = phi(b, 8, 128), phi(b, 8, 128, skew=1.0)
    assert np.all(skewed < uniform) and np.all(np.diff(skewed) > 0)
    assert float(phi_skewed(1.0, 8, 128, 1.0)) == pytest.approx(q.sum() / 128)


def test_the_fit_recovers_the_skew_and_coefficients_it_was_made_with() -> None:
    tokens = np.array([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096], float)
    true = 2e-5 + 4e-4 * phi_skewed(tokens, 8, 128, 1.0) + 3e-8 * tokens
    fit = fit_moe_term(tokens, true, 8, 128)
    assert fit.skew == 1.0 and fit.cv_mape < 1e-6
    assert fit.coef == pytest.approx((2e-5, 4e-4, 3e-8), rel=1e-4)
    uniform = fit_moe_term(tokens, true, 8, 128, skew=0.0)
    assert uniform.skew == 0.0 and uniform.cv_mape > 10 * fit.cv_mape
    assert np.allclose(fit.predict(tokens, 8, 128), true)


def test_decode_model_prices_with_its_skew() -> None:
    m = DecodeModel(1e-3, 2e-3, 1e-5, top_k=8, num_experts=128, skew=1.0)
    assert m.iteration_time(16) == pytest.approx(1e-3 + 2e-3 * float(phi(16, 8, 128, skew=1.0)) + 16e-5)
    assert DecodeModel(1e-3, 2e-3, 1e-5, top_k=8, num_experts=128).iteration_time(16) > m.iteration_time(16)
