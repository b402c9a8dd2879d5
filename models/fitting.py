"""Nonnegative least-squares fitting of the iteration-time models (paper 000 §5.1).

Each model is linear in its coefficients: prefill features (1, sum t_uc, sum A, sum t_rst),
decode features (1, phi(B), B). Iteration times carry multiplicative noise, so we fit in
relative terms, minimizing sum(((x.c - y) / y)^2), which is what held-out MAPE rewards.

Everything reduces to Gram statistics (G = sum x x^T / y^2, b = sum x / y), so a fit over
10M logged iterations only needs one aggregation pass (done in SQL by the caller) and a
tiny NNLS. Bootstrap confidence intervals resample per-bucket Gram statistics (rows are
hashed into buckets), which approximates a row bootstrap without touching rows again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from models.iteration import phi

FloatArray = npt.NDArray[np.float64]

PREFILL_TERMS = ("c0", "c1", "c2", "c3")
DECODE_TERMS = ("d0", "d1", "d2")
# Relative conditioning below which the remaining features are called collinear.
_RANK_TOL = 1e-10


class FitError(ValueError):
    """The data cannot determine the model (too few or degenerate samples)."""


@dataclass(slots=True)
class GramStats:
    """Relative-error Gram statistics of a set of rows (additive across row sets)."""

    xtx: FloatArray
    xty: FloatArray
    yty: float
    n: int

    @classmethod
    def zeros(cls, p: int) -> GramStats:
        return cls(np.zeros((p, p)), np.zeros(p), 0.0, 0)

    @classmethod
    def from_rows(cls, x: FloatArray, y: FloatArray) -> GramStats:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(f"expected x (n, p) and y (n,), got {x.shape} and {y.shape}")
        if np.any(y <= 0) or not np.all(np.isfinite(y)):
            raise ValueError("iteration times must be finite and > 0")
        xw = x / y[:, None]
        return cls(xw.T @ xw, xw.sum(axis=0), float(len(y)), len(y))

    def __add__(self, other: GramStats) -> GramStats:
        return GramStats(
            self.xtx + other.xtx, self.xty + other.xty, self.yty + other.yty, self.n + other.n
        )

    @property
    def p(self) -> int:
        return int(self.xty.shape[0])


class FitResult(NamedTuple):
    """Coefficients in seconds, training samples, held-out MAPE, bootstrap 95% CI."""

    coef: tuple[float, ...]
    samples: int
    mape: float | None = None
    ci: tuple[tuple[float, float], ...] | None = None
    fixed: tuple[str, ...] = ()
    message: str | None = None


def _nnls_gram(xtx: FloatArray, xty: FloatArray, active: npt.NDArray[np.bool_]) -> FloatArray:
    """argmin_{c >= 0} c^T G c - 2 b^T c over the active columns (others fixed at 0)."""
    p = xty.shape[0]
    coef = np.zeros(p)
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return coef
    g = xtx[np.ix_(idx, idx)]
    b = xty[idx]
    scale = np.sqrt(np.diag(g))
    gs = g / np.outer(scale, scale)
    bs = b / scale
    jitter = 0.0
    for _ in range(6):
        try:
            r = np.linalg.cholesky(gs + jitter * np.eye(idx.size)).T
            break
        except np.linalg.LinAlgError:
            jitter = 1e-12 if jitter == 0.0 else jitter * 100
    else:  # pragma: no cover - gs is PSD with unit diagonal, jitter 1e-2 always works
        raise FitError("Gram matrix is not positive semidefinite")
    z = np.linalg.solve(r.T, bs)
    from scipy.optimize import nnls  # imported when first needed: scipy.optimize takes ~1 s

    cs, _ = nnls(r, z, maxiter=50 * idx.size)
    coef[idx] = cs / scale
    return coef


def fit_from_gram(
    stats: GramStats,
    terms: Sequence[str],
    *,
    min_samples: int | None = None,
    always: Sequence[str] = (),
) -> tuple[FloatArray, tuple[str, ...]]:
    """NNLS coefficients from Gram statistics, plus the terms fixed at 0 (never varied).

    Raises FitError with a message naming the problem when the rows cannot determine the
    model: fewer than `min_samples` rows (default 2 * p + 2), sums that overflow, or collinear
    features.
    """
    p = stats.p
    if len(terms) != p:
        raise ValueError(f"{len(terms)} term names for {p} features")
    need = 2 * p + 2 if min_samples is None else min_samples
    if stats.n < need:
        raise FitError(f"too few samples: {stats.n} iterations, need at least {need}")
    if not (np.all(np.isfinite(stats.xtx)) and np.all(np.isfinite(stats.xty))):
        raise FitError(
            "the features' sums overflow: some logged value is absurdly large (e.g. 1e300 "
            "query-key pairs); the iterations cannot determine the model"
        )
    diag = np.diag(stats.xtx)
    active = diag > 0
    fixed = tuple(t for t, a in zip(terms, active, strict=True) if not a and t not in always)
    missing = [t for t, a in zip(terms, active, strict=True) if not a and t in always]
    if missing:
        raise FitError(f"feature of {', '.join(missing)} is zero in every sample")
    idx = np.flatnonzero(active)
    g = stats.xtx[np.ix_(idx, idx)]
    s = np.sqrt(np.diag(g))
    eig = np.linalg.eigvalsh(g / np.outer(s, s))
    if eig[0] <= _RANK_TOL * max(eig[-1], 1e-300):
        # Name the feature that is (nearly) a combination of the others.
        vec = np.linalg.eigh(g / np.outer(s, s))[1][:, 0]
        names = [terms[idx[i]] for i in np.flatnonzero(np.abs(vec) > 0.2)]
        raise FitError(
            "degenerate samples: the features of "
            + ", ".join(names)
            + " do not vary independently (e.g. a single batch size), so their coefficients "
            "cannot be separated"
        )
    return _nnls_gram(stats.xtx, stats.xty, active), fixed


def mape(y_true: FloatArray, y_pred: FloatArray) -> float:
    """Mean absolute percentage error as a fraction (0.03 = 3%)."""
    yt = np.asarray(y_true, dtype=np.float64)
    yp = np.asarray(y_pred, dtype=np.float64)
    if yt.size == 0:
        raise ValueError("mape of an empty set")
    return float(np.mean(np.abs(yp - yt) / np.abs(yt)))


def bootstrap_ci(
    buckets: Sequence[GramStats],
    terms: Sequence[str],
    *,
    resamples: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[tuple[float, float], ...]:
    """Percentile CI per coefficient from resampling row buckets with replacement."""
    usable = [b for b in buckets if b.n > 0]
    if len(usable) < 2:
        raise FitError("bootstrap needs at least two non-empty buckets")
    rng = np.random.default_rng(seed)
    xtx = np.stack([b.xtx for b in usable])
    xty = np.stack([b.xty for b in usable])
    active = np.diag(xtx.sum(axis=0)) > 0
    k = len(usable)
    picks = rng.integers(0, k, size=(resamples, k))
    weights = np.stack([np.bincount(p, minlength=k) for p in picks]).astype(np.float64)
    g_all = np.tensordot(weights, xtx, axes=1)  # (resamples, p, p)
    b_all = weights @ xty
    draws = np.zeros((resamples, len(terms)))
    # Where the unconstrained optimum is nonnegative it is the NNLS solution; solve all
    # resamples at once and run NNLS only on the rest (a few, or none, in practice).
    idx = np.flatnonzero(active)
    g = g_all[:, idx][:, :, idx]
    scale = np.sqrt(np.einsum("rii->ri", g))
    todo = np.ones(resamples, dtype=bool)
    if np.all(scale > 0):
        gs = g / (scale[:, :, None] * scale[:, None, :])
        try:
            sol = np.linalg.solve(gs, (b_all[:, idx] / scale)[..., None])[..., 0] / scale
        except np.linalg.LinAlgError:
            sol = None
        if sol is not None:
            good = np.all(np.isfinite(sol) & (sol >= 0), axis=1)
            draws[np.ix_(good, idx)] = sol[good]
            todo = ~good
    for r in np.flatnonzero(todo):
        draws[r] = _nnls_gram(g_all[r], b_all[r], active & (np.diag(g_all[r]) > 0))
    alpha = (1.0 - level) / 2.0
    lo = np.quantile(draws, alpha, axis=0)
    hi = np.quantile(draws, 1.0 - alpha, axis=0)
    return tuple((float(a), float(b)) for a, b in zip(lo, hi, strict=True))


def prefill_features(
    sum_t_uc: FloatArray, sum_attn_pairs: FloatArray, sum_t_rst: FloatArray
) -> FloatArray:
    """Design matrix (1, sum t_uc, sum A, sum t_rst) of Eq. 1."""
    uc = np.asarray(sum_t_uc, dtype=np.float64)
    return np.column_stack(
        [np.ones_like(uc), uc, np.asarray(sum_attn_pairs, float), np.asarray(sum_t_rst, float)]
    )


def decode_features(
    batch_size: FloatArray, t_fwd: FloatArray | float, top_k: int, num_experts: int
) -> FloatArray:
    """Design matrix (1, phi(B), B) of Eq. 2."""
    b = np.asarray(batch_size, dtype=np.float64)
    return np.column_stack(
        [np.ones_like(b), phi(b, top_k, num_experts, t_fwd) * np.ones_like(b), b]
    )
