"""The torch engine's KV events and forward-pass metrics on the wire (SPEC §3, §6).

SGLang 0.5.23's own decoders (from its wheel) read both streams; pdlab's collectors turn
them into iteration rows whose ΣA and t_rst are the engine's exact figures and whose
experts_active is the mean number of distinct experts per MoE layer.
"""

from __future__ import annotations

import time

import httpx
import msgspec
import zmq

from cluster.core import MemorySink
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine
from cluster.kv.directory import KVDirectory
from cluster.kv.hashing import token_block_hashes
from cluster.sglang.fpm import DetailedForwardPassMetrics, decode_fpm, iteration_rows
from cluster.sglang.fpm_collector import ForwardMetricsCollector
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.toy_tokenizer import encode


def _wait(pred, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def _drain(sock: zmq.Socket, wait_ms: int = 500) -> list[bytes]:
    out = []
    while sock.poll(wait_ms):
        out.append(sock.recv_multipart()[2])
    return out


def test_sglang_decoders_read_the_engine_streams(sglang_modules) -> None:  # type: ignore[no-untyped-def]
    kv, fpm = sglang_modules["kv_events"], sglang_modules["forward_pass_metrics"]
    cfg = EngineConfig(page_size=16, gpu_pages=8, host_pages=32)
    with TorchEngine(cfg, "null") as engine:
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
        prompt = "x" * 100
        for text in (prompt, "y" * 90, prompt + "z"):  # the second evicts; the third restores
            body = {"text": text, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
            assert httpx.post(f"{ep.http_url}/generate", json=body, timeout=30).status_code == 200
        assert httpx.post(f"{ep.http_url}/flush_cache", json={}, timeout=10).status_code == 200
        kv_payloads, fpm_payloads = _drain(subs[0]), _drain(subs[1], 300)
        for s in subs:
            s.close(linger=0)
        ctx.term()
    dec = msgspec.msgpack.Decoder(kv.KVEventBatch)
    events = [e for p in kv_payloads for e in dec.decode(p).events]
    media = {(type(e).__name__, str(getattr(e, "medium", None))) for e in events}
    assert {("BlockStored", "GPU"), ("BlockStored", "CPU_PINNED"), ("BlockRemoved", "GPU")} <= media
    assert type(events[-1]).__name__ == "AllBlocksCleared"  # flush_cache, not a role switch
    stored = [e for e in events if type(e).__name__ == "BlockStored"]
    assert stored[0].block_hashes[:6] == token_block_hashes(encode(prompt), 16)[:6]
    assert stored[0].parent_block_hash is None and stored[0].block_size == 16
    theirs = [fpm.decode(p) for p in fpm_payloads]
    ours = [decode_fpm(p) for p in fpm_payloads]
    work = [(t, o) for t, o in zip(theirs, ours, strict=True) if t.wall_time > 0]
    prefill = [(t, o) for t, o in work if t.scheduled_requests.num_prefill_requests]
    assert [t.scheduled_requests.sum_prefill_tokens for t, _ in prefill] == [100, 90, 5]
    assert prefill[2][0].scheduled_requests.sum_prefill_kv_tokens == 96
    assert sum(t.scheduled_requests.num_decode_requests for t, _ in work) == 6
    assert all(isinstance(o, DetailedForwardPassMetrics) and o.pdlab for _, o in work)
    # The third prompt's 96 cached tokens came back from the host tier in its pass.
    detail = prefill[2][1].pdlab
    assert detail is not None and detail.t_rst > 0
    assert detail.attn_pairs == 5 * 96 + 5 * 6 / 2
    experts = detail.experts_per_layer
    assert experts is not None and len(experts) == cfg.model.num_layers
    assert all(cfg.model.top_k <= e <= cfg.model.num_experts for e in experts)
    row, _ = iteration_rows(prefill[2][1], 10.0)
    assert row is not None and row.t_rst == detail.t_rst and row.attn_pairs == detail.attn_pairs
    assert row.experts_active == sum(experts) / len(experts)


def test_collectors_build_directory_and_exact_rows_from_the_engine() -> None:
    cfg = EngineConfig(page_size=16, gpu_pages=64, host_pages=64)
    sink = MemorySink()
    with TorchEngine(cfg, "null") as engine:
        ep = engine.endpoints
        assert ep is not None and ep.kv_events and ep.forward_metrics
        directory = KVDirectory(16)
        kv = KVEventCollector(
            ep.kv_events, node_id=0, replay_endpoint=ep.kv_replay, sink=sink,
            callbacks=[directory.apply_all], catch_up=True,
        ).start()  # fmt: skip
        fpm = ForwardMetricsCollector(ep.forward_metrics, node_id=0, sink=sink).start()
        try:
            assert _wait(lambda: kv.stats.connects >= 1 and fpm.stats.connects >= 1)
            time.sleep(0.3)
            ids = list(range(1, 70))
            for extra in ([], [200, 201, 202] * 10):
                body = {"input_ids": ids + extra, "sampling_params": {"max_new_tokens": 4}}
                r = httpx.post(f"{ep.http_url}/generate", json=body, timeout=30)
                assert r.status_code == 200
            second = r.json()["meta_info"]
            assert _wait(lambda: fpm.num_decode_rows >= 6 and fpm.num_prefill_rows >= 2)
            path = token_block_hashes(ids, 16)
            assert _wait(lambda: directory.prefix_lengths(path, [0])[0] == len(path))
        finally:
            kv.stop()
            fpm.stop()
    assert second["cached_tokens"] == 64
    pre = sink.rows("prefill_iterations")
    assert [(r["t_uc"], r["t_c"]) for r in pre] == [(69, 0), (35, 64)]
    assert pre[1]["attn_pairs"] == 35 * 64 + 35 * 36 / 2  # exact, not the FPM estimate
    dec = sink.rows("decode_iterations")
    assert all(r["batch_size"] == 1 and r["experts_active"] >= cfg.model.top_k for r in dec)
    stored = directory.node_holdings(0)
    assert stored and all(bits == 3 for bits in stored.values())  # device + host (written through)
