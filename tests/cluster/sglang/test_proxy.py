"""The PD proxy over real HTTP against SGLang stand-ins on loopback (SPEC §6 data plane).

Bootstrap protocol (same body and room to prefill and decode), SSE passthrough, branch
identity from headers and branch finish (Alg. E.1/E.2 counts in the control plane), health
checks and retries on another prefill engine.
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from fastapi import FastAPI, Request

from cluster.kv.hashing import token_block_hashes
from cluster.wire.toy_tokenizer import encode

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6  # 270 bytes, 16 full pages


def _sse(lines: list[str]) -> list[dict | str]:
    data = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def _received(url: str) -> list[dict]:
    return httpx.get(f"{url}/standin/requests", timeout=10).json()["requests"]


def test_both_servers_get_the_same_body_and_bootstrap_room(live_cluster) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster(router="round-robin")
    rooms = {}
    for i in range(6):
        r = httpx.post(
            f"{h.url}/generate",
            json={"text": f"{i} {PROMPT}", "sampling_params": {"max_new_tokens": 4}},
            timeout=20,
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["output_ids"]) == 4
        rooms[int(r.headers["x-pd-bootstrap-room"])] = int(r.headers["x-pd-prefill-node"])
    assert len(rooms) == 6 and all(0 <= room < 1 << 63 for room in rooms)
    assert Counter(rooms.values()) == {0: 3, 1: 3}  # round-robin over both prefill engines
    got = [_received(e.endpoints.http_url) for e in h.engines]
    decode = {r["bootstrap_room"]: r for r in got[2]}
    for node in (0, 1):
        eng = h.engines[node].endpoints
        for r in got[node]:
            assert r["role"] == "prefill" and rooms[r["bootstrap_room"]] == node
            # The decode server got the same room, pointing at this prefill's bootstrap server.
            d = decode[r["bootstrap_room"]]
            assert d["role"] == "decode" and d["num_input_tokens"] == r["num_input_tokens"]
            assert (d["bootstrap_host"], d["bootstrap_port"]) == ("127.0.0.1", eng.bootstrap_port)
            assert (r["bootstrap_host"], r["bootstrap_port"]) == ("127.0.0.1", eng.bootstrap_port)
    assert set(decode) == set(rooms)


def test_streams_pass_through_for_native_and_chat_routes(live_cluster) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster()
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 5}, "stream": True}
    with httpx.stream("POST", f"{h.url}/generate", json=body, timeout=20) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    # Non-streamed, the same prompt gives the decode server's full answer unchanged.
    plain = httpx.post(f"{h.url}/generate", json=body | {"stream": False}, timeout=20).json()
    assert plain["output_ids"] == chunks[-1]["output_ids"] and plain["text"] == chunks[-1]["text"]
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{h.url}/v1/chat/completions", json=chat, timeout=20) as r:
        cc = _sse(list(r.iter_lines()))
    assert cc[-1] == "[DONE]"
    deltas = [c for c in cc if isinstance(c, dict)]
    assert all(c["object"] == "chat.completion.chunk" for c in deltas) and len(deltas) == 4
    assert deltas[-1]["usage"]["completion_tokens"] == 4
    comp = httpx.post(
        f"{h.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}, timeout=20
    ).json()
    assert comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] == 3
    with h.cluster.lock:
        proxy = h.cluster.proxy
        assert proxy.num_requests == 4 and proxy.num_errors == 0
        assert all(proxy.outstanding(n) == 0 for n in range(3))


def test_branch_headers_drive_counts_and_finish_releases_them(live_cluster) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster()
    cp = h.cluster.cp

    def gen(text: str, **headers: str) -> httpx.Response:
        r = httpx.post(
            f"{h.url}/generate",
            json={"text": text, "sampling_params": {"max_new_tokens": 2}},
            headers={k.replace("_", "-"): v for k, v in headers.items()},
            timeout=20,
        )
        assert r.status_code == 200, r.text
        return r

    first = gen(PROMPT, X_Branch_Id="a", X_Program_Id="prog")
    node = int(first.headers["x-pd-prefill-node"])
    gen(PROMPT + " and more text here", X_Branch_Id="a")  # append: same branch, same version
    gen(PROMPT + " a fork", X_Branch_Id="b", X_Parent_Branch_Id="a")  # kind defaults to fork
    gen("a sub-agent with its own context", X_Branch_Id="c", X_Parent_Branch_Id="a",
        X_Branch_Kind="subagent")  # fmt: skip
    gen(PROMPT)  # anonymous: a one-request branch, finished with its request
    path = token_block_hashes(encode(PROMPT), cp.config.block_tokens)
    with cp.lock:
        assert set(cp.active_branches()) == {"a", "b", "c"}
        a, b = cp.branch("a"), cp.branch("b")
        assert a is not None and b is not None
        assert (a.program_id, b.program_id, a.version) == ("prog", "prog", 1)
        cp.check_invariants()
        shared = [cp.block_count(node, blk) for blk in path]
    # a and b both reference the shared prompt's blocks on the prefill node; the anonymous
    # request is finished (and the decode node, without a prefix cache, counts nothing
    # it does not hold).
    assert shared == [2] * len(path)
    r = httpx.post(f"{h.url}/v1/branches/b/finish", timeout=10)
    assert r.status_code == 200 and r.json()["finished"] is True
    with cp.lock:
        assert [cp.block_count(node, blk) for blk in path] == [1] * len(path)
    assert httpx.post(f"{h.url}/v1/branches/b/finish", timeout=10).status_code == 404
    bad = httpx.post(
        f"{h.url}/generate",
        json={"text": "x"},
        headers={"X-Branch-Id": "d", "X-Branch-Kind": "sideways"},
        timeout=10,
    )
    assert bad.status_code == 400 and "start, fork, subagent" in bad.json()["error"]["message"]
    orphan = httpx.post(
        f"{h.url}/generate", json={"text": "x"}, headers={"X-Branch-Kind": "fork"}, timeout=10
    )
    assert orphan.status_code == 400 and "x-parent-branch-id" in orphan.text
    batch = httpx.post(f"{h.url}/generate", json={"text": ["x", "y"]}, timeout=10)
    assert batch.status_code == 400 and "one prompt" in batch.text
    info = httpx.get(f"{h.url}/v1/branches/a", timeout=10).json()
    assert info["program_id"] == "prog" and info["nodes"]


def test_a_dead_prefill_engine_is_marked_down_and_requests_retry(live_cluster, until) -> None:  # type: ignore[no-untyped-def]
    # Health checks far apart: the request path itself must notice the dead engine.
    h = live_cluster(router="round-robin", health_interval_s=30.0)
    dead = h.engines[0]
    dead.stop()  # connection refused from now on
    h.engines[0] = None
    statuses = []
    for i in range(4):
        r = httpx.post(
            f"{h.url}/generate",
            json={"text": f"{i} {PROMPT}", "sampling_params": {"max_new_tokens": 3}},
            timeout=20,
        )
        statuses.append(
            (r.status_code, r.headers.get("x-pd-prefill-node"), r.headers.get("x-pd-attempts"))
        )
    assert all(s == 200 for s, _, _ in statuses)
    assert {p for _, p, _ in statuses} == {"1"}
    assert statuses[0][2] == "2" and all(a == "1" for _, _, a in statuses[1:])
    nodes = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"]
    assert nodes[0]["healthy"] is False and nodes[0]["out_of_service"] is True
    assert "ConnectError" in nodes[0]["last_error"]
    with h.cluster.lock:
        assert 0 in h.cluster.cp.unavailable_nodes() and h.cluster.proxy.num_retries == 1


def test_health_checks_mark_engines_down_and_up_again(live_cluster, until) -> None:  # type: ignore[no-untyped-def]
    from cluster.engines.standin.server import StandinEngine

    h = live_cluster(health_interval_s=0.1, health_failures=2)
    port = h.engines[1].port
    h.engines[1].stop()
    cp = h.cluster.cp
    assert until(lambda: 1 in cp.unavailable_nodes(), 5.0)
    assert httpx.get(f"{h.url}/health", timeout=10).status_code == 200  # node 0 still serves
    h.engines[1] = StandinEngine("prefill", port=port, enable_pd_role_switch=True)
    h.engines[1].start()
    assert until(lambda: 1 not in cp.unavailable_nodes(), 5.0)
    h.engines[2].stop()  # the only decode engine
    h.engines[2] = None
    assert until(lambda: 2 in cp.unavailable_nodes(), 5.0)
    r = httpx.get(f"{h.url}/health", timeout=10)
    assert r.status_code == 503 and r.json()["decode"] == []
    r = httpx.post(f"{h.url}/generate", json={"text": "hello"}, timeout=10)
    assert r.status_code == 503 and "no decode node is available" in r.json()["error"]["message"]


@pytest.mark.parametrize("tokenizer", ["engine", "toy"])
def test_request_paths_match_the_blocks_the_engine_stored(
    live_cluster, until, tokenizer: str
) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster(("prefill", "decode"), tokenizer=tokenizer)
    cp = h.cluster.cp
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    assert httpx.post(f"{h.url}/v1/chat/completions", json=chat, timeout=20).status_code == 200
    assert until(lambda: cp.node_blocks(0) > 0)
    from cluster.wire.toy_tokenizer import chat_template

    path = token_block_hashes(encode(chat_template(chat["messages"])), cp.config.block_tokens)
    with cp.lock:
        cached = cp.cached_prefix(path, 0)
    assert cached == len(path) > 0
    # The second identical request is routed with its whole prefix cached on node 0.
    assert httpx.post(f"{h.url}/v1/chat/completions", json=chat, timeout=20).status_code == 200
    h.close()
    from telemetry import open_reader

    rows = open_reader(h.db).table("router_decisions").sort("t")
    assert rows["cached_tokens"].to_list() == [0, len(path) * cp.config.block_tokens]


def test_idle_engine_connections_are_dropped_before_the_server_closes_them() -> None:
    """The proxy's engine connections are reused while busy, and an idle one is dropped after
    KEEPALIVE_EXPIRY_S, before an engine's HTTP server closes it (uvicorn's keep-alive
    timeout, 5 s in SGLang): a request sent on a connection the server is closing fails
    with a read error, which marked a healthy engine down (a 503 burst in a live test)."""
    import asyncio

    from cluster.engines.shell.loopback import LoopbackServer
    from cluster.live.engine_calls import KEEPALIVE_EXPIRY_S, EngineCalls

    app = FastAPI()

    @app.get("/port")
    async def port(request: Request) -> dict[str, int]:
        assert request.client is not None
        return {"port": request.client.port}  # the client side of the connection

    server = LoopbackServer(app, "127.0.0.1", 0)
    server.start()
    url = f"http://127.0.0.1:{server.port}/port"

    async def ports() -> list[int]:
        calls = EngineCalls(None, httpx.Timeout(5.0))
        c = calls.client()
        got = [(await c.get(url)).json()["port"], (await c.get(url)).json()["port"]]
        await asyncio.sleep(KEEPALIVE_EXPIRY_S + 0.5)
        got.append((await c.get(url)).json()["port"])
        await calls.aclose()
        return got

    try:
        busy, again, after_idle = asyncio.run(ports())
    finally:
        server.stop()
    assert KEEPALIVE_EXPIRY_S < 5.0
    assert busy == again  # kept alive between requests
    assert after_idle != busy  # a new connection after the idle time
