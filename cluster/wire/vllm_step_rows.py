"""vLLM engine steps -> `prefill_iterations` / `decode_iterations` / `requests` rows (Eq. 1–2).

vLLM's stat loggers see each step's counts, not its batch (`vllm_steps` says what a step
message holds). `StepMapper` turns the stream of one engine's steps into the rows pdlab fits,
keeping a small ledger per engine of the prefill work the scheduler admitted and has not yet
finished. What is exact and what is estimated (docs/telemetry.md repeats it per column):

- Duration: the smallest inter-token latency of the step — the engine-core time between this
  step's outputs and the previous step's, for a request that decoded in both — so it is the
  whole step (schedule + forward + output), not the GPU time alone. A step without a
  decoding request takes the front end's interval since the previous step when the engine
  was busy then (it started this step at once), else the smallest TTFT of the step (an
  upper bound: it includes the request's time in the front end). Without any of these the
  step gives no row (counted in `untimed`).
- Prefill tokens t_uc: with `--cudagraph-metrics`, the step's scheduled tokens minus one per
  decoding request (exact without speculative decoding). Otherwise the ledger: a request
  enters with its uncached prompt (`prefix_cache_stats` queries - hits, at its first
  scheduling) and is consumed in chunks of at most the token budget less the decodes; when
  every admitted request has had its first token, what is left is consumed at once. A
  request vLLM looks up but cannot admit (no free KV blocks) is looked up, and counted,
  again the next step: the ledger then overstates pending work until it empties.
- t_c: the prefix hits of the step's new requests plus what earlier chunks of the running
  prefills computed (the ledger's context). ΣA is `iteration_rows.estimate_attn_pairs` over the
  prefilling requests (equal shares, no per-request lengths are reported).
- Decode: batch = decoding requests (ITL entries); t_fwd = their new tokens per request
  (> 1 with speculative decoding); ctx_tokens = KV blocks in use x block size less the
  prefilling context (shared prefix blocks count once), 0 when the capacity is unknown.
  Mixed steps (decodes beside a chunk) are prefill rows, each decode one token over its
  context, as the SGLang mapping does (`fpm.iteration_rows`).
- vLLM reports no per-request context lengths, no tokens restored from host memory (t_rst
  = 0) and no expert activations (experts_active NULL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from cluster.wire.iteration_rows import DecodeRow, PrefillRow, estimate_attn_pairs
from cluster.wire.vllm_steps import VLLMStep

DurationSource = str  # "itl" | "interval" | "ttft"


class RequestRow(NamedTuple):
    """A `requests` row of a finished request, on the run's clock (seconds)."""

    request_id: str
    node_id: int
    t_arrival: float
    t_in: int
    t_c: int
    t_out: int
    t_prefill_start: float | None
    t_first_token: float | None
    t_done: float

    def columns(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "program_id": self.request_id,
            "branch_id": self.request_id,
            "t_arrival": self.t_arrival,
            "prefill_node": self.node_id,
            "decode_node": self.node_id,
            "t_in": self.t_in,
            "t_c": self.t_c,
            "t_fetch": 0,
            "t_out": self.t_out,
            "t_prefill_start": self.t_prefill_start,
            "t_first_token": self.t_first_token,
            "t_done": self.t_done,
        }


class StepRows(NamedTuple):
    prefill: PrefillRow | None
    decode: DecodeRow | None
    requests: list[RequestRow]
    duration_source: DurationSource | None


@dataclass(slots=True)
class _Ledger:
    """Prefill work one engine admitted and has not finished (module docstring)."""

    tokens: int = 0  # uncached prompt tokens not yet computed
    reqs: int = 0  # admitted requests without their first token
    ctx: int = 0  # tokens their KV already holds (cached prefix + computed chunks)
    prev_t_end: float | None = None
    prev_busy: bool = False
    finished: int = 0


class StepMapper:
    """Rows of the steps of any number of engines (keyed by `VLLMStep.engine`).

    `node_of(engine)` names the node a DP rank writes as (default: node = engine index);
    `request_prefix` keeps request ids of several collectors apart.
    """

    def __init__(
        self,
        run_start_wall: float,
        *,
        node_of: dict[int, int] | None = None,
        max_interval_s: float = 30.0,
        request_prefix: str = "vllm",
    ) -> None:
        self.run_start_wall = run_start_wall
        self.node_of = dict(node_of or {})
        self.max_interval_s = max_interval_s
        self.request_prefix = request_prefix
        self.untimed = 0
        self.by_source: dict[str, int] = {}
        self._ledgers: dict[int, _Ledger] = {}

    def node(self, engine: int) -> int:
        return self.node_of.get(engine, engine)

    def rows(self, step: VLLMStep) -> StepRows:
        e = self._ledgers.setdefault(step.engine, _Ledger())
        t_end = max(0.0, step.t_wall - self.run_start_wall)
        n_dec, n_first = step.decoders, step.first_tokens
        cached_new = step.new_hits + step.resumed_hits
        e.tokens += max(step.new_queried - step.new_hits, 0)
        e.tokens += max(step.resumed_queried - step.resumed_hits, 0)
        e.reqs += step.new_reqs + step.resumed_reqs
        ctx_before = e.ctx + cached_new
        k = max(e.reqs, n_first)
        u = self._prefill_tokens(step, e, n_dec, n_first)
        if u == 0 and n_first > 0 and step.prompt_computed:
            u = step.prompt_computed  # joined late: the finished prompts' own count
        e.tokens = max(e.tokens - u, 0)
        e.ctx = max(ctx_before + u - step.prompt_total, 0)
        e.reqs = max(e.reqs - n_first, 0)
        if e.reqs == 0:
            e.tokens = e.ctx = 0
        ctx_dec = None
        if step.kv_capacity_tokens:
            kv_used = round(step.kv_usage * step.kv_capacity_tokens)
            ctx_dec = max(kv_used - (ctx_before + u), n_dec) if n_dec else 0
        duration, source = self._duration(step, e, t_end)
        e.prev_t_end, e.prev_busy = t_end, step.running + step.waiting > 0
        requests = self._requests(step, e, t_end)
        if duration is None:
            if u > 0 or n_dec > 0:
                self.untimed += 1
            return StepRows(None, None, requests, None)
        t_start = max(0.0, t_end - duration)
        prefill = decode = None
        if u > 0:
            k = max(k, 1)
            dec_ctx = ctx_dec or 0
            prefill = PrefillRow(
                t_start,
                duration,
                k + n_dec,
                u + n_dec,
                estimate_attn_pairs(k, u, ctx_before, 0.0) + dec_ctx,
                0,
                ctx_before + max(dec_ctx - n_dec, 0),
            )
        elif n_dec > 0:
            t_fwd = max((step.generation_tokens - n_first) / n_dec, 1.0)
            decode = DecodeRow(t_start, duration, n_dec, t_fwd, ctx_dec or 0)
        if prefill is not None or decode is not None:
            self.by_source[source] = self.by_source.get(source, 0) + 1
        return StepRows(prefill, decode, requests, source)

    def _prefill_tokens(self, step: VLLMStep, e: _Ledger, n_dec: int, n_first: int) -> int:
        if step.scheduled_tokens is not None and step.spec_tokens == 0:
            return max(step.scheduled_tokens - n_dec, 0)
        if e.reqs <= n_first:  # every admitted prefill produced its first token
            return e.tokens
        if step.budget_tokens:
            room = step.budget_tokens - n_dec * (1 + step.spec_tokens)
            return min(e.tokens, max(room, 0))
        return e.tokens

    def _duration(self, step: VLLMStep, e: _Ledger, t_end: float) -> tuple[float | None, str]:
        if step.itl_min_s is not None and step.itl_min_s > 0:
            return step.itl_min_s, "itl"
        if e.prev_busy and e.prev_t_end is not None:
            gap = t_end - e.prev_t_end
            if 0 < gap <= self.max_interval_s:
                return gap, "interval"
        if step.ttft_min_s is not None and step.ttft_min_s > 0:
            return step.ttft_min_s, "ttft"
        return None, ""

    def _requests(self, step: VLLMStep, e: _Ledger, t_end: float) -> list[RequestRow]:
        out = []
        node = self.node(step.engine)
        for f in step.finished:
            e.finished += 1
            first = None if f.decode_s is None else max(t_end - f.decode_s, 0.0)
            start = None if first is None or f.prefill_s is None else max(first - f.prefill_s, 0.0)
            arrival = max(t_end - f.e2e_s, 0.0)
            out.append(
                RequestRow(
                    f"{self.request_prefix}-e{step.engine}-{e.finished}",
                    node,
                    min(arrival, start if start is not None else arrival),
                    f.prompt_tokens,
                    min(f.cached_tokens, f.prompt_tokens),
                    f.generation_tokens,
                    start,
                    first,
                    t_end,
                )
            )
        return out
