"""A ZMQ publisher with SGLang's wire protocol, for the SGLang stand-in and for tests (SPEC §6).

Behaves like SGLang's `ZmqEventPublisher` (`sglang/srt/disaggregation/kv_events.py`): a
PUB socket sending [topic, seq (8-byte big-endian, from 0), payload], a ring buffer of the
last `buffer_steps` payloads and an optional ROUTER answering replay requests with
[identity, b"", topic, seq, payload] per buffered batch with seq >= start and the end marker
[identity, b"", b"", END_SEQ, b""]. `replay_style="vllm"` answers like vLLM instead
([identity, b"", seq, payload], [identity, b"", END_SEQ, b""]). Sends and replays happen on
the caller's thread under a lock (the stand-in publishes once per simulated iteration).

`drop_live(n)` makes the next n batches skip the PUB socket while still entering the replay
buffer — the loss a slow subscriber sees at the high-water mark — for fault tests and demos.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Literal

import zmq

from cluster.wire.kv_events import END_SEQ

logger = logging.getLogger(__name__)


class ZmqBatchPublisher:
    """PUB (+ replay ROUTER) bound on the given endpoints; port 0 or * picks a free port."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:*",
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        replay_style: Literal["sglang", "vllm"] = "sglang",
        first_seq: int = 0,
    ) -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(_wildcard_port(endpoint))
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.MAXMSGSIZE, 4096)  # replay requests are a few bytes
            self._replay.bind(_wildcard_port(replay_endpoint))
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic
        self._topic = topic.encode("utf-8")
        self.replay_style = replay_style
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = first_seq
        self._drop = 0
        self._lock = threading.Lock()
        self._closed = False
        self._replay_thread: threading.Thread | None = None
        if self._replay is not None:
            self._replay_thread = threading.Thread(
                target=self._serve_replay, name="pdlab-replay", daemon=True
            )
            self._replay_thread.start()

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, payload: bytes) -> int:
        """Send one batch payload; returns its sequence number."""
        with self._lock:
            if self._closed:
                raise RuntimeError("publisher is closed")
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if self._drop > 0:
                self._drop -= 1
            else:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            return seq

    def send_raw(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the PUB socket (malformed-frame tests)."""
        with self._lock:
            self._pub.send_multipart(frames)

    def drop_live(self, n: int) -> None:
        with self._lock:
            self._drop += n

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._replay_thread is not None:
            self._replay_thread.join(2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while not self._closed:
            if not sock.poll(50):
                continue
            frames = sock.recv_multipart()
            if len(frames) != 3:
                logger.warning("invalid replay request with %d frames", len(frames))
                continue
            client, _, start_b = frames
            start = int.from_bytes(start_b, "big")
            with self._lock:
                items = [(s, p) for s, p in self._buffer if s >= start]
            for seq, payload in items:
                seq_b = seq.to_bytes(8, "big")
                if self.replay_style == "sglang":
                    sock.send_multipart((client, b"", self._topic, seq_b, payload))
                else:
                    sock.send_multipart((client, b"", seq_b, payload))
            if self.replay_style == "sglang":
                sock.send_multipart((client, b"", b"", END_SEQ, b""))
            else:
                sock.send_multipart((client, b"", END_SEQ, b""))


def _wildcard_port(endpoint: str) -> str:
    """tcp://HOST:0 -> tcp://HOST:* (libzmq picks a free port)."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint
