"""The torch engine's scheduling loop: one loop for both phases (paper 000 §4.1).

One thread owns all engine state (prefix cache, queues, KV pool) and repeats: take new
requests and control calls (`call`), then run one pass —

- a prefill pass when any admitted request has prompt tokens left: FCFS, each request's
  next chunk under the per-pass token budget (`chunk_tokens`, chunked prefill); a request
  joins when its pages fit (prefix hit matched and acquired first, host hits restored);
- otherwise a decode pass over every running request (continuous batching: a request that
  finishes its prefill joins the next decode pass; one that finishes leaves it).

Prefill and decode passes are never mixed (SGLang's default without --enable-mixed-chunk;
a mixed pass would be one prefill row in the telemetry), so a collocated ("null") engine
gives prefill priority. Roles: "null" serves whole requests; "prefill" stops after the
first token and hands the room's KV to the bootstrap registry; "decode" starts from the KV
and first token a prefill engine sent. Every role caches the full pages it computes or
receives and writes them through to the host tier, so a role switch (`switch_role`)
keeps the cache: nothing is cleared. After every pass the cache's KV events and one
ForwardPassMetrics are published; an idle engine sends a heartbeat every second.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

from cluster.engines.shell.scheduling import (
    Finish,
    Heartbeat,
    Role,
    SchedulerThread,
    abort,
    check_role,
    prefill_chunks,
    publish_fpm,
    publish_kv_events,
)
from cluster.engines.shell.stamps import DECODE_JOIN, FORWARD, PREFILL_DONE, stamp
from cluster.engines.torch import pass_metrics
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.pass_metrics import PrefillSlice
from cluster.engines.torch.prefix_cache import Block, PrefixCache
from cluster.engines.torch.request import EngineRequest
from cluster.engines.torch.runner import ModelRunner, PassItem, PassOutput
from cluster.engines.torch.transfer import Room, RoomRegistry
from cluster.kv.hashing import token_block_hashes
from cluster.wire.publisher import ZmqBatchPublisher

log = logging.getLogger(__name__)


class Scheduler(SchedulerThread[EngineRequest]):
    """Owns the engine state; every mutation happens on its thread (module docstring)."""

    def __init__(
        self,
        cfg: EngineConfig,
        role: Role,
        runner: ModelRunner,
        *,
        rooms: RoomRegistry,
        kv_publisher: ZmqBatchPublisher | None = None,
        fpm_publisher: ZmqBatchPublisher | None = None,
    ) -> None:
        super().__init__(name="torch-engine", join_timeout_s=10.0)
        self.cfg = cfg
        self.role: Role = check_role(role)
        self.runner = runner
        self.rooms = rooms
        self.kv_publisher = kv_publisher
        self.fpm_publisher = fpm_publisher
        self.cache = PrefixCache(cfg.page_size, cfg.gpu_pages, cfg.host_pages, cfg.eviction)
        self._restores: list[tuple[int, int]] = []
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._heartbeat = Heartbeat(fpm_publisher, cfg.worker_id)
        # perf_counter when the loop's current busy spell reached the last pass's end (or
        # woke up); None while it waits. What a pass adds to the spell beyond its forward
        # is its CPU overhead (`_overhead`).
        self._busy_since: float | None = None

    # ---- API (any thread) -----------------------------------------------------------------
    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the scheduler thread between passes; its result or error in a Future."""
        fut: Future[Any] = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify_all()
        return fut

    # ---- control calls (scheduler thread, via `call`) -------------------------------------------
    def switch_role(self, new_role: Role) -> str | None:
        """Serve `new_role` from the next pass; the prefix cache stays (paper 000 §4.1)."""
        if self._inbox or self.waiting or self.running:
            return "instance is not idle; drain all requests before switching"
        self.role = new_role
        return None

    def flush(self) -> bool:
        if self._inbox or self.waiting or self.running:
            return False
        self.cache.reset()
        return True

    # ---- loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                self._take_inbox()
                aborts = self._take_aborts()
                calls = list(self._calls)
                self._calls.clear()
                if not calls and not aborts and not self.waiting and not self.running:
                    self._heartbeat.beat()
                    self._cond.wait(0.2)
                    self._busy_since = None
                    continue
            if self._busy_since is None:
                self._busy_since = time.perf_counter()
            for req, finish in aborts:
                self._drop(req, finish)
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except Exception as e:  # the caller gets the error; the loop goes on
                    fut.set_exception(e)
            try:
                ran = self._step() if (self.waiting or self.running) else True
            except Exception as e:
                log.exception("torch engine pass failed")
                self._fail_all(f"engine pass failed: {type(e).__name__}: {e}")
                ran = True
            self._publish_kv_events()
            if not ran:
                with self._cond:  # nothing admissible yet: wait for a change, do not spin
                    self._cond.wait(0.01)
                self._busy_since = None

    def _step(self) -> bool:
        items = self._schedule_prefill(time.monotonic())
        if items:
            self._prefill_pass(items)
            return True
        if self.running:
            self._decode_pass()
            return True
        return False

    # ---- admission --------------------------------------------------------------------------
    def _schedule_prefill(self, now: float) -> list[PassItem]:
        chunks = prefill_chunks(
            self.waiting,
            len(self.running),
            budget_tokens=self.cfg.chunk_tokens,
            max_running=self.cfg.max_running,
            admit=lambda req: self._admit(req, now),
            # decode role: admitted straight into running with the KV it received
            computed=lambda req: None if req.transfer is not None else req.num_computed,
        )
        return [
            PassItem(req, n, sample=req.num_computed + n >= len(req.input_ids)) for req, n in chunks
        ]

    def _admit(self, req: EngineRequest, now: float) -> bool:
        """Give `req` its pages (prefix hit, restores, new pages, output reserve)."""
        ps, cache = self.cfg.page_size, self.cache
        n_in = len(req.input_ids)
        prompt_pages = math.ceil(n_in / ps)
        later = 0 if self.role == "prefill" else math.ceil((n_in + req.max_new_tokens) / ps)
        later = max(later - prompt_pages, 0)
        gpu: list[Block] = []
        host: list[Block] = []
        if req.transfer is not None:
            want = list(self.runner.pool.gpu.shape)
            want[2] = prompt_pages
            if list(req.transfer.kv.shape) != want:  # another model, or a bad room
                self.waiting.remove(req)
                got = list(req.transfer.kv.shape)
                self._finish(req, abort(f"the KV transfer has shape {got}, this engine "
                                         f"needs {want}", 500), now)  # fmt: skip
                return False
        if req.transfer is None:
            hashes = token_block_hashes(req.input_ids[:-1], ps)
            gpu, host = cache.match(hashes, now)
            cache.acquire(gpu)
        need = prompt_pages - len(gpu) + later
        if cache.available < need:
            cache.evict("GPU", need - cache.available, now)
        if cache.available < need:
            cache.release(gpu, now)
            if not self.running and not any(r.admitted for r in self.waiting):
                self.waiting.remove(req)
                self._finish(req, abort(f"request needs {need} KV pages, the pool has "
                                         f"{cache.gpu_pages}", 400), now)  # fmt: skip
            return False
        copies = cache.restore(host, now) or []
        fresh = cache.lend(prompt_pages - len(gpu) - len(host), later, now)
        assert fresh is not None  # `available` covered it
        self._restores += copies
        req.blocks = [*gpu, *host] + [None] * len(fresh)
        req.pages = [cast(int, b.page) for b in gpu] + [p for _, p in copies] + fresh
        req.hashes = [b.hash for b in (*gpu, *host)]
        req.num_computed = req.cached_tokens = len(req.hashes) * ps
        req.restored_tokens = req.pending_restore_tokens = len(host) * ps
        req.reserved_pages = later
        req.admitted = True
        if req.transfer is not None:
            self._receive(req, now)
        return True

    def _receive(self, req: EngineRequest, now: float) -> None:
        """Decode role: load the prefill's KV into the new pages and start decoding."""
        t = req.transfer
        assert t is not None
        self.runner.pool.load(req.pages, t.kv)
        req.num_computed = len(req.input_ids)
        req.cached_tokens = t.cached_tokens
        self.waiting.remove(req)
        self._cache_pages(req, now)
        stamp(req.stamps, DECODE_JOIN)
        req.output_ids.append(t.first_token_id)
        self.running.append(req)
        self._progress(req, now)

    # ---- passes -----------------------------------------------------------------------------
    def _prefill_pass(self, items: list[PassItem]) -> None:
        cfg = self.cfg
        slices = [
            PrefillSlice(it.num_new, it.req.num_computed, it.req.pending_restore_tokens,
                         len(it.req.input_ids))
            for it in items
        ]  # fmt: skip
        started = time.time()
        for it in items:
            stamp(it.req.stamps, FORWARD, started)
        t_start = time.monotonic()
        out = self.runner.run(items, self._restores, timed=cfg.telemetry)
        self._restores = []
        now = time.monotonic()
        ended = time.time()
        for it, token in zip(items, out.next_ids, strict=True):
            req = it.req
            req.pending_restore_tokens = 0
            req.num_computed += it.num_new
            self._cache_pages(req, now)
            if token is None:
                continue
            stamp(req.stamps, PREFILL_DONE, ended)
            self.waiting.remove(req)
            req.output_ids.append(token)
            if self.role == "prefill":
                self._hand_over(req, now)
            else:
                self.running.append(req)
                self._progress(req, now)
        self._after_pass()
        self._on_pass("prefill", t_start, out, [it.req for it in items], slices)
        if cfg.telemetry:
            m = pass_metrics.prefill_metrics(
                cfg.worker_id, out.wall_s, slices, out.attn_pairs, out.experts_per_layer,
                self._queued(), self._overhead(out.wall_s), out.cpu_s,
            )  # fmt: skip
            publish_fpm(self.fpm_publisher, m)

    def _decode_pass(self) -> None:
        cfg, ps = self.cfg, self.cfg.page_size
        batch = list(self.running)
        for req in batch:
            if req.num_computed == len(req.pages) * ps:  # the new token starts a page
                req.pages.append(self.cache.take_reserved())
                req.blocks.append(None)
                req.reserved_pages -= 1
        seq_lens = [req.num_computed + 1 for req in batch]
        t_start = time.monotonic()
        out = self.runner.run([PassItem(r, 1, True) for r in batch], timed=cfg.telemetry)
        now = time.monotonic()
        for req, token in zip(batch, out.next_ids, strict=True):
            req.num_computed += 1
            self._cache_pages(req, now)
            req.output_ids.append(token)  # type: ignore[arg-type]
            self._progress(req, now)
        self._after_pass()
        self._on_pass("decode", t_start, out, batch, seq_lens)
        if cfg.telemetry:
            m = pass_metrics.decode_metrics(
                cfg.worker_id,
                out.wall_s,
                seq_lens,
                out.experts_per_layer,
                self._queued(),
                self._overhead(out.wall_s),
                out.cpu_s,
            )
            publish_fpm(self.fpm_publisher, m)

    def _overhead(self, wall_s: float) -> float:
        """The pass's CPU overhead: the loop's time since the previous pass's end (or since
        it woke) less this pass's forward — scheduling, admission, cache bookkeeping,
        answers and publishing, all outside `ModelRunner.run`'s timed span. Back-to-back
        passes cost the sum of their forwards and overheads, to the microsecond."""
        now = time.perf_counter()
        since, self._busy_since = self._busy_since, now
        return 0.0 if since is None else max(now - since - wall_s, 0.0)

    def _after_pass(self) -> None:
        self.num_passes += 1
        self._heartbeat.was_busy = True

    def _on_pass(
        self,
        phase: str,
        t_start: float,
        out: PassOutput,
        reqs: list[EngineRequest],
        detail: list[PrefillSlice] | list[int],
    ) -> None:
        """After each pass (monotonic start, the runner's output, its requests and their
        prefill slices or decode seq_lens): nothing here; a DP rank logs it."""

    def _cache_pages(self, req: EngineRequest, now: float) -> None:
        """Cache the request's newly full pages and write them through to the host."""
        ps, start = self.cfg.page_size, len(req.hashes)
        req.extend_hashes(ps)
        new = []
        toks = req.tokens
        for i in range(start, len(req.hashes)):
            if req.blocks[i] is not None:
                continue
            parent = req.hashes[i - 1] if i else None
            b = self.cache.register(req.hashes[i], parent, toks[i * ps : (i + 1) * ps],
                                    req.pages[i], now)  # fmt: skip
            if b is not None:
                req.blocks[i] = b
                new.append(b)
        copies = self.cache.write_through(new, now)
        if copies:
            self.runner.pool.to_host([g for g, _ in copies], [h for _, h in copies])

    def _progress(self, req: EngineRequest, now: float) -> None:
        last = req.output_ids[-1]
        n = len(req.output_ids)
        if not req.ignore_eos and last == self.cfg.model.eos_token_id:
            self.running.remove(req)
            self._finish(req, {"type": "stop", "matched": last}, now)
        elif n >= req.max_new_tokens:
            self.running.remove(req)
            self._finish(req, {"type": "length", "length": n}, now)
        else:
            req.on_update(list(req.output_ids), None)

    def _hand_over(self, req: EngineRequest, now: float) -> None:
        """Prefill role: the room's KV and first token go to the bootstrap registry."""
        if req.bootstrap_room is not None:
            kv = self.runner.pool.read(req.pages)
            room = Room(req.bootstrap_room, len(req.input_ids), req.output_ids[0],
                        req.cached_tokens, kv)  # fmt: skip
            self.rooms.finish(req.bootstrap_room, room)
        self._finish(req, {"type": "length", "length": 1}, now)

    def _finish(self, req: EngineRequest, finish: Finish, now: float) -> None:
        if req.admitted:
            self.cache.release(req.held_blocks(), now)
            self.cache.give_back(req.private_pages())
            self.cache.unreserve(req.reserved_pages)
            req.reserved_pages = 0
            req.admitted = False
        req.on_update(list(req.output_ids), finish)

    def _drop(self, req: EngineRequest, finish: Finish) -> None:
        """An aborted request leaves its queue; its pages and reservation go back."""
        if self._dequeue(req):
            self._finish(req, finish, time.monotonic())

    def _fail_all(self, message: str) -> None:
        """Abort every request after a failed pass; their pages go back where possible."""
        now = time.monotonic()
        for req in [*self.waiting, *self.running]:
            try:
                self._finish(req, abort(message, 500), now)
            except Exception:  # the pass left the request inconsistent: answer it anyway
                log.exception("releasing request %s after a failed pass", req.rid)
                req.on_update(list(req.output_ids), abort(message, 500))
        self.waiting.clear()
        self.running.clear()
        self._restores = []

    def _queued(self) -> Any:
        return pass_metrics.queued_metrics(
            [len(r.input_ids) for r in self.waiting if r.transfer is None]
        )

    def _publish_kv_events(self) -> None:
        publish_kv_events(self.kv_publisher, self.cache.take_events())
