"""The SGLang stand-in's scheduler: simulated forward passes with Eq. 1–2 timing (paper 000 §5.1).

One thread runs SGLang's loop shape: prefill first (FCFS, chunked to `chunk_tokens` per
pass, prefix-cache hits skipped), otherwise one decode pass over every running request.
A pass lasts the time the iteration-time models give (`PrefillModel.batch_time`,
`DecodeModel.iteration_time`) times `time_scale`. After each pass the scheduler publishes
the prefix cache's KV events (`KVEventBatch`, ts = wall time) and one ForwardPassMetrics
with SGLang's field semantics (`cluster.sglang.fpm`), and an idle heartbeat every second
while idle. Roles: "null" (prefill then decode here), "prefill" (stop after the first
token, hand the room to the bootstrap registry), "decode" (start from the first token the
prefill produced; no prefix cache, as SGLang's decode without
--disaggregation-decode-enable-radix-cache).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cluster.engines.shell.scheduling import (
    Finish,
    Heartbeat,
    OnUpdate,
    Role,
    SchedulerThread,
    abort,
    check_role,
    prefill_chunks,
    publish_fpm,
    publish_kv_events,
)
from cluster.engines.shell.stamps import DECODE_JOIN, FORWARD, PREFILL_DONE, Stamps, stamp
from cluster.engines.standin.bootstrap import RoomRegistry, RoomResult
from cluster.engines.standin.prefix_cache import PrefixCache
from cluster.sglang.fpm import (
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)
from cluster.wire import toy_tokenizer
from cluster.wire.kv_events import WireFormat
from cluster.wire.publisher import ZmqBatchPublisher
from models import DecodeModel, PrefillModel

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StandinRequest:
    """One request inside the stand-in (prompt tokens, budget, progress, callbacks)."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    on_update: OnUpdate
    bootstrap_room: int | None = None
    first_token_id: int | None = None  # decode role: produced by the prefill server
    output_ids: list[int] = field(default_factory=list)
    prefix_len: int = 0
    cached_tokens: int = 0
    locked: list[int] = field(default_factory=list)
    reserved_pages: int = 0
    admitted: bool = False
    stamps: Stamps = field(default_factory=dict)  # stage times (cluster.engines.shell.stamps)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)


# A small fast profile (ms-scale passes) so tests and demos run quickly; pass a fitted
# node's models to pace the stand-in like real hardware.
FAST_PREFILL = PrefillModel(1e-3, 2e-6, 1e-10, 0.0)
FAST_DECODE = DecodeModel(1e-3, 5e-4, 2e-5, top_k=8, num_experts=64)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Stand-in engine shape: pages, budgets and the iteration-time models that pace it."""

    page_size: int = 16
    capacity_pages: int = 8192
    chunk_tokens: int = 8192
    max_running: int = 256
    prefill_model: PrefillModel = FAST_PREFILL
    decode_model: DecodeModel = FAST_DECODE
    time_scale: float = 1.0
    decode_radix_cache: bool = False
    worker_id: str = ""
    kv_wire_format: WireFormat = "sglang"  # "vllm": the vLLM stand-in's KV events


class StandinScheduler(SchedulerThread[StandinRequest]):
    """Owns the prefix cache and request queues; all mutation happens on its thread."""

    def __init__(
        self,
        config: SchedulerConfig,
        role: Role,
        *,
        kv_publisher: ZmqBatchPublisher | None,
        fpm_publisher: ZmqBatchPublisher | None,
        rooms: RoomRegistry,
    ) -> None:
        super().__init__(name="standin-scheduler")
        self.config = config
        self.role: Role = check_role(role)
        self.cache = PrefixCache(config.page_size, config.capacity_pages)
        self.kv_publisher = kv_publisher
        self.fpm_publisher = fpm_publisher
        self.rooms = rooms
        self._heartbeat = Heartbeat(fpm_publisher, config.worker_id)
        self._batch: list[tuple[StandinRequest, int, int]] = []

    # --- API (any thread) ------------------------------------------------------------------

    def run_exclusive(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the scheduler's state while no pass is in progress."""
        with self._cond:
            out = fn()
            self._publish_kv_events()
            return out

    # --- loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                self._take_inbox()
                for req, finish in self._take_aborts():
                    self._drop(req, finish)
                if not self.waiting and not self.running:
                    self._heartbeat.beat()
                    self._cond.wait(0.2)
                    continue
                duration, sched = self._prefill_pass()
                if not sched.num_prefill_requests and self.running:
                    duration, sched = self._decode_pass()
            if duration > 0:
                self._stop.wait(duration * self.config.time_scale)
            with self._cond:
                self._finish_pass(duration, sched)
                if duration <= 0 and self.waiting and not self.running:
                    self._cond.wait(0.01)  # nothing admissible yet: do not spin

    # --- passes (called under the lock) ----------------------------------------------------

    def _admit(self, req: StandinRequest, now: float) -> bool:
        """Match the prefix, reserve pages (evicting if needed); False if it must wait."""
        ps = self.config.page_size
        use_cache = self.role != "decode" or self.config.decode_radix_cache
        matched = self.cache.match(req.input_ids[:-1], now) if use_cache else []
        need = -(-(len(req.input_ids) + req.max_new_tokens) // ps) - len(matched)
        if need > self.cache.free_pages:
            self.cache.lock(matched, +1)  # keep the hit while evicting others
            self.cache.evict(need - self.cache.free_pages)
            self.cache.lock(matched, -1)
        if need > self.cache.free_pages:
            if not self.running and not any(r.admitted for r in self.waiting):
                req.on_update(
                    [],
                    abort(
                        f"request needs {need} KV pages, cache has {self.cache.capacity_pages}", 400
                    ),
                )
                self.waiting.remove(req)
            return False
        self.cache.lock(matched, +1)
        req.locked = matched
        req.prefix_len = req.cached_tokens = len(matched) * ps
        req.reserved_pages = need
        self.cache.reserved_pages += need
        req.admitted = True
        return True

    def _prefill_pass(self) -> tuple[float, ScheduledRequestMetrics]:
        now = time.monotonic()
        chunks = prefill_chunks(
            self.waiting,
            len(self.running),
            budget_tokens=self.config.chunk_tokens,
            max_running=self.config.max_running,
            admit=lambda req: self._admit(req, now),
            # decode role: the first token arrived from prefill, no prefill pass here
            computed=lambda req: None if req.first_token_id is not None else req.prefix_len,
        )
        batch = [(req, extend, req.prefix_len) for req, extend in chunks]  # (req, t_uc, t_c)
        self._batch = batch
        if not batch:
            return 0.0, ScheduledRequestMetrics()
        started = time.time()
        for req, _, _ in batch:
            stamp(req.stamps, FORWARD, started)
        t_uc = [b[1] for b in batch]
        t_c = [b[2] for b in batch]
        duration = self.config.prefill_model.batch_time(t_uc, t_c)
        lengths = np.array([len(b[0].input_ids) for b in batch], dtype=np.float64)
        sched = ScheduledRequestMetrics(
            num_prefill_requests=len(batch),
            sum_prefill_tokens=int(sum(t_uc)),
            var_prefill_length=float(lengths.var()),
            sum_prefill_kv_tokens=int(sum(t_c)),
        )
        return duration, sched

    def _decode_pass(self) -> tuple[float, ScheduledRequestMetrics]:
        self._batch = []
        batch = self.running
        duration = self.config.decode_model.iteration_time(len(batch))
        seqlens = np.array([r.seq_len + 1 for r in batch], dtype=np.float64)
        sched = ScheduledRequestMetrics(
            num_decode_requests=len(batch),
            sum_decode_kv_tokens=int(seqlens.sum()),
            var_decode_kv_tokens=float(seqlens.var()),
        )
        return duration, sched

    def _finish_pass(self, duration: float, sched: ScheduledRequestMetrics) -> None:
        now = time.monotonic()
        if sched.num_prefill_requests:
            for req, extend, _ in self._batch:
                req.prefix_len += extend
                if self.role != "decode" or self.config.decode_radix_cache:
                    self._cache_tokens(req, req.input_ids[: req.prefix_len], now)
                if req.prefix_len >= len(req.input_ids):
                    stamp(req.stamps, PREFILL_DONE)
                    self.waiting.remove(req)
                    req.output_ids.append(toy_tokenizer.next_token(req.input_ids))
                    self._after_first_token(req, now)
        elif sched.num_decode_requests:
            for req in list(self.running):
                req.output_ids.append(toy_tokenizer.next_token(req.input_ids + req.output_ids))
                self._progress(req, now)
        # Decode role: requests whose KV arrived join the running batch without a prefill pass.
        for req in [r for r in self.waiting if r.admitted and r.first_token_id is not None]:
            self.waiting.remove(req)
            req.output_ids.append(req.first_token_id)  # type: ignore[arg-type]
            req.prefix_len = len(req.input_ids)
            stamp(req.stamps, DECODE_JOIN)
            self._after_first_token(req, now)
        if duration > 0:
            self.num_passes += 1
            self._heartbeat.was_busy = True
            queued = self._queued_metrics()
            publish_fpm(
                self.fpm_publisher,
                ForwardPassMetrics(
                    worker_id=self.config.worker_id,
                    wall_time=duration,
                    scheduled_requests=sched,
                    queued_requests=queued,
                ),
            )
        self._publish_kv_events()

    def _after_first_token(self, req: StandinRequest, now: float) -> None:
        if self.role == "prefill":
            if req.bootstrap_room is not None:
                result = RoomResult(req.bootstrap_room, len(req.input_ids), req.output_ids[0])
                self.rooms.finish(req.bootstrap_room, result)
            self._release(req, now, {"type": "length", "length": 1})
            return
        self.running.append(req)
        self._progress(req, now)

    def _progress(self, req: StandinRequest, now: float) -> None:
        if len(req.output_ids) >= req.max_new_tokens:
            self.running.remove(req)
            if self.role == "null" or self.config.decode_radix_cache:
                # SGLang caches a finished request's prompt + output (minus the last token).
                self._cache_tokens(req, (req.input_ids + req.output_ids)[:-1], now)
            self._release(req, now, {"type": "length", "length": len(req.output_ids)})
        else:
            req.on_update(list(req.output_ids), None)

    def _cache_tokens(self, req: StandinRequest, tokens: list[int], now: float) -> None:
        before = self.cache.num_pages
        hashes = self.cache.insert(tokens, now)
        created = self.cache.num_pages - before
        give = min(created, req.reserved_pages)
        req.reserved_pages -= give
        self.cache.reserved_pages -= give
        new = hashes[len(req.locked) :]
        self.cache.lock(new, +1)
        req.locked = hashes

    def _release(self, req: StandinRequest, now: float, finish: Finish) -> None:
        self.cache.lock(req.locked, -1)
        req.locked = []
        self.cache.reserved_pages -= req.reserved_pages
        req.reserved_pages = 0
        req.on_update(list(req.output_ids), finish)

    def _drop(self, req: StandinRequest, finish: Finish) -> None:
        """An aborted request leaves its queue (under the lock, between passes); its locked
        pages and reservation go back."""
        if self._dequeue(req):
            self._release(req, time.monotonic(), finish)

    def _queued_metrics(self) -> QueuedRequestMetrics:
        waiting = [r for r in self.waiting if r.first_token_id is None]
        if not waiting:
            return QueuedRequestMetrics()
        lengths = np.array([len(r.input_ids) for r in waiting], dtype=np.float64)
        return QueuedRequestMetrics(
            num_prefill_requests=len(waiting),
            sum_prefill_tokens=int(lengths.sum()),
            var_prefill_length=float(lengths.var()),
        )

    def _publish_kv_events(self) -> None:
        publish_kv_events(self.kv_publisher, self.cache.take_events(), self.config.kv_wire_format)
