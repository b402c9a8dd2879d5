"""A sequenced ZMQ SUB stream with gap recovery, restart detection and reconnects (SPEC §6).

SGLang's and vLLM's publishers send [topic, seq, payload] with seq an 8-byte big-endian
counter that starts at 0 when the publisher starts. A subscriber can lose messages (slow
joiner, high-water mark, a dropped TCP connection); the publisher keeps its last
`buffer_steps` batches and answers replay requests on a ROUTER socket. Replay protocol
(verified in both `kv_events.py`): the client sends [b"", start_seq (8-byte big-endian)]
from a DEALER (the ROUTER sees [identity, b"", start_seq]); the publisher answers every
buffered batch with seq >= start_seq as [b"", topic, seq, payload] (SGLang) or
[b"", seq, payload] (vLLM), then an end marker whose seq is -1 as 8 signed bytes
([b"", b"", END, b""] / [b"", END, b""]).

`SequencedSubscriber` hands each message, in sequence order, to `on_message(seq, payload,
recovered)`; a jump forward is a gap, recovered by replay when a replay endpoint is known;
a jump back (seq <= last) is a publisher restart, after which the new epoch's missed head
is recovered the same way. A jump forward of more than `MAX_SEQ_JUMP` messages (a seq of
2^64 - 1, a publisher restarted with another counter) is not a believable loss: it is
treated as a restart too, so `messages_lost` stays a count of messages that existed; if the
next message continues the old counter, the jump was one stray message and the stream goes
on from before it.
libzmq reconnects dropped connections by itself; a socket monitor counts disconnects and
reconnects. One thread owns all sockets.

Every socket is opened with `zmq.MAXMSGSIZE` = `max_message_bytes` (default
`DEFAULT_MAX_MESSAGE_BYTES`, 64 MiB): a larger frame makes libzmq drop the connection
instead of buffering it, so a broken or hostile publisher cannot grow the collector's memory
without bound. libzmq treats that drop as a protocol error and does not reconnect by itself;
a connection that was dropped and not retried within `_REDIAL_AFTER_S` is dialled again
(counted in `redials`), so the stream goes on after the oversized message.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Self

import zmq

from cluster.wire.kv_events import END_SEQ

logger = logging.getLogger(__name__)

OnMessage = Callable[[int, bytes, bool], None]

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # largest ZMQ message accepted (64 MiB)
# Largest forward jump of seq counted as lost messages (~17 min at 1,000 batches/s); beyond
# it the publisher is taken to have restarted with another counter.
MAX_SEQ_JUMP = 1_000_000
_REDIAL_AFTER_S = 0.5  # a drop libzmq does not retry within this long is dialled again


@dataclass(slots=True)
class StreamStats:
    """Counters of one stream (mutated only by its thread; read from anywhere)."""

    messages: int = 0
    gaps: int = 0
    gaps_recovered: int = 0
    messages_recovered: int = 0
    messages_lost: int = 0
    restarts: int = 0
    malformed: int = 0
    disconnects: int = 0
    connects: int = 0
    redials: int = 0
    handler_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class SequencedSubscriber:
    """Subscribes to `endpoint` under `topic`; see the module docstring.

    `catch_up=True` replays the publisher's buffer from seq 0 before the first live message
    (a collector started after the engine). `on_malformed(reason)` is told of every frame or
    payload that was dropped.
    """

    def __init__(
        self,
        endpoint: str,
        on_message: OnMessage,
        *,
        topic: str = "",
        replay_endpoint: str | None = None,
        catch_up: bool = False,
        replay_timeout_s: float = 2.0,
        name: str = "pdlab-sub",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if not endpoint or "://" not in endpoint:
            raise ValueError(
                f"endpoint must look like tcp://HOST:PORT or ipc://PATH, got {endpoint!r}"
            )
        if replay_endpoint is not None and "://" not in replay_endpoint:
            raise ValueError(
                f"replay endpoint must look like tcp://HOST:PORT, got {replay_endpoint!r}"
            )
        if isinstance(max_message_bytes, bool) or not (
            isinstance(max_message_bytes, int) and max_message_bytes > 0
        ):
            raise ValueError(f"max_message_bytes must be an integer > 0, got {max_message_bytes!r}")
        self.max_message_bytes = max_message_bytes
        self.endpoint = endpoint
        self.topic = topic.encode("utf-8")
        self.replay_endpoint = replay_endpoint
        self.catch_up = catch_up
        self.replay_timeout_s = replay_timeout_s
        self.stats = StreamStats()
        self._on_message = on_message
        self._last_seq: int | None = None
        self._before_jump: int | None = None  # last seq before an implausible jump
        self._dropped_at: float | None = None  # a disconnect not (yet) followed by a retry
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._ctx = zmq.Context()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._ctx.term()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def last_seq(self) -> int | None:
        return self._last_seq

    # --- thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sub.setsockopt(zmq.RCVHWM, 1_000_000)
        sub.setsockopt(zmq.RECONNECT_IVL, 50)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(
            zmq.EVENT_CONNECTED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_CONNECT_DELAYED
        )
        sub.connect(self.endpoint)
        dealer: zmq.Socket | None = None
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        self._ready.set()
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(100))
                if monitor in events:
                    self._drain_monitor(monitor)
                if self._dropped_at is not None and (
                    time.monotonic() - self._dropped_at > _REDIAL_AFTER_S
                ):
                    self._redial(sub)
                if sub not in events:
                    continue
                frames = sub.recv_multipart()
                parsed = self._parse_live(frames)
                if parsed is None:
                    continue
                seq, payload = parsed
                dealer = self._sequence(seq, payload, dealer)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            if dealer is not None:
                dealer.close(linger=0)

    def _drain_monitor(self, monitor: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while monitor.poll(0):
            evt = recv_monitor_message(monitor)
            if evt["event"] == zmq.EVENT_DISCONNECTED:
                self.stats.disconnects += 1
                self._dropped_at = time.monotonic()
                logger.info("publisher %s disconnected; libzmq reconnects", self.endpoint)
            else:  # connected, or libzmq is retrying
                self._dropped_at = None
                if evt["event"] == zmq.EVENT_CONNECTED:
                    self.stats.connects += 1

    def _redial(self, sub: zmq.Socket) -> None:
        self._dropped_at = None
        self.stats.redials += 1
        logger.warning(
            "publisher %s dropped the connection and libzmq does not retry (a message above "
            "max_message_bytes=%d?): connecting again",
            self.endpoint, self.max_message_bytes,
        )  # fmt: skip
        with contextlib.suppress(zmq.ZMQError):  # not connected any more: nothing to undo
            sub.disconnect(self.endpoint)
        sub.connect(self.endpoint)

    def _malformed(self, reason: str) -> None:
        self.stats.malformed += 1
        logger.warning("dropping malformed message from %s: %s", self.endpoint, reason)

    def _parse_live(self, frames: list[bytes]) -> tuple[int, bytes] | None:
        if len(frames) != 3:
            self._malformed(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
            return None
        topic, seq_b, payload = frames
        if not topic.startswith(self.topic):
            self._malformed(f"topic {topic!r} does not match {self.topic!r}")
            return None
        if len(seq_b) != 8:
            self._malformed(f"seq frame must be 8 bytes, got {len(seq_b)}")
            return None
        return int.from_bytes(seq_b, "big"), payload

    def _deliver(self, seq: int, payload: bytes, recovered: bool) -> None:
        self.stats.messages += 1
        if recovered:
            self.stats.messages_recovered += 1
        try:
            self._on_message(seq, payload, recovered)
        except (RecursionError, OverflowError) as exc:
            # What a malformed payload causes (deep nesting, an integer beyond 64 bits):
            # one line, counted and dropped, not a traceback per message.
            self._malformed(f"seq {seq}: {type(exc).__name__}: {str(exc)[:200]}")
        except Exception:
            # The stream must outlive one bad payload or handler bug: log it with its
            # traceback, count it, keep consuming.
            self.stats.handler_errors += 1
            logger.exception("handler failed on seq %d from %s", seq, self.endpoint)

    def _sequence(self, seq: int, payload: bytes, dealer: zmq.Socket | None) -> zmq.Socket | None:
        last = self._last_seq
        if self._before_jump is not None and seq == self._before_jump + 1:
            last = self._before_jump  # the jump was one stray message: the old counter goes on
        self._before_jump = None
        if last is None:
            expected = 0 if self.catch_up else seq
        elif seq <= last:
            self.stats.restarts += 1
            logger.info("publisher %s restarted (seq %d after %d)", self.endpoint, seq, last)
            expected = 0
        else:
            expected = last + 1
        if seq - expected > MAX_SEQ_JUMP:
            if last is not None:
                self.stats.restarts += 1
            logger.warning(
                "publisher %s jumped to seq %d (expected %d): more than %d messages, taken as "
                "a restart with a new counter, not as lost messages",
                self.endpoint, seq, expected, MAX_SEQ_JUMP,
            )  # fmt: skip
            self._before_jump = last
            expected = seq
        if seq > expected:
            self.stats.gaps += 1
            dealer = self._recover(expected, seq, dealer)
        self._last_seq = seq
        self._deliver(seq, payload, False)
        return dealer

    def _recover(self, first: int, until: int, dealer: zmq.Socket | None) -> zmq.Socket | None:
        """Replay [first, until) and deliver it; count what the publisher no longer has."""
        missing = until - first
        if self.replay_endpoint is None:
            self.stats.messages_lost += missing
            logger.warning("lost %d messages [%d, %d): no replay endpoint", missing, first, until)
            return dealer
        if dealer is None:
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", first.to_bytes(8, "big")])
        got: dict[int, bytes] = {}
        deadline_ms = int(self.replay_timeout_s * 1000)
        complete = False
        while dealer.poll(deadline_ms):
            frames = dealer.recv_multipart()
            body = frames[1:] if frames and frames[0] == b"" else frames
            if len(body) == 3:
                _, seq_b, payload = body
            elif len(body) == 2:
                seq_b, payload = body
            else:
                self._malformed(f"replay reply with {len(body)} frames")
                continue
            if seq_b == END_SEQ:
                complete = True
                break
            if len(seq_b) != 8:
                self._malformed("replay seq frame is not 8 bytes")
                continue
            s = int.from_bytes(seq_b, "big")
            if first <= s < until:
                got[s] = payload
        if not complete:
            # Replies may still arrive later; a fresh socket keeps them out of the next replay.
            logger.warning("replay from %s timed out", self.replay_endpoint)
            dealer.close(linger=0)
            dealer = None
        for s in sorted(got):
            self._deliver(s, got[s], True)
        lost = missing - len(got)
        self.stats.messages_lost += lost
        if lost == 0:
            self.stats.gaps_recovered += 1
        else:
            logger.warning("replay recovered %d of %d missing messages", len(got), missing)
        return dealer


class SubscribedCollector:
    """The lifecycle every collector of a stream shares (KV events, forward-pass metrics,
    vLLM steps): its subscriber's stats, start/stop, and use as a context manager. A
    subclass sets `self._sub` to its `SequencedSubscriber`."""

    _sub: SequencedSubscriber

    @property
    def stats(self) -> StreamStats:
        return self._sub.stats

    def start(self) -> Self:
        self._sub.start()
        return self

    def stop(self) -> None:
        self._sub.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
