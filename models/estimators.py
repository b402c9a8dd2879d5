"""Eq. 1 and Eq. 2 as scikit-learn regressors (relative-error NNLS of models.fitting).

Apart from models.fitting because importing scikit-learn takes seconds, which a simulation
that never uses these should not pay; `from models import PrefillRegressor` still works (lazily).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from models.fitting import (
    DECODE_TERMS,
    PREFILL_TERMS,
    FloatArray,
    GramStats,
    decode_features,
    fit_from_gram,
    prefill_features,
)


class _LinearNNLSRegressor(RegressorMixin, BaseEstimator):
    """Shared scikit-learn plumbing: fit relative-error NNLS on a design matrix.

    After `fit`: `coef_` (seconds), `fixed_` (terms fixed at 0), `n_samples_`.
    """

    _terms: tuple[str, ...] = ()
    coef_: FloatArray
    fixed_: tuple[str, ...]
    n_samples_: int

    def _design(self, x: FloatArray) -> FloatArray:  # pragma: no cover - abstract
        raise NotImplementedError

    def fit(self, x: FloatArray, y: FloatArray) -> _LinearNNLSRegressor:
        stats = GramStats.from_rows(self._design(x), np.asarray(y, dtype=np.float64))
        self.coef_, self.fixed_ = fit_from_gram(stats, self._terms, always=("c0", "d0"))
        self.n_samples_ = stats.n
        return self

    def predict(self, x: FloatArray) -> FloatArray:
        return self._design(x) @ self.coef_


class PrefillRegressor(_LinearNNLSRegressor):
    """Eq. 1 as a scikit-learn regressor. X columns: sum t_uc, sum A, sum t_rst (per iteration)."""

    _terms = PREFILL_TERMS

    def __init__(self) -> None:
        pass

    def _design(self, x: FloatArray) -> FloatArray:
        a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != 3:
            raise ValueError(
                f"PrefillRegressor expects X with 3 columns (sum t_uc, sum A, sum t_rst), got shape {a.shape}"
            )
        return prefill_features(a[:, 0], a[:, 1], a[:, 2])


class DecodeRegressor(_LinearNNLSRegressor):
    """Eq. 2 as a scikit-learn regressor. X columns: batch size B, t_fwd (per iteration)."""

    _terms = DECODE_TERMS

    def __init__(self, top_k: int = 8, num_experts: int = 256) -> None:
        self.top_k = top_k
        self.num_experts = num_experts

    def _design(self, x: FloatArray) -> FloatArray:
        a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != 2:
            raise ValueError(
                f"DecodeRegressor expects X with 2 columns (batch size, t_fwd), got shape {a.shape}"
            )
        return decode_features(a[:, 0], a[:, 1], self.top_k, self.num_experts)
