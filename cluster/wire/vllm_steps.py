"""One vLLM engine step as pdlab's stat-logger plugin publishes it (paper 000 §5.1 inputs).

vLLM V1 calls every stat logger's `record(scheduler_stats, iteration_stats, mm_cache_stats,
engine_idx)` once per batch of engine-core outputs, i.e. once per engine step
(`vllm/v1/engine/async_llm.py` output handler; `vllm/v1/metrics/loggers.py`
`StatLoggerBase`). `step_from_stats` copies what those objects say about the step into a
`VLLMStep` — a small msgpack map that crosses ZMQ (`[topic, seq, payload]`, the framing of
`wire.publisher`) or goes straight to `vllm_step_rows.StepMapper`. What it reads
(`vllm/v1/metrics/stats.py`, field names of the releases since V1; older spellings are
read too):

- `SchedulerStats`: `num_running_reqs`, `num_waiting_reqs`, `kv_cache_usage` (0.8-era
  `gpu_cache_usage`), `prefix_cache_stats` (`requests`, `queries`, `hits` of the requests
  whose prefix the scheduler looked up this step — new requests — and `preempted_*` for
  resumed ones; tokens), `cudagraph_stats.num_unpadded_tokens` (tokens scheduled in the step,
  only with `--cudagraph-metrics`).
- `IterationStats`: `iteration_timestamp` (wall time the front end processed the step),
  `num_generation_tokens`, `prompt_token_stats` (`total`, `computed`, `cached_tokens` of the
  requests whose prefill finished this step; older releases: `num_prompt_tokens` only),
  `time_to_first_tokens_iter` (their TTFTs), `inter_token_latencies_iter` (one per decoding
  request: engine-core time since its previous token), `num_preempted_reqs`,
  `finished_requests` (`FinishedRequestStats`: prompt, generation and cached tokens, E2E,
  queued / prefill / decode time, under `timing` since 0.11).

Each attribute is read with a default, so a field a release lacks reads as "not reported"
(None or 0), never as an error. The engine settings that size a step — the token budget
`max_num_batched_tokens` and the KV capacity `num_gpu_blocks * block_size` — ride along
in every message (a subscriber may join late).
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from cluster.wire.kv_events import WireError

STEPS_TOPIC = "pdlab.vllm.steps"
STEP_VERSION = 1


class FinishedRequest(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One request that finished in the step (vLLM's `FinishedRequestStats`)."""

    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    e2e_s: float
    queued_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None


class VLLMStep(msgspec.Struct, omit_defaults=True, frozen=True, gc=False):
    """What one vLLM engine step reported (module docstring); tokens unless named `_s`."""

    version: int = STEP_VERSION
    engine: int = 0  # engine_idx: the DP rank the step ran on
    t_wall: float = 0.0  # Unix seconds when the front end processed the step's outputs
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of the GPU KV blocks in use after the step
    new_reqs: int = 0  # prefix lookups of new requests this step (prefix_cache_stats)
    new_queried: int = 0
    new_hits: int = 0
    resumed_reqs: int = 0  # ... of preempted requests scheduled again
    resumed_queried: int = 0
    resumed_hits: int = 0
    generation_tokens: int = 0
    prompt_total: int = 0  # prompts whose prefill finished this step
    prompt_computed: int | None = None
    prompt_cached: int | None = None
    first_tokens: int = 0  # len(time_to_first_tokens_iter)
    ttft_min_s: float | None = None
    decoders: int = 0  # len(inter_token_latencies_iter)
    itl_min_s: float | None = None
    preempted: int = 0
    scheduled_tokens: int | None = None  # cudagraph_stats.num_unpadded_tokens
    finished: list[FinishedRequest] = []
    budget_tokens: int | None = None  # scheduler_config.max_num_batched_tokens
    kv_capacity_tokens: int | None = None  # num_gpu_blocks * block_size
    spec_tokens: int = 0  # num_speculative_tokens (0: no speculative decoding)


def _num(obj: Any, name: str, default: Any = 0) -> Any:
    v = getattr(obj, name, default) if obj is not None else default
    return default if v is None else v


def _finished(f: Any) -> FinishedRequest:
    timing = getattr(f, "timing", None)
    src = timing if timing is not None else f
    return FinishedRequest(
        prompt_tokens=int(_num(f, "num_prompt_tokens")),
        generation_tokens=int(_num(f, "num_generation_tokens")),
        cached_tokens=int(_num(f, "num_cached_tokens")),
        e2e_s=float(_num(f, "e2e_latency", 0.0)),
        queued_s=_opt_float(getattr(src, "queued_time", None)),
        prefill_s=_opt_float(getattr(src, "prefill_time", None)),
        decode_s=_opt_float(getattr(src, "decode_time", None)),
    )


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def step_from_stats(
    scheduler_stats: Any,
    iteration_stats: Any,
    engine_idx: int = 0,
    *,
    budget_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    spec_tokens: int = 0,
    now: float | None = None,
) -> VLLMStep:
    """Copy one `record(...)` call's stats into a `VLLMStep` (module docstring)."""
    s, it = scheduler_stats, iteration_stats
    pcs = getattr(s, "prefix_cache_stats", None)
    pts = getattr(it, "prompt_token_stats", None)
    cg = getattr(s, "cudagraph_stats", None)
    ttfts = list(_num(it, "time_to_first_tokens_iter", []))
    itls = list(_num(it, "inter_token_latencies_iter", []))
    if not itls:  # 0.8-era name of the same list
        itls = list(_num(it, "time_per_output_tokens_iter", []))
    if pts is not None:
        prompt_total = int(_num(pts, "total"))
        computed: int | None = int(_num(pts, "computed"))
        cached: int | None = int(_num(pts, "cached_tokens"))
    else:
        prompt_total, computed, cached = int(_num(it, "num_prompt_tokens")), None, None
    kv = getattr(s, "kv_cache_usage", None)
    if kv is None:
        kv = _num(s, "gpu_cache_usage", 0.0)
    t_wall = getattr(it, "iteration_timestamp", None)
    return VLLMStep(
        engine=int(engine_idx),
        t_wall=float(t_wall if t_wall is not None else (time.time() if now is None else now)),
        running=int(_num(s, "num_running_reqs")),
        waiting=int(_num(s, "num_waiting_reqs")),
        kv_usage=float(kv),
        new_reqs=int(_num(pcs, "requests")),
        new_queried=int(_num(pcs, "queries")),
        new_hits=int(_num(pcs, "hits")),
        resumed_reqs=int(_num(pcs, "preempted_requests")),
        resumed_queried=int(_num(pcs, "preempted_queries")),
        resumed_hits=int(_num(pcs, "preempted_hits")),
        generation_tokens=int(_num(it, "num_generation_tokens")),
        prompt_total=prompt_total,
        prompt_computed=computed,
        prompt_cached=cached,
        first_tokens=len(ttfts),
        ttft_min_s=float(min(ttfts)) if ttfts else None,
        decoders=len(itls),
        itl_min_s=float(min(itls)) if itls else None,
        preempted=int(_num(it, "num_preempted_reqs")),
        scheduled_tokens=None if cg is None else int(_num(cg, "num_unpadded_tokens")),
        finished=[_finished(f) for f in _num(it, "finished_requests", [])],
        budget_tokens=budget_tokens,
        kv_capacity_tokens=kv_capacity_tokens,
        spec_tokens=spec_tokens,
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(VLLMStep)


def encode_step(step: VLLMStep) -> bytes:
    return _ENCODER.encode(step)


def decode_step(payload: bytes) -> VLLMStep:
    """Decode and check one step message: counts >= 0, times finite and >= 0."""
    try:
        s = _DECODER.decode(payload)
    except msgspec.DecodeError as e:
        raise WireError(f"vLLM step payload is invalid: {e}") from None
    if s.version != STEP_VERSION:
        raise WireError(f"vLLM step message version {s.version}; this pdlab reads {STEP_VERSION}")
    for name in msgspec.structs.fields(VLLMStep):
        v = getattr(s, name.name)
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if number and not (math.isfinite(v) and v >= 0):
            raise WireError(f"vLLM step {name.name} is {v!r}; allowed: a finite number >= 0")
    if not s.kv_usage <= 1.0 + 1e-9:
        raise WireError(f"vLLM step kv_usage is {s.kv_usage!r}; allowed: a fraction in [0, 1]")
    return s
