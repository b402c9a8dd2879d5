"""phi(B) under skewed expert routing, and Eq. 2's MoE term fitted with it (paper 000 App. B.3).

App. B.3 derives the fraction of routed experts a batch touches assuming every token picks
its k of E experts uniformly: phi(T) = 1 - (1 - k/E)^T for T tokens. Real routers prefer
some experts; AIConfigurator's kernel database times MoE layers under balanced routing and
under power-law expert loads (`power_law_1.01`, `power_law_1.2`), and under a power law
fewer distinct experts are touched by the same tokens, so fewer expert weights are read.

The skew s is one documented parameter: expert i (i = 1..E) has popularity
p_i = i^-s / sum_j j^-s, a token's k picks include it with probability q_i = min(1, k p_i)
(exact for s = 0, where q_i = k/E), and

    phi_s(T) = (1/E) sum_i [1 - (1 - q_i)^T]        (phi_0 = phi of App. B.3)

The MoE term of Eq. 2 on one MoE layer is t(T) = m0 + m1 phi_s(T) + m2 T (the weights of
the experts touched, and the work per token-expert pair). `fit_moe_term` fits it by the
relative-error NNLS of models.fitting for each s of SKEW_GRID and keeps the s with the
smallest 5-fold cross-validated relative error; the same function fits decode iterations from live
logs (B and seconds), so the phi pdlab fits from logs and the one a profile prices with are
the same form with the same parameter. s = 0 is App. B.3 exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from models.fitting import FitError, GramStats, fit_from_gram
from models.iteration import expert_pick_probability, phi_skewed

__all__ = ["MoeTermFit", "expert_pick_probability", "fit_moe_term", "phi_skewed"]

FloatArray = npt.NDArray[np.float64]
SKEW_GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
FOLDS = 5
TERMS = ("m0", "m1", "m2")


class MoeTermFit(NamedTuple):
    """Eq. 2's MoE term on one table: coefficients (s), the skew, and held-out MAPE."""

    coef: tuple[float, float, float]
    skew: float
    cv_mape: float  # 5-fold cross-validated (every point predicted by a fit without it)
    points: int

    def predict(self, tokens: FloatArray, top_k: int, num_experts: int) -> FloatArray:
        ph = phi_skewed(tokens, top_k, num_experts, self.skew)
        return self.coef[0] + self.coef[1] * ph + self.coef[2] * np.asarray(tokens, dtype=float)


def _design(tokens: FloatArray, top_k: int, num_experts: int, skew: float) -> FloatArray:
    t = np.asarray(tokens, dtype=np.float64)
    return np.column_stack([np.ones_like(t), phi_skewed(t, top_k, num_experts, skew), t])


def _cv_mape(x: FloatArray, y: FloatArray) -> float:
    """5-fold cross-validated MAPE of the relative NNLS (folds interleave the token grid)."""
    fold = np.arange(len(y)) % FOLDS
    errs = np.empty(len(y))
    for f in range(FOLDS):
        test = fold == f
        coef, _ = fit_from_gram(GramStats.from_rows(x[~test], y[~test]), TERMS, always=("m0",))
        errs[test] = np.abs(x[test] @ coef / y[test] - 1.0)
    return float(errs.mean())


def fit_moe_term(
    tokens: FloatArray,
    seconds: FloatArray,
    top_k: int,
    num_experts: int,
    skew: float | None = None,
) -> MoeTermFit:
    """Fit t(T) = m0 + m1 phi_s(T) + m2 T; `skew` None chooses s from SKEW_GRID by
    cross-validated error, a number fixes it (0: App. B.3's uniform phi)."""
    t = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if len(t) < 8:
        raise FitError(f"the MoE term needs >= 8 points, got {len(t)}")
    best: MoeTermFit | None = None
    for s in SKEW_GRID if skew is None else (float(skew),):
        x = _design(t, top_k, num_experts, s)
        try:
            coef, _ = fit_from_gram(GramStats.from_rows(x, y), TERMS, always=("m0",))
            cv = _cv_mape(x, y)
        except FitError:
            continue
        fit = MoeTermFit((float(coef[0]), float(coef[1]), float(coef[2])), s, cv, len(t))
        if best is None or fit.cv_mape < best.cv_mape - 1e-12:
            best = fit
    if best is None:
        raise FitError("the MoE term could not be fitted at any skew")
    return best
