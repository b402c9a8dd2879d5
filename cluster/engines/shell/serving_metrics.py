"""An engine's Prometheus `/metrics` under SGLang's or vLLM's metric names (SPEC §6).

Real engines export their load and request counters in Prometheus' text format, and
`pdlab attach` reads them from a fleet it does not run. `ServingMetrics` gives pdlab's
engines (the torch engine, the stand-in) the same exposition, with the names, types and
labels of the engine they speak for:

- "sglang" (`sglang/srt/metrics/collector.py`): gauges `sglang:num_running_reqs`,
  `sglang:num_queue_reqs`, `sglang:token_usage`; counters `sglang:num_requests_total`,
  `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
  `sglang:cached_tokens_total`; histograms `sglang:time_to_first_token_seconds`,
  `sglang:e2e_request_latency_seconds`; label `model_name`.
- "vllm" (`vllm/v1/metrics/loggers.py` PrometheusStatLogger): gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
  `vllm:cache_config_info` (block_size, num_gpu_blocks as labels, value 1); counters
  `vllm:request_success_total{finished_reason}`, `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total`,
  `vllm:prefix_cache_hits_total`; histograms `vllm:time_to_first_token_seconds`,
  `vllm:e2e_request_latency_seconds`; labels `model_name`, `engine`.

Gauges are read from the engine at scrape time (`load()`: running, waiting, KV use); the
counters and histograms count requests as their answers finish (`observe`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

MetricsStyle = Literal["sglang", "vllm"]
Load = tuple[int, int, float]  # (running, waiting, fraction of KV blocks in use)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Gauges(Collector):
    def __init__(self, owner: ServingMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        o = self.owner
        running, waiting, kv = o.load()
        names = (
            ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")
            if o.style == "sglang"
            else ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc")
        )  # fmt: skip
        docs = ("Running requests.", "Waiting requests.", "KV cache usage (1 = full).")
        for name, doc, value in zip(names, docs, (running, waiting, kv), strict=True):
            g = GaugeMetricFamily(name, doc, labels=list(o.labels))
            g.add_metric(list(o.labels.values()), float(value))
            yield g
        if o.style == "vllm":
            info = {"block_size": str(o.block_size), "num_gpu_blocks": str(o.num_gpu_blocks)}
            g = GaugeMetricFamily(
                "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                labels=list(info),
            )  # fmt: skip
            g.add_metric(list(info.values()), 1.0)
            yield g


class ServingMetrics:
    """One engine's exposition (module docstring); thread-safe."""

    def __init__(
        self,
        style: MetricsStyle,
        model: str,
        load: Callable[[], Load],
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 0,
    ) -> None:
        if style not in ("sglang", "vllm"):
            raise ValueError(f"metrics style must be sglang or vllm, got {style!r}")
        self.style: MetricsStyle = style
        self.load = load
        self.block_size, self.num_gpu_blocks = block_size, num_gpu_blocks
        self.labels = {"model_name": model} | ({"engine": "0"} if style == "vllm" else {})
        self.registry = CollectorRegistry()
        self.registry.register(_Gauges(self))
        self._lock = threading.Lock()
        p = "sglang:" if style == "sglang" else "vllm:"
        names = list(self.labels)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(p + name, doc, [*names, *extra], registry=self.registry)

        self.prompt = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation = counter("generation_tokens", "Number of generation tokens processed.")
        if style == "sglang":
            self.requests = counter("num_requests", "Number of requests processed.")
            self.cached = counter("cached_tokens", "Number of cached prompt tokens.")
        else:
            self.requests = counter(
                "request_success", "Count of successfully processed requests.", ("finished_reason",)
            )
            self.queries = counter("prefix_cache_queries", "Prefix cache queries (tokens).")
            self.cached = counter("prefix_cache_hits", "Prefix cache hits (tokens).")
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            names, registry=self.registry, buckets=TTFT_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            p + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            names, registry=self.registry, buckets=E2E_BUCKETS,
        )  # fmt: skip

    def observe(
        self, prompt: int, cached: int, output: int, ttft_s: float, e2e_s: float, reason: str
    ) -> None:
        """A request's answer finished (not aborted)."""
        lv = list(self.labels.values())
        with self._lock:
            self.prompt.labels(*lv).inc(prompt)
            self.generation.labels(*lv).inc(output)
            self.cached.labels(*lv).inc(cached)
            if self.style == "sglang":
                self.requests.labels(*lv).inc()
            else:
                self.requests.labels(*lv, reason).inc()
                self.queries.labels(*lv).inc(prompt)
            self.ttft.labels(*lv).observe(max(ttft_s, 0.0))
            self.e2e.labels(*lv).observe(max(e2e_s, 0.0))

    def render(self) -> bytes:
        with self._lock:
            return generate_latest(self.registry)
