"""The time of any iteration an engine can run, from measured operator timings (SPEC §9).

`IterationPricer.time(prefill_chunks, decode_kv)` prices one iteration of a chunked-prefill
engine (vLLM V1, SGLang collocated): prefill chunks (t_uc new tokens over t_c cached ones
each) and decodes (each over its context of KV) in one forward pass, on one rank of a TP
group. With N = sum t_uc + number of decodes (tokens through the GEMMs) and S = chunks +
decodes (sequences that reach lm_head):

    T = L_dense * dense_layer(N) + L * attention(...) + L_moe * moe(tokens, experts)
        + dense_iteration(N) + per_sequence(S) + communication

- attention: one call per layer over the largest chunk and every decode, at the decodes'
  mean context (the profile measures uniform contexts; decode attention reads sum(ctx) of
  KV, which the mean preserves), interpolated linearly on each of the four axes as
  LLMServingSim does; each further chunk adds its own prefill-only time above the launch
  floor (the table's smallest pure-prefill time).
- MoE (App. B.3): tokens after dispatch on one rank T*(1-(1-1/e)^k), distinct experts
  touched (E/e)*(1-(1-k/E)^T) = (E/e)*phi(T), for T tokens of the EP group of e ranks
  (the DP ranks' tokens together under DP+EP: `group_tokens`), times `expert_load_skew`
  (the busiest rank's tokens over the mean; 1 = balanced routing).
- communication (no profile measures it): per TP all-reduce of N*hidden*dtype bytes, two
  per layer (after o_proj and the MLP/MoE) and one for the vocab-parallel embedding,
  latency + 2(t-1)/t * bytes / bandwidth; under EP a dispatch and a combine per MoE layer of
  the group's tokens, latency + (e-1)/e * bytes / bandwidth each. `link_gbps` and
  `link_latency_s` are assumptions (PCIe-class defaults), not measurements.

Times are what the operators measured (eager mode, no CUDA graphs, no CPU scheduling time):
the engine model adds what the profile lacks.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables, Table1D


def _bracket(values: Sequence[float], q: float) -> tuple[int, int, float]:
    """(lo, hi, t) to blend values[lo] and values[hi]: clamp below, extrapolate above."""
    n = len(values)
    if n == 1 or q <= values[0]:
        return 0, 0, 0.0
    i = bisect.bisect_right(values, q)
    lo, hi = (n - 2, n - 1) if i >= n else (i - 1, i)
    x0, x1 = values[lo], values[hi]
    return lo, hi, (q - x0) / (x1 - x0) if x1 != x0 else 0.0


class _Row(NamedTuple):
    keys: list[float]
    values: list[float]
    slope_above: float | None = None  # None: extrapolate from the last two keys

    def at(self, q: float) -> float:
        """Linear between keys, the first value below them, linear beyond the last."""
        if self.slope_above is not None and q > self.keys[-1]:
            return self.values[-1] + self.slope_above * (q - self.keys[-1])
        lo, hi, t = _bracket(self.keys, q)
        return max(self.values[lo] + t * (self.values[hi] - self.values[lo]), 0.0)


class AttentionGrid:
    """The 4-D attention table: exact at measured points, linear per axis between them."""

    def __init__(self, rows: np.ndarray) -> None:
        grouped: dict[tuple[float, float], dict[float, dict[float, float]]] = {}
        self.points: dict[tuple[float, float, float, float], float] = {}
        for pc, kp, nd, kd, s in rows.tolist():
            grouped.setdefault((pc, nd), {}).setdefault(kp, {})[kd] = s
            self.points[(pc, kp, nd, kd)] = s
        self.pc_vals = sorted({k[0] for k in grouped})
        self.nd_vals = sorted({k[1] for k in grouped})
        self.slices: dict[tuple[float, float], tuple[list[float], list[_Row]]] = {}
        for key, by_kp in grouped.items():
            kps = sorted(by_kp)
            self.slices[key] = (
                kps,
                [_Row(sorted(by_kp[k]), [by_kp[k][d] for d in sorted(by_kp[k])]) for k in kps],
            )
        pure = [s for (pc, _kp, nd, _kd), s in self.points.items() if nd == 0 and pc > 0]
        self.prefill_floor = min(pure) if pure else 0.0

    def _slice(self, pc: float, nd: float, kp: float, kd: float) -> float:
        sl = self.slices.get((pc, nd))
        if sl is None:
            pc, nd = min(self.slices, key=lambda k: (k[0] - pc) ** 2 + (k[1] - nd) ** 2)
            sl = self.slices[(pc, nd)]
        kps, rows = sl
        lo, hi, t = _bracket(kps, kp)
        v0 = rows[lo].at(kd)
        return v0 if lo == hi else v0 + t * (rows[hi].at(kd) - v0)

    def __call__(self, pc: float, kp: float, nd: float, kd: float) -> float:
        exact = self.points.get((pc, kp, nd, kd))
        if exact is not None:
            return exact
        a, b, tp = _bracket(self.pc_vals, pc)
        c, d, tn = _bracket(self.nd_vals, nd)
        p0, p1, n0, n1 = self.pc_vals[a], self.pc_vals[b], self.nd_vals[c], self.nd_vals[d]
        c00 = self._slice(p0, n0, kp, kd)
        c01 = self._slice(p0, n1, kp, kd)
        c10 = self._slice(p1, n0, kp, kd)
        c11 = self._slice(p1, n1, kp, kd)
        v0 = c00 + tn * (c01 - c00)
        v1 = c10 + tn * (c11 - c10)
        return max(v0 + tp * (v1 - v0), 0.0)


class MoeGrid:
    """MoE block seconds on one rank by (tokens after dispatch, distinct experts)."""

    def __init__(self, rows: np.ndarray) -> None:
        by: dict[float, dict[float, float]] = {}
        for t, e, s in rows.tolist():
            by.setdefault(e, {})[t] = s
        self.experts = sorted(by)
        self.rows = [
            Table1D(np.asarray(sorted(by[e])), np.asarray([by[e][t] for t in sorted(by[e])]))
            for e in self.experts
        ]

    def __call__(self, tokens: float, experts: float) -> float:
        lo, hi, t = _bracket(self.experts, max(experts, 1.0))
        v0 = float(self.rows[lo](tokens))
        return v0 if lo == hi else v0 + t * (float(self.rows[hi](tokens)) - v0)


class IterationCost(NamedTuple):
    """Seconds of one iteration by component (their sum is `total`)."""

    dense: float
    attention: float
    moe: float
    per_sequence: float
    communication: float

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.moe + self.per_sequence + self.communication


@dataclass(frozen=True, slots=True)
class Parallelism:
    """TP degree of an engine, DP engines, EP degree (1: experts split by TP), link model."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    link_gbps: float = 25.0
    link_latency_s: float = 10e-6
    expert_load_skew: float = 1.0

    def __post_init__(self) -> None:
        """Degrees and the link model within their ceilings (cluster.size_limits); NaN or
        infinite values are refused here, so none reaches a profile's JSON."""
        limits.TENSOR_PARALLEL.check("--tp", self.tp)
        limits.DATA_PARALLEL.check("--dp", self.dp)
        limits.EXPERT_PARALLEL.check("--ep", self.ep)
        if self.ep > self.tp * self.dp:
            raise ConfigError(
                f"--ep must be at most --tp x --dp = {self.tp * self.dp}, got {self.ep}"
            )
        limits.LINK_GBPS.check("--link-gbps", self.link_gbps)
        lat_us = (
            self.link_latency_s * 1e6
            if isinstance(self.link_latency_s, int | float)
            else self.link_latency_s
        )
        limits.LINK_LATENCY_US.check("--link-latency-us", lat_us)
        limits.EXPERT_LOAD_SKEW.check("--expert-load-skew", self.expert_load_skew)


@dataclass(eq=False)
class IterationPricer:
    """Iteration times of one engine (module docstring); build with `from_tables`."""

    tables: OperatorTables
    shape: ModelShape
    parallel: Parallelism = field(default_factory=Parallelism)

    def __post_init__(self) -> None:
        self._attention = AttentionGrid(self.tables.attention)
        self._moe = None if self.tables.moe is None else MoeGrid(self.tables.moe)
        if self.shape.is_moe and self._moe is None:
            raise ValueError(f"{self.shape.name} is an MoE model but the profile has no moe.csv")
        t = self.tables
        self._layer, self._iter, self._seq = (
            _Row(tab.x.tolist(), tab.y.tolist(), tab.slope_above)
            for tab in (t.dense_layer, t.dense_iter, t.per_seq)
        )
        self._dense_layers = self.shape.num_layers - self.shape.num_moe_layers
        if self.shape.is_moe:
            # The MoE bundles profile attention-side ops only in dense.csv (the MLP is the
            # MoE block), so every layer charges dense_layer; MoE layers add the block.
            self._dense_layers = self.shape.num_layers

    def attention_time(
        self, prefill_chunks: Sequence[tuple[int, int]], decode_kv: Sequence[int]
    ) -> float:
        """Seconds of attention in one layer."""
        nd = len(decode_kv)
        kd = float(sum(decode_kv)) / nd if nd else 0.0
        chunks = sorted(((float(u), float(c)) for u, c in prefill_chunks if u > 0), reverse=True)
        if not chunks and nd == 0:
            return 0.0
        pc, kp = chunks[0] if chunks else (0.0, 0.0)
        t = self._attention(pc, kp, float(nd), kd)
        for u, c in chunks[1:]:
            t += max(self._attention(u, c, 0.0, 0.0) - self._attention.prefill_floor, 0.0)
        return t

    def moe_time(self, tokens: float, group_tokens: float | None = None) -> float:
        """Seconds of one MoE layer on the busiest rank (0 for a dense model)."""
        if self._moe is None or tokens <= 0:
            return 0.0
        k, e_total = self.shape.top_k, self.shape.num_experts
        ep, tp = self.parallel.ep, self.parallel.tp
        group = tokens * self.parallel.dp if group_tokens is None else group_tokens
        if ep > 1:
            local = group * (1.0 - (1.0 - 1.0 / ep) ** k) * self.parallel.expert_load_skew
            experts = e_total / ep * (1.0 - (1.0 - k / e_total) ** group)
            return self._moe(local, experts)
        experts = e_total * (1.0 - (1.0 - k / e_total) ** tokens)
        return (
            self._moe(tokens, experts) / tp
            if tp > 1 and self.tables.tp == 1
            else self._moe(tokens, experts)
        )

    def communication_time(self, tokens: float, group_tokens: float | None = None) -> float:
        p = self.parallel
        bw = p.link_gbps * 1e9
        out = 0.0
        if p.tp > 1:
            size = tokens * self.shape.hidden_size * self.shape.dtype_bytes
            one = p.link_latency_s + 2.0 * (p.tp - 1) / p.tp * size / bw
            out += (2 * self.shape.num_layers + 1) * one
        if p.ep > 1 and self.shape.is_moe:
            group = tokens * p.dp if group_tokens is None else group_tokens
            size = group * self.shape.hidden_size * self.shape.dtype_bytes
            one = p.link_latency_s + (p.ep - 1) / p.ep * size / bw
            out += 2 * self.shape.num_moe_layers * one
        return out

    def cost(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_kv: Sequence[int],
        group_tokens: float | None = None,
    ) -> IterationCost:
        """Seconds by component of an iteration of `prefill_chunks` [(t_uc, t_c), ...] and
        decodes over contexts `decode_kv`; `group_tokens` is the EP group's token count."""
        n_tok = float(sum(u for u, _ in prefill_chunks) + len(decode_kv))
        seqs = float(sum(1 for u, _ in prefill_chunks if u > 0) + len(decode_kv))
        if n_tok <= 0:
            return IterationCost(0.0, 0.0, 0.0, 0.0, 0.0)
        L = self.shape.num_layers
        dense = self._dense_layers * self._layer.at(n_tok) + self._iter.at(n_tok)
        attention = L * self.attention_time(prefill_chunks, decode_kv)
        moe = self.shape.num_moe_layers * self.moe_time(n_tok, group_tokens)
        comm = self.communication_time(n_tok, group_tokens)
        return IterationCost(dense, attention, moe, self._seq.at(seqs), comm)

    def time(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_kv: Sequence[int],
        group_tokens: float | None = None,
    ) -> float:
        """Seconds of one iteration (see `cost`)."""
        return self.cost(prefill_chunks, decode_kv, group_tokens).total

    def prefill_time(self, t_uc: int, t_c: int = 0) -> float:
        """One prefill chunk alone."""
        return self.time([(t_uc, t_c)], [])

    def decode_time(self, batch_size: int, ctx_tokens_each: int) -> float:
        """A decode batch of uniform context alone."""
        return self.time([], [ctx_tokens_each] * batch_size)
