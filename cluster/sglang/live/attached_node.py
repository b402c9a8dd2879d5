"""One engine of an attached fleet: its streams, its /metrics and what changed since (SPEC §6).

`AttachedNode` subscribes to what the engine publishes — KV events (SGLang's or vLLM's
format), SGLang's forward-pass metrics or pdlab's vLLM step stream — writing their rows
(`kv_events`, `prefill_iterations`, `decode_iterations`, `requests`) to the run and handing
events and passes upward through callbacks (run under the fleet's lock). It scrapes the
engine's Prometheus /metrics (`prom_scrape`): every sample becomes an `engine_metrics` row,
and the load (running, waiting, KV use) and the request counters' growth since the last
scrape (`Delta`) feed the shadow control plane.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx

from cluster.control.lock import ContendedRLock
from cluster.core import KVEvent, TelemetrySink
from cluster.sglang.live.engine_state import RestartAwareKVCollector
from cluster.sglang.live.fleet_file import AttachedEngine
from cluster.sglang.live.prom_scrape import EngineLoad, engine_load, parse_metrics
from cluster.sglang.wire.fpm import DecodeRow, ForwardPassMetrics, PrefillRow
from cluster.sglang.wire.fpm_collector import ForwardMetricsCollector
from cluster.sglang.wire.vllm_step_collector import StepEmitter, VLLMStepCollector
from cluster.sglang.wire.vllm_step_rows import StepRows
from cluster.sglang.wire.vllm_steps import VLLMStep

log = logging.getLogger(__name__)

OnPass = Callable[[int, float, PrefillRow | None, DecodeRow | None], None]


class Delta(NamedTuple):
    """Growth of an engine's counters between two scrapes."""

    requests: float
    prompt_tokens: float
    generation_tokens: float
    cached_tokens: float
    ttft_sum: float
    ttft_count: float
    e2e_sum: float
    e2e_count: float


_DELTA_FIELDS = ("requests", "prompt_tokens", "generation_tokens", "cached_tokens",
                 "ttft_sum", "ttft_count", "e2e_sum", "e2e_count")  # fmt: skip


class AttachedNode:
    """See module docstring. Mutable fields are changed under the fleet's lock."""

    def __init__(
        self,
        spec: AttachedEngine,
        lock: ContendedRLock,
        clock: Callable[[], float],
        *,
        sink: TelemetrySink | None,
        run_start_wall: float,
        catch_up: bool,
        on_kv_events: Callable[[list[KVEvent]], None],
        on_restart: Callable[[int], int],
        on_pass: OnPass,
    ) -> None:
        self.spec = spec
        self.node_id: int = spec.node_id or 0
        self.lock, self.clock, self.sink = lock, clock, sink
        self.run_start_wall, self.catch_up = run_start_wall, catch_up
        self.on_kv_events, self.on_restart, self.on_pass = on_kv_events, on_restart, on_pass
        self.up = True
        self.failures = 0
        self.last_error: str | None = None
        self.kv: RestartAwareKVCollector | None = None
        self.fpm: ForwardMetricsCollector | None = None
        self.steps: VLLMStepCollector | None = None
        self.load: EngineLoad | None = None
        self.scrape_error: str | None = None
        self.num_samples = 0
        self.stream_running = 0  # from the last pass / step
        self.stream_waiting = 0
        self.stream_t: float | None = None
        self.prefill_iterations = 0
        self.decode_iterations = 0
        self.decode_kv_tokens = 0
        self.fit: dict[str, Any] | None = None
        self.last_switch: dict[str, Any] | None = None
        self._counters: EngineLoad | None = None

    # ---- streams ----------------------------------------------------------------------------
    def start(self) -> None:
        s, n = self.spec, self.node_id
        if s.kv_events:
            kv = RestartAwareKVCollector(
                s.kv_events, on_restart=self._restarted, node_id=n, topic=s.kv_topic,
                replay_endpoint=s.kv_replay, callbacks=[self._kv_events], sink=self.sink,
                run_start_wall=self.run_start_wall, catch_up=self.catch_up,
            )  # fmt: skip
            kv.start()
            self.kv = kv
        if s.forward_metrics:
            self.fpm = ForwardMetricsCollector(
                s.forward_metrics, node_id=n, sink=self.sink, callbacks=[self._fpm_pass],
                run_start_wall=self.run_start_wall, chunk_tokens=s.chunk_tokens,
            ).start()  # fmt: skip
        if s.vllm_steps:
            emitter = StepEmitter(
                self.run_start_wall, self.sink, node_of={0: n}, callbacks=[self._step],
                request_prefix=f"vllm-n{n}",
            )  # fmt: skip
            self.steps = VLLMStepCollector(
                s.vllm_steps, emitter, replay_endpoint=s.vllm_steps_replay,
                catch_up=self.catch_up, name=f"pdlab-vllm-steps-{n}",
            ).start()  # fmt: skip

    def stop(self) -> None:
        for col in (self.kv, self.fpm, self.steps):
            if col is not None:
                col.stop()

    def _kv_events(self, events: list[KVEvent]) -> None:
        with self.lock:
            self.on_kv_events(events)

    def _restarted(self, node: int, last: int, seq: int) -> None:
        with self.lock:
            dropped = self.on_restart(node)
        log.warning("engine %d's KV publisher restarted (seq %d after %d): %d blocks dropped",
                    node, seq, last, dropped)  # fmt: skip

    def _passed(
        self, running: int, waiting: int, pre: PrefillRow | None, dec: DecodeRow | None
    ) -> None:
        with self.lock:
            now = self.clock()
            self.stream_t, self.stream_running, self.stream_waiting = now, running, waiting
            self.prefill_iterations += pre is not None
            self.decode_iterations += dec is not None
            if dec is not None:
                self.decode_kv_tokens = dec.ctx_tokens
            self.on_pass(self.node_id, now, pre, dec)

    def _fpm_pass(
        self, m: ForwardPassMetrics, pre: PrefillRow | None, dec: DecodeRow | None
    ) -> None:
        s, q = m.scheduled_requests, m.queued_requests
        self._passed(
            s.num_prefill_requests + s.num_decode_requests, q.num_prefill_requests, pre, dec
        )

    def _step(self, node: int, step: VLLMStep, rows: StepRows) -> None:
        self._passed(step.running, step.waiting, rows.prefill, rows.decode)

    # ---- health and /metrics (outside the lock) --------------------------------------------
    def check(self, client: httpx.Client) -> bool:
        """GET /health; True when it answered 200."""
        try:
            r = client.get(f"{self.spec.url.rstrip('/')}/health")
            ok, why = r.status_code == 200, f"/health answered {r.status_code}"
        except httpx.HTTPError as e:
            ok, why = False, f"/health failed: {type(e).__name__}: {e}"
        if not ok:
            self.last_error = why
        return ok

    def scrape(self, client: httpx.Client) -> Delta | None:
        """Read /metrics: write its samples, update the load; the counters' growth since the
        previous scrape (None on the first scrape, or when the engine exports none)."""
        url = self.spec.scrape_url
        if url is None:
            return None
        try:
            r = client.get(url)
            r.raise_for_status()
            samples = parse_metrics(r.text)
        except (httpx.HTTPError, ValueError) as e:
            self.scrape_error = f"{type(e).__name__}: {e}"
            return None
        self.scrape_error = None
        t = max(0.0, time.time() - self.run_start_wall)
        if self.sink is not None and samples:
            self.sink.emit("engine_metrics", {
                "t": [t] * len(samples), "node_id": [self.node_id] * len(samples),
                "metric": [s.name for s in samples],
                "labels": [json.dumps(s.labels, sort_keys=True) if s.labels else None for s in samples],
                "value": [s.value for s in samples],
            })  # fmt: skip
        self.num_samples += len(samples)
        load = engine_load(samples)
        prev, self._counters = self._counters, load
        with self.lock:
            self.load = load
        if prev is None or load.style is None:
            return None
        out = []
        for f in _DELTA_FIELDS:
            a, b = getattr(prev, f), getattr(load, f)
            # A counter that went down is an engine restart: count from zero again.
            out.append(0.0 if a is None or b is None else (b - a if b >= a else b))
        return Delta(*out)

    # ---- the node as the fleet shows it ------------------------------------------------------
    def running(self, now: float) -> int:
        if self.load is not None and self.load.running is not None:
            return int(self.load.running)
        fresh = self.stream_t is not None and now - self.stream_t < 2.0
        return self.stream_running if fresh else 0

    def waiting(self, now: float) -> int:
        if self.load is not None and self.load.waiting is not None:
            return int(self.load.waiting)
        fresh = self.stream_t is not None and now - self.stream_t < 2.0
        return self.stream_waiting if fresh else 0

    def kv_used_tokens(self) -> int:
        cap = self.spec.kv_capacity_tokens or 0
        if self.load is not None and self.load.kv_usage is not None and cap:
            return round(self.load.kv_usage * cap)
        return self.decode_kv_tokens

    def streams(self) -> dict[str, Any]:
        return {
            "kv": None if self.kv is None else self.kv.stats.as_dict(),
            "fpm": None if self.fpm is None else self.fpm.stats.as_dict(),
            "vllm_steps": None if self.steps is None else self.steps.stats.as_dict(),
            "metrics_samples": self.num_samples,
            "metrics_error": self.scrape_error,
        }
