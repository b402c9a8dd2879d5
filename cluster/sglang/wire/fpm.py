"""SGLang forward-pass metrics (FPM) -> prefill / decode iteration rows (paper 000 §5.1, Eq. 1–2).

Wire (verified in `sglang/srt/observability/forward_pass_metrics.py`, SGLang 0.5.23): with
`--enable-forward-pass-metrics` each scheduler rank binds a ZMQ PUB (IPC by default,
``{forward_pass_metrics_ipc_name}.{dp_rank}``) and sends [topic b"", seq (8-byte big-endian),
payload] per forward pass, where the payload is a msgpack *map* (plain msgspec Struct, not
array_like): ForwardPassMetrics{version, worker_id, dp_rank, counter_id, wall_time,
scheduled_requests{num_prefill_requests, sum_prefill_tokens, var_prefill_length,
sum_prefill_kv_tokens, num_decode_requests, sum_decode_kv_tokens, var_decode_kv_tokens},
queued_requests{num_prefill_requests, sum_prefill_tokens, var_prefill_length,
num_decode_requests, sum_decode_kv_tokens, var_decode_kv_tokens}}. An all-zero message with
wall_time 0 is an idle heartbeat. There is no timestamp: `wall_time` is the GPU span of the
pass in seconds, so the row's t_start is the receive time minus wall_time.

Field semantics (from `metrics_reporter._build_scheduled_request_metrics` and
`schedule_policy.PrefillAdder`): sum_prefill_tokens = Σ extend lengths = Σt_uc of the pass
(the chunk's new tokens); sum_prefill_kv_tokens = Σ prefix_lens = Σt_c (cached prefix plus
earlier chunks); var_prefill_length = population variance of the *full prompt lengths*
len(origin_input_ids), not of t_uc; sum_decode_kv_tokens = Σ seq_lens of decoding requests.

ΣA (Eq. 1) is not sent, so it is estimated from n, U = Σu_i, C = Σc_i and σ_L²:
ΣA = Σu_i c_i + Σu_i²/2 + U/2 with Σu_i c_i ≈ ū·C (no covariance between new and cached
lengths within a pass) and Σu_i² = n(σ_u² + ū²), where σ_u² is recovered from the reported
variance of the full prompt lengths L = u + c by assuming zero covariance and equal
coefficients of variation of u and c: σ_u² = σ_L²·ū²/(ū² + c̄²). A pass that used its chunk
budget (U ≥ 0.9·chunk_tokens, when the budget is known) may hold a request mid-chunk whose
prompt length says nothing about its chunk, so there σ_u² = 0. The estimate is clamped
into the exact bounds [U²/(2n) + U/2, U·C + U²/2 + U/2]. It is exact for a single request,
for passes without cache hits (c̄ = 0) and when u and c are each equal across requests;
tests/cluster/sglang/test_sglang_wire.py measures the error on synthetic passes: mean
6-14% (p95 16-26%) when lengths vary independently, 0.3% on chunk-limited passes. The naive
use of σ_L² as the variance of t_uc overestimates by n·Var(c)/2 (mean 50-340% there).

Mixed passes (prefill and decode requests in one forward, collocated mode) become one
prefill row: a decoding request is one new token over seq_len − 1 cached tokens, so it adds
1 to t_uc, seq_len − 1 to t_c and seq_len to ΣA. Decode rows use t_fwd = 1 (FPM carries no
speculative acceptance). iter_id is the collector's own per-node counter, not the
publisher's counter_id, which restarts with the engine.

pdlab's torch engine (`cluster.engines.torch`) knows each pass exactly and says so in one
extra map field, `pdlab` (`PassDetail`: attn_pairs ΣA, t_rst, and the distinct experts the
pass activated per MoE layer); SGLang's decoder ignores it as an unknown field. When it is
present, the rows take ΣA and t_rst from it instead of the estimate (and 0), the pass's
CPU overhead outside the forward (`overhead_s`), the forward's CPU time (`cpu_s`), and
`experts_active`, the mean over MoE layers, to compare with φ(B)·E (paper 000 Eq. 2).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec

from cluster.sglang.wire.kv_events import WireError

FPM_VERSION = 1


class ScheduledRequestMetrics(msgspec.Struct, frozen=True, gc=False):
    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class QueuedRequestMetrics(msgspec.Struct, frozen=True, gc=False):
    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class ForwardPassMetrics(msgspec.Struct, frozen=True, gc=False):
    """Same field names, order and defaults as SGLang's struct; unknown fields are ignored."""

    version: int = FPM_VERSION
    worker_id: str = ""
    dp_rank: int = 0
    counter_id: int = 0
    wall_time: float = 0.0
    scheduled_requests: ScheduledRequestMetrics = ScheduledRequestMetrics()
    queued_requests: QueuedRequestMetrics = QueuedRequestMetrics()

    @property
    def is_heartbeat(self) -> bool:
        s = self.scheduled_requests
        return self.wall_time <= 0.0 and s.num_prefill_requests == 0 and s.num_decode_requests == 0


class PassDetail(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """What an engine that knows its pass exactly adds (pdlab's torch engine).

    attn_pairs: ΣA over the pass's requests, a decoding request counting seq_len;
    t_rst: tokens restored from the host tier during the pass; experts_per_layer: distinct
    experts the pass's tokens were routed to, per MoE layer (absent for dense models);
    overhead_s: the engine loop's time around the pass outside the forward that wall_time
    spans (scheduling, bookkeeping, answers, publishing; 0 when not measured); cpu_s: the
    CPU time of the engine thread over wall_time's span (0 when not measured).
    """

    attn_pairs: float = 0.0
    t_rst: int = 0
    experts_per_layer: list[int] | None = None
    overhead_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def experts_active(self) -> float | None:
        """Mean distinct experts per MoE layer (None for a dense model)."""
        e = self.experts_per_layer
        return sum(e) / len(e) if e else None


class DetailedForwardPassMetrics(ForwardPassMetrics, frozen=True, gc=False):
    """ForwardPassMetrics plus the optional `pdlab` field (encoded after SGLang's fields)."""

    pdlab: PassDetail | None = None


MAX_COUNT = (1 << 63) - 1  # what a BIGINT column holds
_ENCODER = msgspec.msgpack.Encoder()
# Decodes SGLang's messages and the detailed ones alike (pdlab is None when absent).
_DECODER = msgspec.msgpack.Decoder(DetailedForwardPassMetrics)


def encode_fpm(metrics: ForwardPassMetrics) -> bytes:
    return _ENCODER.encode(metrics)


def decode_fpm(payload: bytes) -> ForwardPassMetrics:
    """Decode and check one message: times finite and >= 0, counts and variances >= 0."""
    try:
        m = _DECODER.decode(payload)
    except msgspec.DecodeError as e:
        raise WireError(f"forward-pass metrics payload is invalid: {e}") from None
    except RecursionError:  # msgpack nested deeper than the decoder's stack
        raise WireError("forward-pass metrics payload is nested too deeply") from None
    for name, value in (
        ("wall_time", m.wall_time),
        *(
            (f"scheduled_requests.{k}", v)
            for k, v in msgspec.structs.asdict(m.scheduled_requests).items()
        ),
    ):
        if not (math.isfinite(value) and 0 <= value <= MAX_COUNT):
            raise WireError(
                f"forward-pass metrics {name} is {value!r:.40}; allowed: a finite number in "
                f"[0, 2^63) (the telemetry columns are 64-bit)"
            )
    detail = getattr(m, "pdlab", None)
    if detail is not None:
        counts = [detail.t_rst, *(detail.experts_per_layer or ())]
        if not (math.isfinite(detail.attn_pairs) and all(0 <= c <= MAX_COUNT for c in counts)):
            raise WireError("forward-pass metrics pdlab detail holds a value outside [0, 2^63)")
    return m


def estimate_attn_pairs(
    num_reqs: int,
    sum_t_uc: float,
    sum_t_c: float,
    var_input_len: float,
    chunk_tokens: int | None = None,
) -> float:
    """ΣA of a prefill pass from FPM sums and the prompt-length variance (module docstring)."""
    if num_reqs <= 0 or sum_t_uc <= 0:
        return 0.0
    n, u, c = float(num_reqs), float(sum_t_uc), float(sum_t_c)
    u_mean, c_mean = u / n, c / n
    budget_full = chunk_tokens is not None and u >= 0.9 * chunk_tokens
    var_u = 0.0
    if not budget_full and var_input_len > 0:
        var_u = var_input_len * u_mean * u_mean / (u_mean * u_mean + c_mean * c_mean)
    est = u_mean * c + n * (var_u + u_mean * u_mean) / 2.0 + u / 2.0
    lower = u * u / (2.0 * n) + u / 2.0
    upper = u * c + u * u / 2.0 + u / 2.0
    return min(max(est, lower), upper)


class PrefillRow(NamedTuple):
    t_start: float
    duration_s: float
    num_reqs: int
    t_uc: int
    attn_pairs: float
    t_rst: int
    t_c: int
    experts_active: float | None = None
    overhead_s: float | None = None
    cpu_s: float | None = None


class DecodeRow(NamedTuple):
    t_start: float
    duration_s: float
    batch_size: int
    t_fwd: float
    ctx_tokens: int
    experts_active: float | None = None
    overhead_s: float | None = None
    cpu_s: float | None = None


def iteration_rows(
    m: ForwardPassMetrics, t_end: float, chunk_tokens: int | None = None
) -> tuple[PrefillRow | None, DecodeRow | None]:
    """The prefill or decode row of one forward pass that ended at `t_end` (run seconds).

    Heartbeats and passes without a positive wall_time give no rows.
    """
    if m.wall_time <= 0.0:
        return None, None
    s = m.scheduled_requests
    t_start = max(0.0, t_end - m.wall_time)
    n_p, n_d = s.num_prefill_requests, s.num_decode_requests
    detail = m.pdlab if isinstance(m, DetailedForwardPassMetrics) else None
    experts = None if detail is None else detail.experts_active
    overhead = None if detail is None or detail.overhead_s <= 0 else float(detail.overhead_s)
    cpu = None if detail is None or detail.cpu_s <= 0 else float(detail.cpu_s)
    if n_p > 0:
        if detail is not None:
            pairs, t_rst = float(detail.attn_pairs), int(detail.t_rst)
        else:
            pairs = estimate_attn_pairs(
                n_p,
                s.sum_prefill_tokens,
                s.sum_prefill_kv_tokens,
                s.var_prefill_length,
                chunk_tokens,
            )
            pairs, t_rst = pairs + s.sum_decode_kv_tokens, 0
        row = PrefillRow(
            t_start,
            m.wall_time,
            n_p + n_d,
            s.sum_prefill_tokens + n_d,
            pairs,
            t_rst,
            s.sum_prefill_kv_tokens + max(0, s.sum_decode_kv_tokens - n_d),
            experts,
            overhead,
            cpu,
        )
        return row, None
    if n_d > 0:
        return None, DecodeRow(
            t_start, m.wall_time, n_d, 1.0, s.sum_decode_kv_tokens, experts, overhead, cpu
        )
    return None, None
