"""vLLM's KV events, encoded by vLLM's own structs and encoder, collected with nothing lost.

The events are `vllm_kv_mirror`'s re-declarations of `vllm/distributed/kv_events.py`
(vllm-project/vllm 0181ea3173e5) encoded with `msgspec.msgpack.Encoder()` as vLLM's
`ZmqEventPublisher` does, and sent [topic, seq (8-byte big-endian from 0), payload] with
vLLM-style replay replies ([seq, payload], then END_SEQ). `pdlab collect kv-events` runs
on the command line (`--catch-up`, `--replay`) while the publisher drops batches from the
live stream (a slow subscriber at the high-water mark): the replay brings every one back,
sequence numbers checked, and every block lands in `kv_events` with its tier and its hash
in pdlab's signed-int64 form.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner
from vllm_kv_mirror import (
    AllBlocksCleared,
    ArrayKVEventBatch,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    as_int_hash,
    block_hash,
)

from cluster.sglang.fpm import decode_fpm
from cluster.wire.kv_events import BatchDecoder, to_int64
from cluster.wire.publisher import ZmqBatchPublisher
from telemetry import open_reader
from toolkit.cli import app

ENCODER = msgspec.msgpack.Encoder()


def _batches(n: int, int_hashes: bool) -> tuple[list[object], list[tuple[str, str, int | None]]]:
    """n batches of vLLM events and the (kind, tier, hash) rows they must become."""
    out, expected = [], []
    parent: bytes | None = None
    for i in range(n):
        tokens = list(range(16 * i, 16 * i + 16))
        h = block_hash(parent, tokens)
        wire_h = as_int_hash(h) if int_hashes else h
        wire_parent = None if parent is None else (as_int_hash(parent) if int_hashes else parent)
        events: list[object] = [
            BlockStored(
                block_hashes=[wire_h],
                parent_block_hash=wire_parent,
                token_ids=tokens,
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            )
        ]
        expected.append(("stored", "gpu", to_int64(h)))
        if i % 4 == 3:  # offloaded to CPU, then dropped from the GPU
            events.append(
                BlockStored(
                    block_hashes=[wire_h],
                    parent_block_hash=wire_parent,
                    token_ids=tokens,
                    block_size=16,
                    lora_id=None,
                    medium="CPU",
                    lora_name=None,
                )
            )
            events.append(BlockRemoved(block_hashes=[wire_h], medium="GPU"))
            expected += [("stored", "host", to_int64(h)), ("removed", "gpu", to_int64(h))]
        out.append(events)
        parent = h
    out[-1] = [*out[-1], AllBlocksCleared()]
    expected += [("cleared", "gpu", None), ("cleared", "host", None)]
    return out, expected


@pytest.mark.parametrize("batch_form", ["map", "array"])
def test_vllm_encoder_batches_decode_exactly(batch_form: str) -> None:
    batches, expected = _batches(5, int_hashes=False)
    cls = KVEventBatch if batch_form == "map" else ArrayKVEventBatch
    dec = BatchDecoder(node_id=2, run_start_wall=100.0)
    got = []
    for i, events in enumerate(batches):
        b = dec.decode(ENCODER.encode(cls(ts=100.5 + i, events=events, data_parallel_rank=1)))
        assert b.skipped == 0 and b.dp_rank == 1 and b.ts == 100.5 + i
        got += [
            (e.kind.value, e.tier or "all", h)
            for e in b.events
            for h in (e.block_hashes or (None,))
        ]
    # A clear comes as one event for every tier; kv_event_rows splits it per tier.
    assert got == [(k, t, h) for k, t, h in expected[:-2]] + [("cleared", "all", None)]


def test_int_hashes_agree_with_bytes_hashes() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES sends the int form: same directory keys."""
    b_bytes, _ = _batches(3, int_hashes=False)
    b_ints, _ = _batches(3, int_hashes=True)
    dec = BatchDecoder()
    for x, y in zip(b_bytes, b_ints, strict=True):
        ex = dec.decode(ENCODER.encode(KVEventBatch(ts=1.0, events=x))).events
        ey = dec.decode(ENCODER.encode(KVEventBatch(ts=1.0, events=y))).events
        assert [(e.block_hashes, e.parent_hash) for e in ex] == [
            (e.block_hashes, e.parent_hash) for e in ey
        ]


def test_collect_kv_events_loses_nothing_from_a_vllm_publisher(tmp_path: Path) -> None:
    n = 40
    batches, expected = _batches(n, int_hashes=False)
    pub = ZmqBatchPublisher(
        "tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", replay_style="vllm"
    )
    db = tmp_path / "vllm-kv.duckdb"

    def publish() -> None:
        for i, events in enumerate(batches):
            if i in (0, 9, 25):  # these batches never reach the SUB socket live
                pub.drop_live(3 if i else 2)
            pub.publish(ENCODER.encode(KVEventBatch(ts=time.time(), events=events)))
            time.sleep(0.01 if i else 1.0)  # the collector subscribes meanwhile

    t = threading.Thread(target=publish)
    t.start()
    try:
        res = CliRunner().invoke(
            app,
            [
                "collect",
                "kv-events",
                "--connect",
                pub.endpoint,
                "--replay",
                str(pub.replay_endpoint),
                "--db",
                str(db),
                "--node-id",
                "1",
                "--seconds",
                "3",
                "--run-id",
                "vllm-kv",
                "--catch-up",
                "--json",
            ],
        )
    finally:
        t.join()
        pub.close()
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert pub.next_seq == n
    assert summary["messages"] == n and summary["messages_lost"] == 0
    # The 8 dropped batches can only come from the replay (with the head the collector
    # missed while it started, when it joined late).
    assert summary["messages_recovered"] >= 8 and summary["gaps"] >= 1
    assert summary["skipped_events"] == 0
    rows = open_reader(db).table("kv_events", run_id="vllm-kv").sort("t", maintain_order=True)
    got = list(zip(rows["kind"], rows["tier"], rows["block_hash"], strict=True))
    assert got == expected
    assert set(rows["node_id"]) == {1}


def test_vllm_native_forward_pass_metrics_decode() -> None:
    """vLLM's own FPM (`vllm/v1/metrics/forward_pass_metrics.py`, with `timing_scope`) is
    read by the SGLang FPM decoder: same map, one extra field ignored."""

    class Scheduled(msgspec.Struct, frozen=True, gc=False):
        num_prefill_requests: int = 0
        sum_prefill_tokens: int = 0
        var_prefill_length: float = 0.0
        sum_prefill_kv_tokens: int = 0
        num_decode_requests: int = 0
        sum_decode_kv_tokens: int = 0
        var_decode_kv_tokens: float = 0.0

    class VLLMForwardPassMetrics(msgspec.Struct, frozen=True, gc=False):
        version: int = 1
        worker_id: str = ""
        dp_rank: int = 0
        counter_id: int = 0
        timing_scope: str = "execute_model_cuda"
        wall_time: float = 0.0
        scheduled_requests: Scheduled = Scheduled()

    m = decode_fpm(
        ENCODER.encode(
            VLLMForwardPassMetrics(
                worker_id="w",
                counter_id=7,
                wall_time=0.031,
                scheduled_requests=Scheduled(2, 900, 10.0, 128, 5, 4000, 3.0),
            )
        )
    )
    s = m.scheduled_requests
    assert m.wall_time == 0.031 and (s.num_prefill_requests, s.sum_prefill_tokens) == (2, 900)
    assert (s.num_decode_requests, s.sum_decode_kv_tokens) == (5, 4000)
