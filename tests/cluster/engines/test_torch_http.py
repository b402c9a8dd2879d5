"""The torch engine's HTTP surface: SGLang's request and response shapes (SPEC §6)."""

from __future__ import annotations

import json

import httpx
import pytest

from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine
from cluster.wire.toy_tokenizer import chat_template, encode


@pytest.fixture(scope="module")
def url():  # type: ignore[no-untyped-def]
    with TorchEngine(EngineConfig(gpu_pages=128, host_pages=128), "null") as engine:
        assert engine.endpoints is not None
        yield engine.endpoints.http_url


def test_generate_streams_sse_with_sglang_meta_info(url: str) -> None:
    body = {"text": "hello " * 10, "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert [len(d["output_ids"]) for d in docs] == [1, 2, 3, 4]
    meta = docs[-1]["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == 60 and meta["completion_tokens"] == 4
    again = httpx.post(f"{url}/generate", json=body | {"stream": False}, timeout=30).json()
    assert again["output_ids"] == docs[-1]["output_ids"]  # greedy: the same tokens
    assert again["meta_info"]["cached_tokens"] == 48


def test_openai_routes_and_tokenize_use_the_toy_tokenizer(url: str) -> None:
    messages = [{"role": "user", "content": "hi there"}]
    tok = httpx.post(f"{url}/v1/tokenize", json={"messages": messages}, timeout=10).json()
    assert tok["tokens"] == encode(chat_template(messages))
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 3, "ignore_eos": True},
        timeout=30,
    ).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3
    assert chat["usage"]["prompt_tokens"] == len(tok["tokens"])
    comp = httpx.post(
        f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=30
    ).json()
    assert comp["object"] == "text_completion" and comp["usage"]["prompt_tokens"] == 3


def test_bad_requests_are_refused_with_what_is_allowed(url: str) -> None:
    r = httpx.post(f"{url}/generate", json={"input_ids": [1, 9999]}, timeout=10)
    assert r.status_code == 400 and "outside the vocabulary [0, 512)" in r.text
    r = httpx.post(f"{url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 400 and "max_new_tokens" in r.text
    r = httpx.post(f"{url}/pd_role_switch", json={"new_role": "decode"}, timeout=10)
    assert r.status_code == 400 and not r.json()["success"]
    r = httpx.post(f"{url}/kv_eviction", json={"policy": "fifo"}, timeout=10)
    assert r.status_code == 400 and "choose one of: branch, lru" in r.text


def test_the_eviction_policy_and_counts_are_settable(url: str) -> None:
    assert httpx.get(f"{url}/kv_eviction", timeout=10).json()["policy"] == "lru"
    r = httpx.post(
        f"{url}/kv_eviction",
        json={"policy": "branch", "branch_counts": {"123": 2, "-5": 1, "7": 0}},
        timeout=10,
    )
    assert r.status_code == 200 and r.json() == {"policy": "branch", "counted_blocks": 2}
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    assert info["kv_eviction_policy"] == "branch" and info["pd_role_switch_keeps_cache"]
    httpx.post(f"{url}/kv_eviction", json={"policy": "lru"}, timeout=10)
