"""An engine's Prometheus /metrics, read: its load and request counters (SPEC §6).

`parse_metrics` reads the text exposition with prometheus_client's parser into samples
(histogram buckets and `_created` timestamps dropped: they are not gauges of the engine);
`engine_load` sums the samples pdlab uses over their label sets, under SGLang's names
(`sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
`sglang:num_requests_total`, `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
`sglang:cached_tokens_total`) or vLLM's (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0.8: `vllm:gpu_cache_usage_perc`),
`vllm:request_success_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:prefix_cache_hits_total`, `vllm:cache_config_info`), and the `_sum` / `_count` of
both engines' `time_to_first_token_seconds` and `e2e_request_latency_seconds` histograms.
KV use of several DP ranks is their mean.
"""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class EngineLoad(NamedTuple):
    """What an engine's /metrics says (None: the engine does not export it)."""

    style: str | None  # "sglang" | "vllm" | None
    running: float | None
    waiting: float | None
    kv_usage: float | None
    requests: float | None  # counters since the engine started
    prompt_tokens: float | None
    generation_tokens: float | None
    cached_tokens: float | None
    block_size: int | None
    num_gpu_blocks: int | None
    ttft_sum: float | None = None  # TTFT and E2E histograms' _sum and _count
    ttft_count: float | None = None
    e2e_sum: float | None = None
    e2e_count: float | None = None


_NAMES = {
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
               "sglang:num_requests_total", "sglang:prompt_tokens_total",
               "sglang:generation_tokens_total", "sglang:cached_tokens_total"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:request_success_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total"),
}  # fmt: skip


def parse_metrics(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (ValueError if it is not one)."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


def engine_load(samples: list[Sample]) -> EngineLoad:
    """The load and counters of one engine (module docstring)."""
    by: dict[str, list[float]] = {}
    info: dict[str, str] = {}
    for s in samples:
        by.setdefault(s.name, []).append(s.value)
        if s.name == "vllm:cache_config_info":
            info = s.labels
    style = next((k for k in ("vllm", "sglang") if any(n.startswith(f"{k}:") for n in by)), None)
    if style is None:
        return EngineLoad(None, *([None] * 13))
    names = _NAMES[style]

    def total(name: str) -> float | None:
        v = by.get(name)
        return None if v is None else float(sum(v))

    kv = by.get(names[2]) or (by.get("vllm:gpu_cache_usage_perc") if style == "vllm" else None)
    return EngineLoad(
        style,
        total(names[0]),
        total(names[1]),
        None if not kv else sum(kv) / len(kv),
        total(names[3]),
        total(names[4]),
        total(names[5]),
        total(names[6]),
        _int(info.get("block_size")),
        _int(info.get("num_gpu_blocks")),
        total(f"{style}:time_to_first_token_seconds_sum"),
        total(f"{style}:time_to_first_token_seconds_count"),
        total(f"{style}:e2e_request_latency_seconds_sum"),
        total(f"{style}:e2e_request_latency_seconds_count"),
    )


def _int(v: str | None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "", "None") else None
    except ValueError:
        return None
