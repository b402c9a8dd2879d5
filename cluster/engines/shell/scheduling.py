"""What both engines' schedulers share: roles, finish reasons, the thread, the wire out.

Each engine's scheduler is one thread that owns the engine's state (prefix cache, queues)
and takes new requests through an inbox (`SchedulerThread`); after a pass it publishes the
prefix cache's KV events and one ForwardPassMetrics, and while idle a heartbeat every
second (`Heartbeat`), numbered as SGLang numbers them (`publish_fpm`). A request hears of
its progress through `OnUpdate` (output ids so far, finish reason or None) on the
scheduler thread; the finish reason is SGLang's dict ({"type": "length" | "stop" |
"abort", ...}). A request whose client went away is aborted (`SchedulerThread.abort`, as
SGLang's `abort_request`): dropped from the inbox at once, or finished with an abort between
passes by the engine's `_drop`, which frees its KV pages and its seat in the batch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec

from cluster.sglang.fpm import ForwardPassMetrics, encode_fpm
from cluster.wire.kv_events import SGLangEvent, WireFormat, encode_batch
from cluster.wire.publisher import ZmqBatchPublisher

Role = Literal["null", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("null", "prefill", "decode")
Finish = dict[str, Any]
OnUpdate = Callable[[list[int], "Finish | None"], None]  # called on the scheduler thread
Q = TypeVar("Q")


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def abort(message: str, status_code: int) -> Finish:
    """SGLang's finish reason of an aborted request."""
    return {"type": "abort", "message": message, "status_code": status_code}


def client_gone() -> Finish:
    """The finish of a request whose client disconnected (nobody reads it: 499 as nginx)."""
    return abort("the client disconnected; the request was aborted", 499)


class SchedulerThread(Generic[Q]):
    """The thread a scheduler runs its loop on, and the inbox of requests it takes them from.

    Subclasses write `_loop` (run until `_stop` is set, moving `_inbox` into their queues
    and taking `_take_aborts()` under `_cond`) and `_drop` (end an aborted request and free
    what it holds), and keep `waiting` and `running`."""

    def __init__(self, *, name: str, join_timeout_s: float = 5.0) -> None:
        self.waiting: deque[Q] = deque()
        self.running: list[Q] = []
        self.num_passes = 0
        self._inbox: deque[Q] = deque()
        self._aborts: list[Q] = []
        self._abort_message: str | None = None  # set by `abort_all`
        self.num_aborted = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._join_timeout_s = join_timeout_s

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(self._join_timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, req: Q) -> None:
        with self._cond:
            self._inbox.append(req)
            self._cond.notify_all()

    def abort(self, req: Q) -> None:
        """`req`'s client went away: drop it from the inbox now, or have the loop finish it
        with an abort and free its KV between passes (a finished request is left alone).
        Any thread; returns at once."""
        with self._cond:
            for i, queued in enumerate(self._inbox):
                if queued is req:
                    del self._inbox[i]
                    self.num_aborted += 1
                    return
            self._aborts.append(req)
            self._cond.notify_all()

    def abort_all(self, message: str) -> None:
        """From now on finish every request with an abort (503: the engine is stopping), so
        their clients get an answer before the HTTP server closes. Any thread."""
        with self._cond:
            self._abort_message = message
            self._cond.notify_all()

    def is_idle(self) -> bool:
        with self._cond:
            return not (self._inbox or self.waiting or self.running)

    def _take_inbox(self) -> None:
        """Move new requests to `waiting` (call under `_cond`)."""
        while self._inbox:
            self.waiting.append(self._inbox.popleft())

    def _take_aborts(self) -> list[tuple[Q, Finish]]:
        """The requests to abort now, with their finish: those whose client left, and after
        `abort_all` every queued and running one (call under `_cond`, after `_take_inbox`)."""
        out = [(req, client_gone()) for req in self._aborts]
        self._aborts = []
        if self._abort_message is not None:
            stopping = abort(self._abort_message, 503)
            out += [(req, stopping) for req in [*self.waiting, *self.running]]
        return out

    def _dequeue(self, req: Q) -> bool:
        """Take `req` out of `waiting` or `running`; False when it is in neither (finished)."""
        for queue in (self.waiting, self.running):
            for i, queued in enumerate(queue):
                if queued is req:
                    del queue[i]
                    self.num_aborted += 1
                    return True
        return False

    def _loop(self) -> None:
        raise NotImplementedError


class _Queued(Protocol):
    input_ids: list[int]
    admitted: bool


QueuedT = TypeVar("QueuedT", bound=_Queued)


def prefill_chunks(
    waiting: Iterable[QueuedT],
    num_running: int,
    *,
    budget_tokens: int,
    max_running: int,
    admit: Callable[[QueuedT], bool],
    computed: Callable[[QueuedT], int | None],
) -> list[tuple[QueuedT, int]]:
    """SGLang's chunked prefill, FCFS: each waiting request's next chunk (request, tokens)
    under the per-pass token budget, while running + chosen stay under `max_running`.

    A request not yet admitted is admitted first (`admit`: False stops the pass, so nothing
    overtakes it); `computed` is how many prompt tokens it has computed, or None for one
    that needs no prefill here (a decode-role request whose KV arrived)."""
    chunks: list[tuple[QueuedT, int]] = []
    for req in list(waiting):
        if budget_tokens <= 0 or num_running + len(chunks) >= max_running:
            break
        if not req.admitted and not admit(req):
            break
        done = computed(req)
        if done is None:
            continue
        n = min(len(req.input_ids) - done, budget_tokens)
        chunks.append((req, n))
        budget_tokens -= n
    return chunks


class Heartbeat:
    """An idle engine's ForwardPassMetrics: at once after a busy spell, then every second."""

    def __init__(self, publisher: ZmqBatchPublisher | None, worker_id: str) -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self.was_busy = False
        self._last = 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if self.was_busy or now - self._last >= 1.0:
            self.was_busy = False
            self._last = now
            publish_fpm(self.publisher, ForwardPassMetrics(worker_id=self.worker_id))


def publish_fpm(publisher: ZmqBatchPublisher | None, m: ForwardPassMetrics) -> None:
    """Send `m` with counter_id = the publisher's sequence number (as SGLang numbers them)."""
    if publisher is not None:
        publisher.publish(encode_fpm(msgspec.structs.replace(m, counter_id=publisher.next_seq)))


def publish_kv_events(
    publisher: ZmqBatchPublisher | None, events: Sequence[SGLangEvent], fmt: WireFormat = "sglang"
) -> None:
    """Send the prefix cache's new events as one KVEventBatch (ts = wall time), in SGLang's
    wire format or another engine's (`kv_events.encode_batch`)."""
    if events and publisher is not None:
        publisher.publish(encode_batch(events, time.time(), fmt=fmt))
