"""Fuzzing the collectors with random multipart frames over real ZMQ sockets on loopback.

Whatever a publisher sends (wrong frame counts, short sequence frames, random sequence
numbers, random bytes, msgpack of the wrong shape, batches with broken events), the KV and
forward-metrics collectors count it and go on: no handler error, no dead thread, and the next
valid message still arrives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.sglang.fpm import ForwardPassMetrics, ScheduledRequestMetrics, encode_fpm
from cluster.sglang.fpm_collector import ForwardMetricsCollector
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.kv_events import BatchDecoder, WireError, encode_batch

pytestmark = pytest.mark.timeout(300)

# msgpack values of any shape, and the fields of real events with wrong values.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
event = st.fixed_dictionaries(
    {"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other", 3])},
    optional={
        "block_hashes": st.one_of(st.lists(scalars, max_size=4), scalars),
        "parent_block_hash": scalars,
        "token_ids": st.one_of(
            st.lists(st.one_of(st.integers(0, 50_000), scalars), max_size=6), scalars
        ),
        "block_size": scalars,
        "medium": st.one_of(st.sampled_from(["GPU", "CPU_PINNED", "DISK"]), scalars),
    },
)
batch = st.one_of(
    st.tuples(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), scalars),
        st.lists(event, max_size=4),
        scalars,
    ).map(list),
    st.fixed_dictionaries({"ts": scalars, "events": st.lists(event, max_size=3)}),
    values,
)
payloads = st.one_of(st.binary(max_size=64), batch.map(msgspec.msgpack.encode))
seq_frames = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda s: s.to_bytes(8, "big")), st.binary(max_size=10)
)
frames = st.one_of(
    st.tuples(st.just(b""), seq_frames, payloads).map(list),
    st.lists(st.binary(max_size=16), min_size=1, max_size=5),
)
# No shrinking against live sockets: a failure (a pytest-timeout one too) is reported as drawn.
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


@settings(max_examples=400, deadline=None)
@given(batch.map(msgspec.msgpack.encode))
def test_decoder_never_raises_anything_but_wire_errors(payload: bytes) -> None:
    try:
        out = BatchDecoder(0, 1000.0).decode(payload)
    except WireError:
        return
    assert math.isfinite(out.ts) and out.skipped >= 0
    for ev in out.events:
        assert ev.t >= 0 and math.isfinite(ev.t)


class _Pub:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0

    def send(self, parts: list[bytes]) -> None:
        self.sock.send_multipart(parts)

    def valid(self, payload: bytes) -> None:
        self.seq += 1
        self.sock.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])


def _wait(pred: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return bool(pred())


@pytest.fixture(scope="module")
def kv() -> Iterator[tuple[_Pub, KVEventCollector, list[KVEvent]]]:
    pub = _Pub()
    got: list[KVEvent] = []
    col = KVEventCollector(pub.endpoint, callbacks=[got.extend], sink=MemorySink()).start()
    assert _wait(lambda: col.stats.connects >= 1)
    time.sleep(0.2)
    yield pub, col, got
    col.stop()
    pub.sock.close(linger=0)
    pub.ctx.term()


@pytest.fixture(scope="module")
def fpm() -> Iterator[tuple[_Pub, ForwardMetricsCollector, MemorySink]]:
    pub = _Pub()
    sink = MemorySink()
    col = ForwardMetricsCollector(pub.endpoint, sink=sink).start()
    assert _wait(lambda: col.stats.connects >= 1)
    time.sleep(0.2)
    yield pub, col, sink
    col.stop()
    pub.sock.close(linger=0)
    pub.ctx.term()


@FUZZ
@given(st.lists(frames, min_size=1, max_size=6))
def test_kv_collector_counts_garbage_and_goes_on(kv, parts: list[list[bytes]]) -> None:  # type: ignore[no-untyped-def]
    pub, col, got = kv
    for p in parts:
        pub.send(p)
    mark = 10**15 + pub.seq  # a block hash no fuzzed frame uses
    ev = KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (mark,), None, 16)
    pub.valid(encode_batch([ev], ts=time.time()))
    assert _wait(lambda: any(e.block_hashes == (mark,) for e in got[-50:])), col.stats
    assert col._sub.running and col.stats.handler_errors == 0


@FUZZ
@given(st.lists(frames, min_size=1, max_size=6))
def test_fpm_collector_counts_garbage_and_goes_on(fpm, parts: list[list[bytes]]) -> None:  # type: ignore[no-untyped-def]
    pub, col, sink = fpm
    for p in parts:
        pub.send(p)
    mark = 10**12 + pub.seq  # tokens no fuzzed frame sends
    s = ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=mark)
    pub.valid(encode_fpm(ForwardPassMetrics(wall_time=0.01, scheduled_requests=s)))
    rows = sink.tables.setdefault("prefill_iterations", {"t_uc": [], "duration_s": []})
    assert _wait(lambda: mark in rows.get("t_uc", [])[-50:]), col.stats
    assert col._sub.running and col.stats.handler_errors == 0 and col.num_rows_rejected == 0
    assert all(d > 0 and math.isfinite(d) for d in rows["duration_s"])
