"""What both engines' schedulers share: roles, finish reasons, the thread, the wire out.

Each engine's scheduler is one thread that owns the engine's state (prefix cache, queues)
and takes new requests through an inbox (`SchedulerThread`); after a pass it publishes the
prefix cache's KV events and one ForwardPassMetrics, and while idle a heartbeat every
second (`Heartbeat`), numbered as SGLang numbers them (`publish_fpm`). A request hears of
its progress through `OnUpdate` (output ids so far, finish reason or None) on the
scheduler thread; the finish reason is SGLang's dict ({"type": "length" | "stop" |
"abort", ...}).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec

from cluster.sglang.wire.fpm import ForwardPassMetrics, encode_fpm
from cluster.sglang.wire.kv_events import SGLangEvent, WireFormat, encode_batch
from cluster.sglang.wire.publisher import ZmqBatchPublisher

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


class SchedulerThread(Generic[Q]):
    """The thread a scheduler runs its loop on, and the inbox of requests it takes them from.

    Subclasses write `_loop` (run until `_stop` is set, moving `_inbox` into their queues
    under `_cond`) and keep `waiting` and `running`."""

    def __init__(self, *, name: str, join_timeout_s: float = 5.0) -> None:
        self.waiting: deque[Q] = deque()
        self.running: list[Q] = []
        self.num_passes = 0
        self._inbox: deque[Q] = deque()
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

    def is_idle(self) -> bool:
        with self._cond:
            return not (self._inbox or self.waiting or self.running)

    def _take_inbox(self) -> None:
        """Move new requests to `waiting` (call under `_cond`)."""
        while self._inbox:
            self.waiting.append(self._inbox.popleft())

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
