"""The collectors under hostile msgpack: deep nesting and integers at the edge of 64 bits.

The probe's messages (integers >= 2^63, msgpack nested 100k deep) were dropped and counted,
but each logged a traceback. Now each is one warning line: counted as malformed (or as rows
the telemetry writer refused), no handler error, and the collector keeps serving. The
messages go through the subscriber's delivery path (what its thread calls for each message)
into a real TelemetryWriter; the socket path is fuzzed by test_fuzz_zmq.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.core import KVEvent, KVEventKind
from cluster.sglang.wire.fpm import ForwardPassMetrics, ScheduledRequestMetrics, encode_fpm
from cluster.sglang.wire.fpm_collector import ForwardMetricsCollector
from cluster.sglang.wire.kv_collector import KVEventCollector
from cluster.sglang.wire.kv_events import encode_batch
from telemetry import TelemetryWriter

NODES = {"node_id": [0], "name": ["n0"], "hardware": ["cpu"], "moe_top_k": [0], "moe_experts": [0]}
edge_ints = st.one_of(st.integers(2**63 - 2, 2**64 - 1), st.integers(-(2**63), -(2**63) + 2))


def _deep(depth: int, leaf: bytes = b"\xc0") -> bytes:
    return b"\x91" * depth + leaf  # fixarray of one element, `depth` times


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TelemetryWriter]:
    w = TelemetryWriter(tmp_path_factory.mktemp("col") / "c.duckdb", flush_interval_s=3600)
    w.add_nodes(NODES)
    yield w
    w.close()


@pytest.fixture(scope="module")
def collectors(
    writer: TelemetryWriter,
) -> tuple[KVEventCollector, ForwardMetricsCollector]:
    # Not started: messages are handed to the delivery path directly (no socket needed).
    kv = KVEventCollector("tcp://127.0.0.1:1", sink=writer, callbacks=[lambda ev: None])
    fpm = ForwardMetricsCollector("tcp://127.0.0.1:1", sink=writer)
    return kv, fpm


def _no_tracebacks(records: list[logging.LogRecord]) -> None:
    assert all(r.exc_info is None for r in records), [r.getMessage() for r in records]
    assert all("\n" not in r.getMessage() for r in records)


def _kv_payload(value: int, where: str) -> bytes:
    event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
             "token_ids": [1, 2], "block_size": 16, "medium": "GPU"}  # fmt: skip
    if where == "ts":
        return msgspec.msgpack.encode([value, [event], 0])
    if where == "dp":
        return msgspec.msgpack.encode([time.time(), [event], value])
    event[where] = [value] if where in ("block_hashes", "token_ids") else value
    return msgspec.msgpack.encode([time.time(), [event], 0])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    value=edge_ints,
    where=st.sampled_from(
        ["ts", "dp", "block_hashes", "token_ids", "block_size", "parent_block_hash"]
    ),
    depth=st.integers(1_000, 200_000),
)
def test_kv_collector_one_line_per_bad_message(
    collectors: tuple[KVEventCollector, ForwardMetricsCollector],
    caplog: pytest.LogCaptureFixture,
    value: int,
    where: str,
    depth: int,
) -> None:
    kv, _ = collectors
    caplog.clear()
    with caplog.at_level(logging.INFO):
        kv._sub._deliver(1, _kv_payload(value, where), False)
        kv._sub._deliver(2, _deep(depth), False)
        good = KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (7,), None, 16)
        before = kv.num_events
        kv._sub._deliver(3, encode_batch([good], ts=time.time()), False)
    _no_tracebacks(caplog.records)
    assert kv.stats.handler_errors == 0 and kv.num_events == before + 1


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    value=edge_ints,
    field=st.sampled_from(
        [
            "num_prefill_requests",
            "sum_prefill_tokens",
            "num_decode_requests",
            "sum_decode_kv_tokens",
        ]
    ),
    depth=st.integers(1_000, 200_000),
)
def test_fpm_collector_one_line_per_bad_message(
    collectors: tuple[KVEventCollector, ForwardMetricsCollector],
    caplog: pytest.LogCaptureFixture,
    value: int,
    field: str,
    depth: int,
) -> None:
    _, fpm = collectors
    caplog.clear()
    raw = msgspec.to_builtins(ForwardPassMetrics(wall_time=0.01))
    raw["scheduled_requests"][field] = value
    with caplog.at_level(logging.INFO):
        fpm._sub._deliver(1, msgspec.msgpack.encode(raw), False)
        fpm._sub._deliver(2, _deep(depth, msgspec.msgpack.encode(raw)), False)
        fpm._sub._deliver(3, b"\x81\xa1a" + _deep(depth), False)  # {"a": [[[...]]]}
        rows = fpm.num_prefill_rows
        s = ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=64)
        fpm._sub._deliver(
            4, encode_fpm(ForwardPassMetrics(wall_time=0.01, scheduled_requests=s)), False
        )
    _no_tracebacks(caplog.records)
    assert fpm.stats.handler_errors == 0 and fpm.num_prefill_rows == rows + 1


def test_probe_collectors_log_one_line(
    collectors: tuple[KVEventCollector, ForwardMetricsCollector],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """The probe's two messages: a uint64 token count and msgpack nested 100k deep."""
    kv, fpm = collectors
    malformed = kv.stats.malformed + fpm.stats.malformed
    s = ScheduledRequestMetrics(num_prefill_requests=1, sum_prefill_tokens=2**64 - 1)
    with caplog.at_level(logging.INFO):
        fpm._sub._deliver(
            11, encode_fpm(ForwardPassMetrics(wall_time=0.01, scheduled_requests=s)), False
        )
        kv._sub._deliver(11, _deep(100_000), False)
        kv._sub._deliver(12, _kv_payload(2**64 - 1, "token_ids"), False)
    _no_tracebacks(caplog.records)
    assert kv.stats.malformed + fpm.stats.malformed == malformed + 2
    assert kv.num_rows_rejected >= 1  # the uint64 token id: refused by the writer, one line
    assert kv.stats.handler_errors == 0 and fpm.stats.handler_errors == 0
