"""Wire compatibility with SGLang 0.5.23's own code (loaded from its wheel, no GPU, no install).

SGLang's ZmqEventPublisher and FPM publisher thread publish over ZMQ on loopback; pdlab's
collectors must decode every event and every forward pass. Encodings are compared byte for
byte in both directions, and SGLang's replay ROUTER serves pdlab's gap recovery.
"""

from __future__ import annotations

import socket
import time

import msgspec

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.engines.standin.server import StandinEngine
from cluster.sglang.fpm import ForwardPassMetrics, ScheduledRequestMetrics, encode_fpm
from cluster.sglang.fpm_collector import ForwardMetricsCollector
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.kv_events import encode_batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def _sglang_batches(kv):  # type: ignore[no-untyped-def]
    """Batches covering every event type, both media, a chained store and a foreign medium."""
    gpu, cpu = kv.StorageMedium.GPU, kv.StorageMedium.CPU
    out = []
    for i in range(6):
        base = 1000 * i
        out.append(
            kv.KVEventBatch(
                ts=time.time(),
                events=[
                    kv.BlockStored(
                        block_hashes=[base + 1, -(base + 2), 2**63 - 1 - i],
                        parent_block_hash=None if i == 0 else base - 997,
                        token_ids=list(range(48)),
                        block_size=16,
                        lora_id=None,
                        medium=gpu,
                        session_id=f"s{i}",
                    ),
                    kv.BlockStored(
                        block_hashes=[base + 7],
                        parent_block_hash=base + 1,
                        token_ids=list(range(16)),
                        block_size=16,
                        lora_id=None,
                        medium=cpu,
                    ),
                    kv.BlockRemoved(block_hashes=[base + 1, -(base + 2)], medium=gpu),
                    kv.BlockRemoved(block_hashes=[base + 9], medium=kv.StorageMedium.DISK),
                    kv.AllBlocksCleared(),
                ],
            )
        )
    return out


def _expected(batches) -> list[tuple]:  # type: ignore[no-untyped-def]
    """(kind, tier, hashes, parent, block_size) of the events pdlab must produce."""
    tier = {"GPU": "gpu", "CPU_PINNED": "host"}
    exp = []
    for b in batches:
        for e in b.events:
            name = type(e).__name__
            if name == "AllBlocksCleared":
                exp.append(("cleared", None, (), None, 0))
            elif e.medium.value not in tier:
                continue  # DISK: skipped by design
            elif name == "BlockStored":
                exp.append(
                    (
                        "stored",
                        tier[e.medium.value],
                        tuple(e.block_hashes),
                        e.parent_block_hash,
                        e.block_size,
                    )
                )
            else:
                exp.append(("removed", tier[e.medium.value], tuple(e.block_hashes), None, 0))
    return exp


def _got(events: list[KVEvent]) -> list[tuple]:
    return [(e.kind.value, e.tier, e.block_hashes, e.parent_hash, e.block_tokens) for e in events]


def test_sglang_publisher_to_pdlab_collector_decodes_every_event(sglang_modules) -> None:  # type: ignore[no-untyped-def]
    kv = sglang_modules["kv_events"]
    port, replay_port = _free_port(), _free_port()
    pub = kv.ZmqEventPublisher(
        attn_dp_rank=0,
        endpoint=f"tcp://127.0.0.1:{port}",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
        topic="kv@node7",
        bind=True,
    )
    got: list[KVEvent] = []
    sink = MemorySink()
    col = KVEventCollector(
        f"tcp://127.0.0.1:{port}",
        node_id=7,
        topic="kv@node7",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
        callbacks=[got.extend],
        sink=sink,
        catch_up=True,
    )
    try:
        batches = _sglang_batches(kv)
        # The first three go out before anyone listens: only SGLang's replay ROUTER has them.
        for b in batches[:3]:
            pub.publish(b)
        time.sleep(0.3)
        col.start()
        assert _wait(lambda: col.stats.connects >= 1)
        time.sleep(0.2)
        for b in batches[3:]:
            pub.publish(b)
        n_expected = len(_expected(batches))
        assert _wait(lambda: len(got) >= n_expected), (col.stats, len(got))
    finally:
        col.stop()
        pub.shutdown()
    assert _got(got) == _expected(batches)
    assert col.stats.messages == 6 and col.stats.messages_recovered == 3
    assert col.stats.gaps_recovered == 1 and col.stats.messages_lost == 0
    assert col.stats.malformed == 0 and col.num_skipped == 6  # one DISK removal per batch
    assert all(e.node_id == 7 for e in got)
    stored = [e for e in got if e.kind is KVEventKind.STORED]
    assert stored[0].token_ids == tuple(range(48))
    rows = sink.rows("kv_events")
    assert len(rows) == sum(max(1, len(e.block_hashes)) * (2 if e.tier is None else 1) for e in got)


def test_pdlab_and_sglang_encode_identical_bytes(sglang_modules) -> None:  # type: ignore[no-untyped-def]
    kv = sglang_modules["kv_events"]
    ts = 1_700_000_000.25
    theirs = kv.KVEventBatch(
        ts=ts,
        events=[
            kv.BlockStored(
                block_hashes=[5, -6],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium=kv.StorageMedium.GPU,
            ),
            kv.BlockRemoved(block_hashes=[5], medium=kv.StorageMedium.CPU),
            kv.AllBlocksCleared(),
        ],
        attn_dp_rank=0,
    )
    ours = [
        KVEvent(0.0, 0, KVEventKind.STORED, "gpu", (5, -6), None, 2, (1, 2, 3, 4)),
        KVEvent(0.0, 0, KVEventKind.REMOVED, "host", (5,)),
        KVEvent(0.0, 0, KVEventKind.CLEARED, None),
    ]
    their_bytes = msgspec.msgpack.encode(theirs)
    assert encode_batch(ours, ts, dp_rank=0, fmt="sglang") == their_bytes
    decoded = msgspec.msgpack.Decoder(kv.KVEventBatch).decode(encode_batch(ours, ts, 0))
    assert [type(e).__name__ for e in decoded.events] == [
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
    ]
    assert decoded.events[1].medium == "CPU_PINNED"


def test_sglang_forward_pass_metrics_reach_iteration_rows(sglang_modules) -> None:  # type: ignore[no-untyped-def]
    fpm = sglang_modules["forward_pass_metrics"]
    sched = fpm.ScheduledRequestMetrics(
        num_prefill_requests=3,
        sum_prefill_tokens=300,
        var_prefill_length=200.0,
        sum_prefill_kv_tokens=120,
    )
    theirs = fpm.ForwardPassMetrics(worker_id="w0", wall_time=0.02, scheduled_requests=sched)
    ours = ForwardPassMetrics(
        worker_id="w0",
        wall_time=0.02,
        scheduled_requests=ScheduledRequestMetrics(
            num_prefill_requests=3,
            sum_prefill_tokens=300,
            var_prefill_length=200.0,
            sum_prefill_kv_tokens=120,
        ),
    )
    assert fpm.encode(theirs) == encode_fpm(ours)
    assert fpm.decode(encode_fpm(ours)) == theirs

    port = _free_port()
    pub = fpm._FpmPublisherThread(f"tcp://127.0.0.1:{port}", worker_id="w0", dp_rank=0)
    sink = MemorySink()
    col = ForwardMetricsCollector(f"tcp://127.0.0.1:{port}", node_id=2, sink=sink).start()
    try:
        assert _wait(lambda: col.stats.connects >= 1)
        time.sleep(0.3)
        decode_sched = fpm.ScheduledRequestMetrics(num_decode_requests=8, sum_decode_kv_tokens=4096)
        for _ in range(5):
            pub.publish(theirs)
            pub.publish(fpm.ForwardPassMetrics(wall_time=0.004, scheduled_requests=decode_sched))
        pub.set_idle(True)
        assert _wait(lambda: col.num_decode_rows >= 5 and col.num_prefill_rows >= 5)
        assert _wait(lambda: col.num_heartbeats >= 1, 3.0)  # SGLang's idle heartbeat, skipped
    finally:
        col.stop()
        pub.shutdown()
    prefill = sink.rows("prefill_iterations")
    decode = sink.rows("decode_iterations")
    assert len(prefill) == 5 and len(decode) == 5
    assert prefill[0]["t_uc"] == 300 and prefill[0]["t_c"] == 120 and prefill[0]["num_reqs"] == 3
    assert prefill[0]["duration_s"] == 0.02
    assert decode[0]["batch_size"] == 8 and decode[0]["ctx_tokens"] == 4096
    assert sorted(r["iter_id"] for r in prefill + decode) == list(range(10))


def test_sglang_decoders_accept_the_standin_streams(sglang_modules) -> None:  # type: ignore[no-untyped-def]
    """The SGLang stand-in's KV events and FPM decode with SGLang's own typed decoders."""
    import httpx
    import zmq

    kv, fpm = sglang_modules["kv_events"], sglang_modules["forward_pass_metrics"]
    with StandinEngine("null") as engine:
        ep = engine.endpoints
        assert ep is not None and ep.kv_events and ep.forward_metrics
        ctx = zmq.Context()
        subs = []
        for endpoint in (ep.kv_events, ep.forward_metrics):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(endpoint)
            subs.append(s)
        time.sleep(0.3)
        httpx.post(
            f"{ep.http_url}/generate",
            json={"text": "x" * 100, "sampling_params": {"max_new_tokens": 3}},
            timeout=10,
        )
        httpx.post(f"{ep.http_url}/flush_cache", json={}, timeout=10)
        kv_dec = msgspec.msgpack.Decoder(kv.KVEventBatch)
        kinds = []
        while subs[0].poll(500):
            _, _seq, payload = subs[0].recv_multipart()
            kinds += [type(e).__name__ for e in kv_dec.decode(payload).events]
        passes = []
        while subs[1].poll(300):
            _, _seq, payload = subs[1].recv_multipart()
            passes.append(fpm.decode(payload))
        for s in subs:
            s.close(linger=0)
        ctx.term()
    assert "BlockStored" in kinds and kinds[-1] == "AllBlocksCleared"
    work = [p for p in passes if p.wall_time > 0]
    assert work[0].scheduled_requests.num_prefill_requests == 1
    assert work[0].scheduled_requests.sum_prefill_tokens == 100
    assert sum(p.scheduled_requests.num_decode_requests for p in work) == 2
