"""Iteration-time models of one node (paper 000 §5.1, Eq. 1–2; App. B.3).

Prefill (Eq. 1):  T_P = c0 + c1*sum(t_uc) + c2*sum(A) + c3*sum(t_rst)
Expert coverage:  phi(B) = 1 - (1 - k/E)^(t_fwd*B), phi == 0 for a dense model (E = 0)
Decode (Eq. 2):   T_D(B) = d0 + d1*phi(B) + d2*B
All coefficients are in seconds (per iteration, per token, per query-key pair, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.work import attn_pairs

FloatArray = npt.NDArray[np.float64]


def phi(
    batch_size: float | FloatArray, top_k: int, num_experts: int, t_fwd: float | FloatArray = 1.0
):  # type: ignore[no-untyped-def,unused-ignore]
    """Expected fraction of routed experts that t_fwd*B tokens select (App. B.3)."""
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


def _coefs(values: Sequence[float], n: int, name: str) -> tuple[float, ...]:
    vals = tuple(float(v) for v in values)
    if len(vals) != n:
        raise ValueError(f"{name} needs {n} coefficients, got {len(vals)}")
    if any(not np.isfinite(v) for v in vals):
        raise ValueError(f"{name} coefficients must be finite, got {vals}")
    return vals


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """Eq. 1 with coefficients (c0, c1, c2, c3) in seconds."""

    c0: float
    c1: float
    c2: float
    c3: float

    @classmethod
    def from_coef(cls, coef: Sequence[float]) -> PrefillModel:
        return cls(*_coefs(coef, 4, "prefill model"))

    @property
    def coef(self) -> tuple[float, float, float, float]:
        return (self.c0, self.c1, self.c2, self.c3)

    def iteration_time(
        self, sum_t_uc: float, sum_attn_pairs: float, sum_t_rst: float = 0.0
    ) -> float:
        return self.c0 + self.c1 * sum_t_uc + self.c2 * sum_attn_pairs + self.c3 * sum_t_rst

    def predict(self, features: FloatArray) -> FloatArray:
        """Predict from rows of (sum t_uc, sum A, sum t_rst)."""
        x = np.asarray(features, dtype=np.float64)
        return self.c0 + x[:, 0] * self.c1 + x[:, 1] * self.c2 + x[:, 2] * self.c3

    def batch_time(
        self, t_uc: Sequence[float], t_c: Sequence[float], t_rst: Sequence[float] | None = None
    ) -> float:
        """Iteration time of a batch given each request's (chunk's) t_uc, t_c, t_rst."""
        uc = np.asarray(t_uc, dtype=np.float64)
        c = np.asarray(t_c, dtype=np.float64)
        rst = 0.0 if t_rst is None else float(np.sum(t_rst))
        return self.iteration_time(float(uc.sum()), float(attn_pairs(uc, c).sum()), rst)


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Eq. 2 with coefficients (d0, d1, d2) in seconds and the node's MoE shape.

    `num_experts == 0` means a dense model (phi == 0, d1 unused). `t_fwd` is the default
    tokens fed per request per iteration (> 1 under speculative decoding).
    """

    d0: float
    d1: float
    d2: float
    top_k: int = 8
    num_experts: int = 256
    t_fwd: float = 1.0

    @classmethod
    def from_coef(
        cls, coef: Sequence[float], top_k: int = 8, num_experts: int = 256, t_fwd: float = 1.0
    ) -> DecodeModel:
        d0, d1, d2 = _coefs(coef, 3, "decode model")
        return cls(d0, d1, d2, top_k, num_experts, t_fwd)

    @property
    def coef(self) -> tuple[float, float, float]:
        return (self.d0, self.d1, self.d2)

    def phi(self, batch_size: float | FloatArray, t_fwd: float | FloatArray | None = None):  # type: ignore[no-untyped-def,unused-ignore]
        return phi(batch_size, self.top_k, self.num_experts, self.t_fwd if t_fwd is None else t_fwd)

    def iteration_time(self, batch_size: float, t_fwd: float | None = None) -> float:
        if batch_size <= 0:
            return 0.0
        return self.d0 + self.d1 * float(self.phi(batch_size, t_fwd)) + self.d2 * batch_size

    def predict(
        self, batch_size: FloatArray, t_fwd: FloatArray | float | None = None
    ) -> FloatArray:
        b = np.asarray(batch_size, dtype=np.float64)
        return self.d0 + self.d1 * self.phi(b, t_fwd) + self.d2 * b
