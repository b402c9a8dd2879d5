"""Fault tests of the KV event collector on loopback: nothing already received is lost.

Publisher restart (sequence reset), a dropped TCP connection (a loopback proxy is cut while
the publisher keeps sending), malformed frames, and sequence gaps recovered through the
replay ROUTER (SGLang- and vLLM-style replies); rows end in DuckDB via TelemetryWriter.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.kv_events import encode_batch
from cluster.wire.publisher import ZmqBatchPublisher
from telemetry import TelemetryWriter, open_reader


def _wait(pred, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


def _batch(i: int) -> bytes:
    ev = KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (i,), None if i == 0 else i - 1, 16)
    return encode_batch([ev], ts=time.time())


def _hashes(events: list[KVEvent]) -> list[int]:
    return [h for e in events for h in e.block_hashes]


def _start(pub: ZmqBatchPublisher, **kw) -> tuple[KVEventCollector, list[KVEvent]]:  # type: ignore[no-untyped-def]
    got: list[KVEvent] = []
    col = KVEventCollector(
        kw.pop("endpoint", pub.endpoint),
        replay_endpoint=pub.replay_endpoint,
        callbacks=[got.extend],
        **kw,
    ).start()
    assert _wait(lambda: col.stats.connects >= 1)
    time.sleep(0.2)  # let the subscription reach the publisher (ZMQ slow joiner)
    return col, got


def test_gap_is_recovered_in_order_through_replay() -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    col, got = _start(pub)
    try:
        for i in range(10):
            if i == 3:
                pub.drop_live(4)  # seq 3..6 never reach the SUB socket
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 10)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == list(range(10))
    s = col.stats
    assert (s.gaps, s.gaps_recovered, s.messages_recovered, s.messages_lost) == (1, 1, 4, 0)


def test_vllm_style_replay_replies_are_understood() -> None:
    pub = ZmqBatchPublisher(
        "tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", replay_style="vllm"
    )
    col, got = _start(pub)
    try:
        for i in range(5):
            if i == 1:
                pub.drop_live(2)
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 5)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == list(range(5)) and col.stats.messages_recovered == 2


def test_gap_without_replay_is_counted_as_lost() -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0")
    col, got = _start(pub)
    try:
        pub.publish(_batch(0))
        pub.drop_live(3)
        for i in range(1, 6):
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 3)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == [0, 4, 5] and col.stats.messages_lost == 3


def test_publisher_restart_resets_sequence_and_recovers_the_new_head() -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    endpoint, replay = pub.endpoint, pub.replay_endpoint
    col, got = _start(pub)
    try:
        for i in range(5):
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 5)
        pub.close()
        # Same endpoints, a new process's counter from 0; its first two batches go out
        # before the subscriber has reconnected and are only in the new replay buffer.
        pub = ZmqBatchPublisher(endpoint, replay_endpoint=replay)
        pub.drop_live(2)
        pub.publish(_batch(100))
        pub.publish(_batch(101))
        assert _wait(lambda: col.stats.connects >= 2)
        time.sleep(0.2)
        for i in range(102, 105):
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 10)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
    assert col.stats.restarts == 1 and col.stats.messages_lost == 0
    assert col.stats.disconnects >= 1


def test_malformed_frames_are_counted_and_skipped() -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    col, got = _start(pub)
    try:
        pub.publish(_batch(0))
        pub.send_raw([b"", b"\x00" * 8])  # two frames
        pub.send_raw([b"", b"\x01\x02", b"x"])  # short seq
        pub.send_raw([b"", b"\x00" * 8, b"\x00", b"extra"])  # four frames
        pub.publish(b"\xc1 not msgpack")  # a sequenced batch that does not decode
        pub.publish(_batch(2))
        assert _wait(lambda: len(got) == 2 and col.stats.malformed == 4)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == [0, 2]
    assert col.stats.messages_lost == 0 and col.stats.handler_errors == 0


def test_topic_filter_drops_other_topics() -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0", topic="kv")
    col, got = _start(pub, topic="kv")
    try:
        pub.send_raw([b"load", b"\x00" * 8, _batch(9)])  # another topic: never delivered
        pub.publish(_batch(0))
        assert _wait(lambda: len(got) == 1)
    finally:
        col.stop()
        pub.close()
    assert _hashes(got) == [0] and col.stats.malformed == 0


class _Proxy:
    """A loopback TCP forwarder whose connections can be cut and restored."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepting = True
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.accepting:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.accepting = False
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns.clear()

    def close(self) -> None:
        self.stopped = True
        self.cut()
        self.listener.close()


def test_dropped_connection_reconnects_and_replays_the_outage(tmp_path: Path) -> None:
    pub = ZmqBatchPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    proxy = _Proxy(int(pub.endpoint.rsplit(":", 1)[1]))
    db = tmp_path / "t.duckdb"
    start = time.time()
    writer = TelemetryWriter(db, source="sglang", started_at=None)
    writer.add_nodes(
        {"node_id": [5], "name": ["n5"], "hardware": ["cpu"], "moe_top_k": [0], "moe_experts": [0]}
    )
    sink = MemorySink()

    class Both:
        def emit(self, table, columns):  # type: ignore[no-untyped-def]
            writer.emit(table, columns)
            sink.emit(table, columns)

    col, got = _start(
        pub, endpoint=f"tcp://127.0.0.1:{proxy.port}", node_id=5, sink=Both(), run_start_wall=start
    )
    try:
        for i in range(3):
            pub.publish(_batch(i))
        assert _wait(lambda: len(got) == 3)
        proxy.cut()
        assert _wait(lambda: col.stats.disconnects >= 1)
        for i in range(3, 8):  # sent while the subscriber is cut off: lost on the wire
            pub.publish(_batch(i))
        time.sleep(0.1)
        proxy.accepting = True
        assert _wait(lambda: col.stats.connects >= 2)
        time.sleep(0.2)
        pub.publish(_batch(8))
        assert _wait(lambda: len(got) == 9)
    finally:
        col.stop()
        proxy.close()
        pub.close()
        writer.close()
    assert _hashes(got) == list(range(9))
    assert col.stats.messages_recovered == 5 and col.stats.messages_lost == 0
    reader = open_reader(db)
    rows = reader.table("kv_events")
    assert rows.height == 9
    assert sorted(rows["block_hash"].to_list()) == list(range(9))
    assert set(rows["node_id"].to_list()) == {5} and min(rows["t"].to_list()) >= 0.0
    parents = dict(zip(rows["block_hash"].to_list(), rows["parent_hash"].to_list(), strict=True))
    assert parents == {0: None} | {i: i - 1 for i in range(1, 9)}
