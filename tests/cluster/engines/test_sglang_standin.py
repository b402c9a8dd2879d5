"""The SGLang stand-in over real HTTP, ZMQ and bootstrap on loopback (SPEC §6)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.engines.standin.prefix_cache import page_hashes
from cluster.engines.standin.scheduler import SchedulerConfig
from cluster.engines.standin.server import StandinEngine
from cluster.sglang.fpm_collector import ForwardMetricsCollector
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.toy_tokenizer import encode
from models import PrefillModel

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # 180 bytes = 11 full pages


def _wait(pred, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


def _collect(engine: StandinEngine) -> tuple[KVEventCollector, list[KVEvent]]:
    ep = engine.endpoints
    assert ep is not None and ep.kv_events is not None
    got: list[KVEvent] = []
    col = KVEventCollector(ep.kv_events, replay_endpoint=ep.kv_replay, callbacks=[got.extend])
    col.start()
    assert _wait(lambda: col.stats.connects >= 1)
    time.sleep(0.2)
    return col, got


def _sse(lines: list[str]) -> list[dict]:
    data = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_native_generate_caches_prefix_and_publishes_sglang_hashes() -> None:
    with StandinEngine("null") as engine:
        col, got = _collect(engine)
        url = engine.endpoints.http_url  # type: ignore[union-attr]
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6}}
        first = httpx.post(f"{url}/generate", json=body, timeout=10).json()
        second = httpx.post(f"{url}/generate", json=body, timeout=10).json()
        assert _wait(lambda: len(got) >= 1)
        time.sleep(0.1)
        col.stop()
    assert first["text"] == second["text"] and len(first["output_ids"]) == 6
    meta = first["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(encode(PROMPT)) and meta["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == 11 * 16
    stored = [h for e in got if e.kind is KVEventKind.STORED for h in e.block_hashes]
    # The prompt's 11 full pages, once, in one coalesced event with SGLang's SHA-256 chain;
    # prompt + output (185 tokens) adds no full page, the repeat request stores nothing.
    assert len(got) == 1 and stored == page_hashes(encode(PROMPT), 16)
    assert got[0].parent_hash is None and got[0].token_ids == tuple(encode(PROMPT)[:176])


def test_streaming_native_and_openai_shapes() -> None:
    with StandinEngine("null") as engine:
        url = engine.endpoints.http_url  # type: ignore[union-attr]
        with httpx.stream(
            "POST",
            f"{url}/generate",
            timeout=10,
            json={"text": "hi", "sampling_params": {"max_new_tokens": 4}, "stream": True},
        ) as r:
            chunks = _sse(list(r.iter_lines()))
        assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4]
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert chunks[0]["meta_info"]["finish_reason"] is None
        comp = httpx.post(
            f"{url}/v1/completions",
            timeout=10,
            json={"model": "m", "prompt": "hi", "max_tokens": 4},
        ).json()
        assert (
            comp["object"] == "text_completion" and comp["choices"][0]["text"] == chunks[-1]["text"]
        )
        assert comp["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 4,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            timeout=10,
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                "stream": True,
            },
        ) as r:
            cc = _sse(list(r.iter_lines()))
        assert all(c["object"] == "chat.completion.chunk" for c in cc)
        assert cc[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(c["choices"][0]["delta"]["content"] for c in cc) != ""
        bad = httpx.post(f"{url}/generate", json={"sampling_params": {}}, timeout=10)
        assert bad.status_code == 400 and "text or input_ids" in bad.json()["error"]["message"]
        info = httpx.get(f"{url}/server_info", timeout=10).json()
        assert info["kv_events"]["block_size"] == 16 and info["disaggregation_mode"] == "null"
        assert info["kv_events"]["endpoint_port_base"] == int(
            engine.endpoints.kv_events.rsplit(":", 1)[1]
        )  # type: ignore[union-attr]
        assert httpx.get(f"{url}/get_model_info", timeout=10).json()["is_generation"] is True
        assert httpx.get(f"{url}/health_generate", timeout=10).status_code == 200


def test_pd_bootstrap_decode_waits_for_its_prefill() -> None:
    prefill = StandinEngine("prefill")
    decode = StandinEngine("decode")
    null = StandinEngine("null", kv_events=False, forward_metrics=False)
    try:
        pe, de, ne = prefill.start(), decode.start(), null.start()
        assert pe.bootstrap_port is not None
        body = {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 5},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pe.bootstrap_port,
            "bootstrap_room": 4242,
        }

        async def route() -> tuple[dict, dict]:
            async with httpx.AsyncClient(timeout=20) as c:
                d_task = asyncio.create_task(c.post(f"{de.http_url}/generate", json=body))
                await asyncio.sleep(0.3)  # decode is waiting for room 4242
                assert not d_task.done()
                p = await c.post(f"{pe.http_url}/generate", json=body)
                d = await d_task
                return p.json(), d.json()

        p_out, d_out = asyncio.run(route())
        plain = httpx.post(
            f"{ne.http_url}/generate",
            timeout=10,
            json={"text": PROMPT, "sampling_params": {"max_new_tokens": 5}},
        ).json()
        missing = httpx.post(
            f"{de.http_url}/generate", timeout=10, json={"text": PROMPT, "rid": "r1"}
        )
    finally:
        for e in (prefill, decode, null):
            e.stop()
    assert p_out["meta_info"]["finish_reason"] == {"type": "length", "length": 1}
    assert d_out["output_ids"][0] == p_out["output_ids"][0]
    assert d_out["output_ids"] == plain["output_ids"]  # PD gives the collocated answer
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == (
        "Invalid request: Disaggregated request received without bootstrap room id. req.rid='r1'"
    )


def test_bootstrap_server_routes() -> None:
    with StandinEngine("prefill") as engine:
        base = f"http://127.0.0.1:{engine.endpoints.bootstrap_port}"  # type: ignore[union-attr]
        assert httpx.get(f"{base}/health").text == "OK"
        assert httpx.get(f"{base}/route").status_code == 400
        q = {
            "prefill_dp_rank": -1,
            "prefill_cp_rank": -1,
            "target_tp_rank": -1,
            "target_pp_rank": -1,
        }
        info = httpx.get(f"{base}/route", params=q).json()
        assert info["page_size"] == 16 and info["prefill_http_port"] == engine.port
        reg = {
            "attn_tp_rank": 0,
            "attn_cp_rank": 0,
            "attn_dp_rank": 0,
            "system_dp_rank": 0,
            "pp_rank": 0,
            "rank_ip": "127.0.0.1",
            "rank_port": 7000,
        }
        assert httpx.put(f"{base}/route", json=reg).text == "OK"
        q0 = dict.fromkeys(q, 0)
        assert httpx.get(f"{base}/route", params=q0).json() == {
            "rank_ip": "127.0.0.1",
            "rank_port": 7000,
        }
        httpx.post(f"{base}/register_dp_rank", json={"bootstrap_room": 9, "dp_rank": 0})
        assert httpx.post(f"{base}/query_dp_ranks", json={"bootstrap_rooms": [9, 10]}).json() == {
            "9": 0
        }
        r = httpx.get(f"{base}/standin/kv_transfer/77", params={"timeout_s": 0.1})
        assert r.status_code == 504


def test_role_switch_requires_flag_idle_and_clears_the_cache() -> None:
    with StandinEngine("null") as plain:
        url = plain.endpoints.http_url  # type: ignore[union-attr]
        r = httpx.post(f"{url}/pd_role_switch", json={"new_role": "decode"})
        assert r.status_code == 400
        assert r.json()["message"] == "--enable-pd-role-switch is not set on this server"
    with StandinEngine("null", enable_pd_role_switch=True) as collocated:
        url = collocated.endpoints.http_url  # type: ignore[union-attr]
        r = httpx.post(f"{url}/pd_role_switch", json={"new_role": "decode"})
        assert r.json()["message"] == "instance is not running in PD disaggregation mode"
    slow = SchedulerConfig(prefill_model=PrefillModel(0.3, 0.0, 0.0, 0.0))
    with StandinEngine("prefill", config=slow, enable_pd_role_switch=True) as engine:
        url = engine.endpoints.http_url  # type: ignore[union-attr]
        col, got = _collect(engine)
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1}, "bootstrap_room": 1}
        assert httpx.post(f"{url}/generate", json=body, timeout=10).status_code == 200
        assert _wait(lambda: any(e.kind is KVEventKind.STORED for e in got))
        bad = httpx.post(f"{url}/pd_role_switch", json={"new_role": "both"}).json()
        assert bad["message"] == "invalid new_role='both'" and bad["safe_to_restore"] is True
        same = httpx.post(f"{url}/pd_role_switch", json={"new_role": "prefill"})
        assert same.status_code == 200 and same.json()["message"] == "already in target role"
        busy_body = {**body, "bootstrap_room": 2, "text": "y" * 100}
        t = threading.Thread(
            target=lambda: httpx.post(f"{url}/generate", json=busy_body, timeout=10)
        )
        t.start()
        time.sleep(0.1)  # the 0.3 s prefill pass is running
        busy = httpx.post(f"{url}/pd_role_switch", json={"new_role": "decode"})
        t.join()
        no_graphs = httpx.post(f"{url}/pd_role_switch", json={"new_role": "decode"})
        too_big = httpx.post(
            f"{url}/pd_role_switch", json={"new_role": "decode", "decode_cuda_graph_memory_gb": 500}
        )
        assert not any(e.kind is KVEventKind.CLEARED for e in got)  # refusals keep the cache
        ok = httpx.post(
            f"{url}/pd_role_switch", json={"new_role": "decode", "decode_cuda_graph_memory_gb": 2.5}
        )
        assert _wait(lambda: bool(got) and got[-1].kind is KVEventKind.CLEARED)
        info = httpx.get(f"{url}/server_info").json()
        col.stop()
    assert busy.status_code == 400
    assert busy.json()["message"] == "instance is not idle; drain all requests before switching"
    assert no_graphs.json()["message"] == (
        "decode_cuda_graph_memory_gb is required before capturing decode graphs"
    )
    assert too_big.json()["message"] == (
        "insufficient decode CUDA graph headroom: required=500.000 GB, available=80.000 GB"
    )
    assert ok.status_code == 200
    assert {k: ok.json()[k] for k in ("success", "message", "old_role", "new_role")} == {
        "success": True,
        "message": "ok",
        "old_role": "prefill",
        "new_role": "decode",
    }
    assert info["disaggregation_mode"] == "decode"


def test_eviction_publishes_block_removed_and_flush_clears() -> None:
    cfg = SchedulerConfig(page_size=16, capacity_pages=20)
    with StandinEngine("null", config=cfg) as engine:
        url = engine.endpoints.http_url  # type: ignore[union-attr]
        col, got = _collect(engine)
        for i in range(4):
            r = httpx.post(
                f"{url}/generate",
                timeout=10,
                json={"text": f"{i}" * 150, "sampling_params": {"max_new_tokens": 2}},
            )
            assert r.status_code == 200
        too_big = httpx.post(
            f"{url}/generate",
            timeout=10,
            json={"text": "z" * 400, "sampling_params": {"max_new_tokens": 2}},
        )
        assert httpx.post(f"{url}/flush_cache", json={}).status_code == 200
        assert _wait(lambda: got and got[-1].kind is KVEventKind.CLEARED)
        col.stop()
        engine.scheduler.cache.check_invariants()  # type: ignore[union-attr]
    assert too_big.status_code == 400 and "KV pages" in too_big.json()["error"]["message"]
    removed = [h for e in got if e.kind is KVEventKind.REMOVED for h in e.block_hashes]
    stored = [h for e in got if e.kind is KVEventKind.STORED for h in e.block_hashes]
    assert removed and set(removed) <= set(stored)


def test_forward_metrics_match_the_passes() -> None:
    with StandinEngine("null") as engine:
        ep = engine.endpoints
        assert ep is not None and ep.forward_metrics.startswith("ipc://")  # type: ignore[union-attr]
        sink = MemorySink()
        col = ForwardMetricsCollector(ep.forward_metrics, node_id=0, sink=sink).start()  # type: ignore[arg-type]
        assert _wait(lambda: col.stats.connects >= 1)
        time.sleep(0.2)
        httpx.post(
            f"{ep.http_url}/generate",
            timeout=10,
            json={"text": "a" * 64, "sampling_params": {"max_new_tokens": 4}},
        )
        httpx.post(
            f"{ep.http_url}/generate",
            timeout=10,
            json={"text": "a" * 64 + "b" * 20, "sampling_params": {"max_new_tokens": 1}},
        )
        assert _wait(lambda: col.num_prefill_rows == 2 and col.num_decode_rows == 3)
        col.stop()
    prefill = sink.rows("prefill_iterations")
    decode = sink.rows("decode_iterations")
    assert [(r["t_uc"], r["t_c"]) for r in prefill] == [(64, 0), (20, 64)]
    assert [r["ctx_tokens"] for r in decode] == [66, 67, 68]
    fast = SchedulerConfig().prefill_model
    assert prefill[0]["duration_s"] == pytest.approx(fast.batch_time([64], [0]))
