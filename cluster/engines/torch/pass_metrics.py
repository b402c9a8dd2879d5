"""Forward-pass metrics of the torch engine in SGLang's wire format, with exact extras (SPEC §3, §6).

Each pass becomes one ForwardPassMetrics with SGLang's field semantics
(`cluster.sglang.fpm`: sum_prefill_tokens = Σt_uc, sum_prefill_kv_tokens = Σt_c,
var_prefill_length over the full prompt lengths, sum_decode_kv_tokens = Σ seq_len) plus
the `pdlab` detail only this engine can give: the exact ΣA of Eq. 1, t_rst, the
distinct experts per MoE layer, the pass's CPU overhead outside the forward and the CPU
time of the forward itself. An idle
engine sends SGLang's all-zero heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from cluster.sglang.fpm import (
    DetailedForwardPassMetrics,
    PassDetail,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)


class PrefillSlice(NamedTuple):
    """One request's part of a prefill pass."""

    t_uc: int
    t_c: int
    t_rst: int
    prompt_tokens: int


def prefill_metrics(
    worker_id: str,
    wall_s: float,
    slices: Sequence[PrefillSlice],
    attn_pairs: int,
    experts: Sequence[int],
    queued: QueuedRequestMetrics,
    overhead_s: float = 0.0,
    cpu_s: float = 0.0,
) -> DetailedForwardPassMetrics:
    sched = ScheduledRequestMetrics(
        num_prefill_requests=len(slices),
        sum_prefill_tokens=sum(s.t_uc for s in slices),
        var_prefill_length=_pvar([s.prompt_tokens for s in slices]),
        sum_prefill_kv_tokens=sum(s.t_c for s in slices),
    )
    detail = PassDetail(
        attn_pairs=float(attn_pairs),
        t_rst=sum(s.t_rst for s in slices),
        experts_per_layer=list(experts) or None,
        overhead_s=overhead_s,
        cpu_s=cpu_s,
    )
    return DetailedForwardPassMetrics(
        worker_id=worker_id,
        wall_time=wall_s,
        scheduled_requests=sched,
        queued_requests=queued,
        pdlab=detail,
    )


def decode_metrics(
    worker_id: str,
    wall_s: float,
    seq_lens: Sequence[int],
    experts: Sequence[int],
    queued: QueuedRequestMetrics,
    overhead_s: float = 0.0,
    cpu_s: float = 0.0,
) -> DetailedForwardPassMetrics:
    total = sum(seq_lens)
    sched = ScheduledRequestMetrics(
        num_decode_requests=len(seq_lens),
        sum_decode_kv_tokens=total,
        var_decode_kv_tokens=_pvar(seq_lens),
    )
    # A decoding request's one new token sees its seq_len - 1 cached tokens and itself.
    detail = PassDetail(
        attn_pairs=float(total),
        experts_per_layer=list(experts) or None,
        overhead_s=overhead_s,
        cpu_s=cpu_s,
    )
    return DetailedForwardPassMetrics(
        worker_id=worker_id,
        wall_time=wall_s,
        scheduled_requests=sched,
        queued_requests=queued,
        pdlab=detail,
    )


def queued_metrics(prompt_lengths: Sequence[int]) -> QueuedRequestMetrics:
    if not prompt_lengths:
        return QueuedRequestMetrics()
    return QueuedRequestMetrics(
        num_prefill_requests=len(prompt_lengths),
        sum_prefill_tokens=sum(prompt_lengths),
        var_prefill_length=_pvar(prompt_lengths),
    )


def _pvar(xs: Sequence[int]) -> float:
    """Population variance (numpy's var costs tens of microseconds on a few values)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean = sum(xs) / n
    return sum((x - mean) ** 2 for x in xs) / n
