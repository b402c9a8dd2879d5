"""Iteration-time models of one node (paper 000 §5.1, Eq. 1–2; App. B.3).

Prefill (Eq. 1):  T_P = c0 + c1*sum(t_uc) + c2*sum(A) + c3*sum(t_rst)
Expert coverage:  phi(B) = 1 - (1 - k/E)^(t_fwd*B), phi == 0 for a dense model (E = 0)
                  (skew s > 0: routing concentrated on popular experts, models.expert_skew)
Decode (Eq. 2):   T_D(B) = d0 + d1*phi(B) + d2*B
All coefficients are in seconds (per iteration, per token, per query-key pair, ...).

Two optional terms carry the evidence-chosen forms of models.forms: a prefill floor (GEMMs
read the weights whatever the token count, so an iteration of fewer than `knee_tokens`
tokens costs c1*knee_tokens) and a decode context term d3*sum(ctx) (the KV read of dense
attention, App. B.4). Both default to 0, which is Eq. 1 and Eq. 2 exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from models.work import attn_pairs

FloatArray = npt.NDArray[np.float64]


def phi(
    batch_size: float | FloatArray,
    top_k: int,
    num_experts: int,
    t_fwd: float | FloatArray = 1.0,
    skew: float = 0.0,
):  # type: ignore[no-untyped-def,unused-ignore]
    """Expected fraction of routed experts that t_fwd*B tokens select (App. B.3).

    App. B.3 assumes uniform routing (`skew` 0). With `skew` s > 0 expert i is chosen with
    popularity proportional to i^-s (models.expert_skew.phi_skewed): fewer distinct experts
    are touched by the same tokens."""
    if skew:
        tokens = np.asarray(t_fwd, dtype=np.float64) * np.asarray(batch_size, dtype=np.float64)
        return phi_skewed(tokens, top_k, num_experts, skew)
    if num_experts <= 0:
        return (
            np.zeros_like(np.asarray(batch_size, dtype=np.float64))
            if isinstance(batch_size, np.ndarray)
            else 0.0
        )
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..num_experts={num_experts}, got {top_k}")
    base = 1.0 - top_k / num_experts
    tokens = np.asarray(t_fwd, dtype=np.float64) * np.asarray(batch_size, dtype=np.float64)
    out = 1.0 - np.power(base, tokens)
    return float(out) if np.ndim(out) == 0 else out


def expert_pick_probability(top_k: int, num_experts: int, skew: float) -> FloatArray:
    """q_i: probability that expert i is among one token's k picks when expert i's
    popularity is proportional to i^-skew (models.expert_skew); k/E for skew 0."""
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..num_experts={num_experts}, got {top_k}")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew}")
    w = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    return np.minimum(1.0, top_k * w / w.sum())


def phi_skewed(tokens: float | FloatArray, top_k: int, num_experts: int, skew: float) -> Any:
    """phi_s(T) = mean_i [1 - (1 - q_i)^T]: the fraction of experts T tokens touch."""
    if num_experts <= 0:
        return np.zeros_like(np.asarray(tokens, dtype=np.float64)) if np.ndim(tokens) else 0.0
    q = expert_pick_probability(top_k, num_experts, skew)
    t = np.asarray(tokens, dtype=np.float64)
    out = 1.0 - np.mean((1.0 - q)[None, :] ** t.reshape(-1, 1), axis=1)
    return float(out[0]) if t.ndim == 0 else out.reshape(t.shape)


def _coefs(values: Sequence[float], n: int, name: str) -> tuple[float, ...]:
    vals = tuple(float(v) for v in values)
    if len(vals) != n:
        raise ValueError(f"{name} needs {n} coefficients, got {len(vals)}")
    if any(not np.isfinite(v) for v in vals):
        raise ValueError(f"{name} coefficients must be finite, got {vals}")
    return vals


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """Eq. 1 with coefficients (c0, c1, c2, c3) in seconds.

    Optional terms of the evidence-chosen forms (models.forms), all 0 in Eq. 1:
    `knee_tokens` (c1 multiplies max(sum t_uc, knee_tokens): the "floor"), c4 (seconds per
    cached token a chunk attends to: the KV read) and c5 (seconds at phi(sum t_uc) = 1, the
    weights of the experts an MoE layer's tokens touch, with `top_k` of `num_experts`).
    `coef` stays (c0..c3); `coef_all` adds c4, c5.
    """

    c0: float
    c1: float
    c2: float
    c3: float
    knee_tokens: float = 0.0
    c4: float = 0.0
    c5: float = 0.0
    top_k: int = 0
    num_experts: int = 0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.knee_tokens) and self.knee_tokens >= 0):
            raise ValueError(f"knee_tokens must be finite and >= 0, got {self.knee_tokens}")

    @classmethod
    def from_coef(
        cls,
        coef: Sequence[float],
        knee_tokens: float = 0.0,
        top_k: int = 0,
        num_experts: int = 0,
    ) -> PrefillModel:
        """From (c0..c3) or, for the "roofline" form, (c0..c5)."""
        vals = tuple(coef)
        if len(vals) == 6:
            c0, c1, c2, c3, c4, c5 = _coefs(vals, 6, "prefill model (roofline form)")
            return cls(c0, c1, c2, c3, float(knee_tokens), c4, c5, top_k, num_experts)
        c0, c1, c2, c3 = _coefs(vals, 4, "prefill model")
        return cls(c0, c1, c2, c3, knee_tokens=float(knee_tokens))

    @property
    def coef(self) -> tuple[float, float, float, float]:
        return (self.c0, self.c1, self.c2, self.c3)

    @property
    def coef_all(self) -> tuple[float, float, float, float, float, float]:
        return (self.c0, self.c1, self.c2, self.c3, self.c4, self.c5)

    def iteration_time(
        self,
        sum_t_uc: float,
        sum_attn_pairs: float,
        sum_t_rst: float = 0.0,
        sum_t_c: float = 0.0,
    ) -> float:
        tokens = max(sum_t_uc, self.knee_tokens) if sum_t_uc > 0 else sum_t_uc
        t = self.c0 + self.c1 * tokens + self.c2 * sum_attn_pairs + self.c3 * sum_t_rst
        if self.c4 or self.c5:
            t += self.c4 * sum_t_c + self.c5 * float(phi(sum_t_uc, self.top_k, self.num_experts))
        return t

    def predict(self, features: FloatArray) -> FloatArray:
        """Predict from rows of (sum t_uc, sum A, sum t_rst[, sum t_c])."""
        x = np.asarray(features, dtype=np.float64)
        tokens = np.where(x[:, 0] > 0, np.maximum(x[:, 0], self.knee_tokens), x[:, 0])
        out = self.c0 + tokens * self.c1 + x[:, 1] * self.c2 + x[:, 2] * self.c3
        if self.c4 or self.c5:
            t_c = x[:, 3] if x.shape[1] > 3 else 0.0
            out = out + self.c4 * t_c + self.c5 * phi(x[:, 0], self.top_k, self.num_experts)
        return out

    def batch_time(
        self, t_uc: Sequence[float], t_c: Sequence[float], t_rst: Sequence[float] | None = None
    ) -> float:
        """Iteration time of a batch given each request's (chunk's) t_uc, t_c, t_rst."""
        uc = np.asarray(t_uc, dtype=np.float64)
        c = np.asarray(t_c, dtype=np.float64)
        rst = 0.0 if t_rst is None else float(np.sum(t_rst))
        return self.iteration_time(
            float(uc.sum()), float(attn_pairs(uc, c).sum()), rst, float(c.sum())
        )


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Eq. 2 with coefficients (d0, d1, d2) in seconds and the node's MoE shape.

    `num_experts == 0` means a dense model (phi == 0, d1 unused). `t_fwd` is the default
    tokens fed per request per iteration (> 1 under speculative decoding). `d3` (seconds
    per context token summed over the batch) is the "ctx" form's KV-read term; 0 in Eq. 2.
    `coef` stays (d0, d1, d2); `coef_ctx` adds d3.
    """

    d0: float
    d1: float
    d2: float
    top_k: int = 8
    num_experts: int = 256
    t_fwd: float = 1.0
    d3: float = 0.0
    skew: float = 0.0  # routing skew of phi (models.expert_skew); 0: uniform (App. B.3)

    @classmethod
    def from_coef(
        cls, coef: Sequence[float], top_k: int = 8, num_experts: int = 256, t_fwd: float = 1.0
    ) -> DecodeModel:
        """From (d0, d1, d2) or, for the "ctx" form, (d0, d1, d2, d3)."""
        vals = tuple(coef)
        if len(vals) == 4:
            d0, d1, d2, d3 = _coefs(vals, 4, "decode model (ctx form)")
            return cls(d0, d1, d2, top_k, num_experts, t_fwd, d3)
        d0, d1, d2 = _coefs(vals, 3, "decode model")
        return cls(d0, d1, d2, top_k, num_experts, t_fwd)

    @property
    def coef(self) -> tuple[float, float, float]:
        return (self.d0, self.d1, self.d2)

    @property
    def coef_ctx(self) -> tuple[float, float, float, float]:
        return (self.d0, self.d1, self.d2, self.d3)

    def phi(self, batch_size: float | FloatArray, t_fwd: float | FloatArray | None = None):  # type: ignore[no-untyped-def,unused-ignore]
        fwd = self.t_fwd if t_fwd is None else t_fwd
        return phi(batch_size, self.top_k, self.num_experts, fwd, self.skew)

    def iteration_time(
        self, batch_size: float, t_fwd: float | None = None, ctx_tokens: float = 0.0
    ) -> float:
        """Seconds of one decode iteration; `ctx_tokens` is the batch's summed context."""
        if batch_size <= 0:
            return 0.0
        return (
            self.d0
            + self.d1 * float(self.phi(batch_size, t_fwd))
            + self.d2 * batch_size
            + self.d3 * ctx_tokens
        )

    def predict(
        self,
        batch_size: FloatArray,
        t_fwd: FloatArray | float | None = None,
        ctx_tokens: FloatArray | float = 0.0,
    ) -> FloatArray:
        b = np.asarray(batch_size, dtype=np.float64)
        out = self.d0 + self.d1 * self.phi(b, t_fwd) + self.d2 * b
        return out + self.d3 * np.asarray(ctx_tokens, dtype=np.float64) if self.d3 else out
