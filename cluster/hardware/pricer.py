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
- MoE (App. B.3): `moe.csv` times one GPU holding every expert, each of its `tokens` routed
  to top-k of `activated_experts` experts: tokens x k expert-token pairs. Under EP over e
  ranks (vLLM's `allgather_reducescatter` backend: every rank gathers the EP group's T
  tokens, the DP ranks' together: `group_tokens`) one rank computes the pairs routed to its
  E/e experts, T*k/e of them times `expert_load_skew` (the busiest rank's pairs over the
  mean; 1 = balanced routing), so it is priced as the profile's T/e * skew tokens over the
  (E/e)*(1-(1-k/E)^T) = (E/e)*phi(T) distinct local experts the group's tokens touch.
  A table timed per EP rank (`OperatorTables.moe_kind` "per-ep-rank": AIConfigurator's MoE
  table, one rank of the deployment's MoE TP/EP by the T tokens entering the layer, its
  routing distribution and, under attention DP, the dispatch and combine included) is
  priced as it stands at T: no share, skew, TP split or expert exchange is added.
- memory floor (with `memory_gbps`): one layer's attention reads the KV of every decode's
  context and every chunk's (cached plus new tokens); it takes at least those bytes over the
  GPU's memory bandwidth.
- tables measured with `flash_attn_varlen_func` alone (`attention_kind` "fa2-varlen",
  cluster.hardware.layer_tables: a decode row's KV is the batch's total, no paging, no KV
  split, no mixed calls) price a call as vLLM runs it (cluster.hardware.attention_kernel):
  its prefill chunks from the prefill rows (held to their KV bytes); its decodes packed and
  split (a pure-decode call on FlashAttention 2 without a sliding window, or FlashAttention
  3) at the table's time of that many decodes of one key each (their launch cost) or their
  KV read once over the bandwidth, whichever is longer; unpacked (a mixed call, or a
  sliding-window model, on FlashAttention 2) at the table's time of that many decodes over
  their total KV (inside the KV it measured, not extrapolated) or their KV read `group`
  times over the bandwidth, whichever is longer; a mixed call is the two less one launch
  floor. Without a bandwidth the decodes are the table's time over their total KV.
- communication (no profile measures it): per TP all-reduce of N*hidden*dtype bytes, two
  per layer (after o_proj and the MLP/MoE) and one for the vocab-parallel embedding,
  latency + 2(t-1)/t * bytes / bandwidth; under EP per MoE layer a dispatch (all-gather of
  the group's hidden states and router logits, T*(hidden+E)*dtype bytes) and a combine
  (reduce-scatter of T*hidden*dtype bytes), latency + (e-1)/e * bytes / bandwidth each (a
  ring; none for a "per-ep-rank" MoE table, which includes it). `link_gbps` and
  `link_latency_s` come from the run's recorded interconnect, else they are assumptions
  (PCIe-class defaults), not measurements.

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
from cluster.hardware.attention_kernel import decode_kv_reads
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
    """The 4-D attention table: exact at measured points, linear per axis between them.

    A table without mixed calls (no row with both a prefill chunk and decodes, as the
    layers.csv layout measures them) prices a mixed call as its prefill call plus its
    decode call less one launch floor (vLLM's FlashAttention backend runs a mixed batch as
    one varlen call), each from its own grid.
    """

    def __init__(self, rows: np.ndarray) -> None:
        pre, dec = rows[:, 2] == 0, rows[:, 0] == 0
        self._split: tuple[AttentionGrid, AttentionGrid, float] | None = None
        if pre.any() and dec.any() and not (~pre & ~dec).any():
            self._split = (
                AttentionGrid(rows[pre]),
                AttentionGrid(rows[dec]),
                float(rows[:, 4].min()),
            )
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
        self.floor = float(rows[:, 4].min())  # the launch floor of any call
        # decode rows: the most KV measured per number of decodes (sorted by decodes)
        most: dict[float, float] = {}
        for _pc, _kp, nd, kd in self.points:
            if nd > 0:
                most[nd] = max(most.get(nd, 0.0), kd)
        self._most_kv = sorted(most.items())

    def decode_kv_measured(self, nd: float) -> float:
        """The most KV the table measured for `nd` decodes (the smaller of the two measured
        decode counts around `nd`; 0 without decode rows)."""
        if self._split is not None:
            return self._split[1].decode_kv_measured(nd)
        if not self._most_kv:
            return 0.0
        keys = [k for k, _ in self._most_kv]
        lo, hi, _t = _bracket(keys, nd)
        return min(self._most_kv[lo][1], self._most_kv[hi][1])

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
        if self._split is not None:
            pre, dec, floor = self._split
            if nd <= 0:
                return pre(pc, kp, 0.0, 0.0)
            if pc <= 0:
                return dec(0.0, 0.0, nd, kd)
            return max(pre(pc, kp, 0.0, 0.0) + dec(0.0, 0.0, nd, kd) - floor, 0.0)
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
    # GPU memory bandwidth, GB/s: attention never reads its KV faster (None: no floor)
    memory_gbps: float | None = None

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
        self._kv_layer_bytes = (
            self.shape.kv_bytes_per_token(self.parallel.tp) / self.shape.num_layers
        )
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
        if self.tables.attention_kind == "fa2-varlen":
            return self._varlen_attention(chunks, decode_kv)
        pc, kp = chunks[0] if chunks else (0.0, 0.0)
        t = self._attention(pc, kp, float(nd), kd)
        for u, c in chunks[1:]:
            t += max(self._attention(u, c, 0.0, 0.0) - self._attention.prefill_floor, 0.0)
        if self.memory_gbps:
            read = float(sum(decode_kv)) + sum(u + c for u, c in chunks)
            t = max(t, read * self._kv_layer_bytes / (self.memory_gbps * 1e9))
        return t

    def _read_s(self, tokens: float) -> float:
        """Seconds to read `tokens` tokens of one layer's KV at the memory bandwidth."""
        return tokens * self._kv_layer_bytes / (self.memory_gbps * 1e9) if self.memory_gbps else 0.0

    def _varlen_attention(
        self, chunks: list[tuple[float, float]], decode_kv: Sequence[int]
    ) -> float:
        """One layer's attention call from an "fa2-varlen" table (module docstring)."""
        grid = self._attention
        t = 0.0
        if chunks:
            pc, kp = chunks[0]
            t = grid(pc, kp, 0.0, 0.0)
            for u, c in chunks[1:]:
                t += max(grid(u, c, 0.0, 0.0) - grid.prefill_floor, 0.0)
            t = max(t, self._read_s(sum(u + c for u, c in chunks)))
        if not decode_kv:
            return t
        nd, total = float(len(decode_kv)), float(sum(decode_kv))
        mixed = any(u > 1 for u, _ in chunks)  # vLLM's max_seqlen_q > 1
        reads = decode_kv_reads(self.shape, self.parallel.tp, self.tables.fa_version, mixed)
        if not self.memory_gbps:
            dec = grid(0.0, 0.0, nd, total)  # no bandwidth: the measured kernel as is
        elif reads > 1.0:
            # the table as a lower bound inside what it measured (never extrapolated)
            inside = min(total, grid.decode_kv_measured(nd))
            dec = max(grid(0.0, 0.0, nd, inside), self._read_s(reads * total))
        else:
            # launch cost: that many decodes of one token each
            dec = max(grid(0.0, 0.0, nd, nd), self._read_s(total))
        if not chunks:
            return dec
        return max(t + dec - grid.floor, 0.0)

    def moe_time(self, tokens: float, group_tokens: float | None = None) -> float:
        """Seconds of one MoE layer on the busiest rank (0 for a dense model)."""
        if self._moe is None or not self.shape.is_moe or tokens <= 0:
            return 0.0
        k, e_total = self.shape.top_k, self.shape.num_experts
        ep, tp = self.parallel.ep, self.parallel.tp
        group = tokens * self.parallel.dp if group_tokens is None else group_tokens
        if self.tables.moe_kind == "per-ep-rank":
            # already one rank's time at the deployment's MoE TP/EP for the group's tokens
            return self._moe(group, e_total / max(ep, 1))
        if ep > 1:
            # pairs on the busiest rank / k: the profile's tokens of the same GEMM work
            local = group / ep * self.parallel.expert_load_skew
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
            out += self.shape.num_moe_layers * self.expert_exchange_time(
                tokens * p.dp if group_tokens is None else group_tokens
            )
        return out

    def expert_exchange_time(self, group_tokens: float) -> float:
        """Seconds of one MoE layer's dispatch and combine over the EP group (module doc)."""
        p, s = self.parallel, self.shape
        if p.ep <= 1 or not s.is_moe or group_tokens <= 0 or self.tables.moe_kind == "per-ep-rank":
            return 0.0  # a per-EP-rank MoE table includes its dispatch and combine
        share = (p.ep - 1) / p.ep / (p.link_gbps * 1e9)
        dispatch = group_tokens * (s.hidden_size + s.num_experts) * s.dtype_bytes
        combine = group_tokens * s.hidden_size * s.dtype_bytes
        return 2 * p.link_latency_s + (dispatch + combine) * share

    def cost(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        decode_kv: Sequence[int],
        group_tokens: float | None = None,
        padded_tokens: float | None = None,
    ) -> IterationCost:
        """Seconds by component of an iteration of `prefill_chunks` [(t_uc, t_c), ...] and
        decodes over contexts `decode_kv`; `group_tokens` is the EP group's token count,
        `padded_tokens` the tokens the dense operators run over when a DP rank's batch is
        padded to the group's largest (vLLM's DP padding under CUDA graphs)."""
        n_tok = float(sum(u for u, _ in prefill_chunks) + len(decode_kv))
        seqs = float(sum(1 for u, _ in prefill_chunks if u > 0) + len(decode_kv))
        if n_tok <= 0:
            return IterationCost(0.0, 0.0, 0.0, 0.0, 0.0)
        n_dense = n_tok if padded_tokens is None else max(n_tok, padded_tokens)
        L = self.shape.num_layers
        dense = self._dense_layers * self._layer.at(n_dense) + self._iter.at(n_dense)
        attention = L * self.attention_time(prefill_chunks, decode_kv)
        moe = self.shape.num_moe_layers * self.moe_time(n_tok, group_tokens)
        comm = self.communication_time(n_dense, group_tokens)
        return IterationCost(dense, attention, moe, self._seq.at(seqs), comm)

    def dummy_cost(
        self, group_tokens: float | None = None, padded_tokens: float | None = None
    ) -> IterationCost:
        """An idle DP rank's dummy pass (vLLM's `execute_dummy_batch`: `_dummy_run(1,
        uniform_decode=True, force_attention=True)`, a one-token decode that samples
        nothing): the dense operators, one decode's attention and the MoE block of one
        token (or `padded_tokens`) in every layer and the collectives of the EP group's
        tokens; no lm_head, no sampler."""
        n = 1.0 if padded_tokens is None else max(1.0, padded_tokens)
        dense = self._dense_layers * self._layer.at(n) + self._iter.at(n)
        attention = self.shape.num_layers * self.attention_time([], [1])
        moe = self.shape.num_moe_layers * self.moe_time(1.0, group_tokens)
        comm = self.communication_time(n, group_tokens)
        return IterationCost(dense, attention, moe, 0.0, comm)

    def outside_layers_time(self, tokens: float, sequences: float) -> float:
        """Seconds of an iteration outside its decoder layers (embedding, final norm,
        lm_head, sampler): the part after a DP group's last MoE layer (`cost` includes it);
        with no sequences (a dummy pass) no lm_head or sampler runs."""
        if tokens <= 0:
            return 0.0
        return self._iter.at(tokens) + (self._seq.at(sequences) if sequences > 0 else 0.0)

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
