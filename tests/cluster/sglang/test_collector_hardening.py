"""Collectors against bad publishers, over real ZMQ sockets on loopback.

One malformed event drops only itself; an impossible sequence jump is a reset, not billions
of lost messages; a NaN batch time becomes the receive time; frames above the size limit are
refused; rows the sink rejects are counted as rejected, not written.
"""

from __future__ import annotations

import logging
import math
import time

import msgspec
import pytest
import zmq

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.sglang.fpm import ForwardPassMetrics, ScheduledRequestMetrics, encode_fpm
from cluster.sglang.fpm_collector import ForwardMetricsCollector
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.kv_events import SGLangBlockStored, encode_batch
from telemetry import TelemetryWriter

pytestmark = pytest.mark.timeout(120)


def _wait(pred, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


class RawPub:
    """A bare PUB socket: any frames, any sequence numbers."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, seq: int, payload: bytes) -> None:
        self.sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _stored(h: int, ts: float | None = None) -> bytes:
    ev = KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (h,), None, 16, tuple(range(16)))
    return encode_batch([ev], ts=time.time() if ts is None else ts)


def _start(col):  # type: ignore[no-untyped-def]
    col.start()
    assert _wait(lambda: col.stats.connects >= 1)
    time.sleep(0.2)  # slow joiner
    return col


def test_one_bad_token_id_drops_only_its_event(caplog: pytest.LogCaptureFixture) -> None:
    pub = RawPub()
    got: list[KVEvent] = []
    sink = MemorySink()
    col = _start(KVEventCollector(pub.endpoint, callbacks=[got.extend], sink=sink))
    bad = SGLangBlockStored(
        block_hashes=[2], parent_block_hash=1, token_ids=[1, "x", 3],  # type: ignore[list-item]
        block_size=16, lora_id=None, medium="GPU",
    )  # fmt: skip
    good = [KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (h,), None, 16) for h in (1, 3)]
    try:
        with caplog.at_level(logging.WARNING):
            pub.send(0, encode_batch([good[0], bad, good[1]], ts=time.time()))
            assert _wait(lambda: len(got) == 2)
    finally:
        col.stop()
        pub.close()
    assert [e.block_hashes for e in got] == [(1,), (3,)]
    assert col.num_skipped == 1 and col.num_rows == 2 and col.stats.handler_errors == 0
    assert sink.tables["kv_events"]["block_hash"] == [1, 3]
    warnings = [r for r in caplog.records if "token_ids" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "\n" not in warnings[0].getMessage()


def test_an_impossible_sequence_jump_is_a_reset_not_a_loss() -> None:
    pub = RawPub()
    got: list[KVEvent] = []
    col = _start(KVEventCollector(pub.endpoint, callbacks=[got.extend]))
    try:
        for seq in range(5):
            pub.send(seq, _stored(seq))
        pub.send(2**64 - 1, _stored(99))  # a corrupt counter (or a wrapped one)
        for seq in range(5, 8):  # ... and the publisher goes on as before
            pub.send(seq, _stored(seq))
        assert _wait(lambda: len(got) == 9)
    finally:
        col.stop()
        pub.close()
    assert col.stats.messages_lost == 0 and col.stats.gaps == 0
    assert col.stats.restarts <= 1
    assert [e.block_hashes[0] for e in got] == [0, 1, 2, 3, 4, 99, 5, 6, 7]


def test_a_nan_batch_time_becomes_the_receive_time() -> None:
    pub = RawPub()
    sink = MemorySink()
    start = time.time() - 100.0
    col = _start(KVEventCollector(pub.endpoint, sink=sink, run_start_wall=start))
    try:
        pub.send(0, _stored(1, ts=math.nan))
        pub.send(1, _stored(2, ts=math.inf))
        assert _wait(lambda: col.num_rows == 2)
    finally:
        col.stop()
        pub.close()
    ts = sink.tables["kv_events"]["t"]
    assert all(99.0 < t < 130.0 for t in ts), ts  # not 0 (NaN clamped), not inf
    assert col.decoder.num_bad_ts == 2


def test_frames_above_the_size_limit_are_refused() -> None:
    pub = RawPub()
    got: list[KVEvent] = []
    col = _start(KVEventCollector(pub.endpoint, callbacks=[got.extend], max_message_bytes=1 << 20))
    try:
        pub.send(0, _stored(0))
        assert _wait(lambda: len(got) == 1)
        pub.send(1, b"\x00" * (2 << 20))  # 2 MiB: libzmq drops the connection instead
        assert _wait(lambda: col.stats.disconnects >= 1)
        assert _wait(lambda: col.stats.connects >= 2)  # libzmq reconnects by itself
        time.sleep(0.2)
        pub.send(2, _stored(2))
        assert _wait(lambda: len(got) == 2)
    finally:
        col.stop()
        pub.close()
    assert col.stats.messages == 2 and col.stats.malformed == 0 and col.stats.redials >= 1
    with pytest.raises(ValueError, match="max_message_bytes"):
        KVEventCollector("tcp://127.0.0.1:1", max_message_bytes=0)


def _fpm(wall_time: float) -> bytes:
    s = ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=100)
    return encode_fpm(ForwardPassMetrics(wall_time=wall_time, scheduled_requests=s))


def test_rows_the_sink_rejects_are_counted_as_rejected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pub = RawPub()
    # A run with no node registered: the writer refuses rows of node 0.
    writer = TelemetryWriter(tmp_path / "t.duckdb", run_id="r")
    col = _start(ForwardMetricsCollector(pub.endpoint, sink=writer))
    try:
        pub.send(0, _fpm(0.01))
        pub.send(1, _fpm(math.nan))  # not a valid pass: malformed, not a row
        assert _wait(lambda: col.num_rows_rejected == 1 and col.stats.malformed == 1)
    finally:
        col.stop()
        pub.close()
        writer.close()
    assert col.num_prefill_rows == 0 and col.stats.handler_errors == 0


def test_fpm_payload_checks() -> None:
    from cluster.sglang.fpm import decode_fpm
    from cluster.wire.kv_events import WireError

    bad = msgspec.msgpack.encode(
        {"wall_time": 0.01, "scheduled_requests": {"num_prefill_requests": -1}}
    )
    with pytest.raises(WireError, match="num_prefill_requests is -1"):
        decode_fpm(bad)
    assert decode_fpm(_fpm(0.01)).wall_time == 0.01
