"""Who may change an engine, how much it reads, and how it stops (issue 28, Medium/Low).

Mutations (/flush_cache, /kv_eviction, /pd_role_switch) are POST only, JSON only (a web page
cannot send `application/json` cross-site without a preflight the engine never grants) and
need the engine's token; bodies past the engine's limit are refused before they are read;
/kv_eviction holds a bounded map and `{}` clears it; `pdlab engine` without a token makes
one, in a file only its user reads; an engine stopping with requests in flight answers them
(503) and logs no error ("Event loop is closed" before).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from cluster.engines.standin.server import StandinEngine
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "door-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    cfg = EngineConfig(gpu_pages=128, host_pages=128)
    with TorchEngine(cfg, "prefill", enable_pd_role_switch=True, token=TOKEN) as e:
        yield e


def _url(engine: TorchEngine) -> str:
    assert engine.endpoints is not None
    return engine.endpoints.http_url


MUTATIONS = [
    ("/flush_cache", {}),
    ("/kv_eviction", {"policy": "lru"}),
    ("/pd_role_switch", {"new_role": "prefill"}),
]


@pytest.mark.parametrize(("path", "body"), MUTATIONS)
def test_mutations_need_post_json_and_the_token(engine: TorchEngine, path: str, body: dict) -> None:  # type: ignore[type-arg]
    url = _url(engine) + path
    raw = json.dumps(body)
    # A web page's simple request: JSON sent as text/plain, no token.
    r = httpx.post(url, content=raw, headers={"Content-Type": "text/plain"})
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]
    r = httpx.post(url, content=raw, headers={"Content-Type": "text/plain", **AUTH})
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    r = httpx.post(url, content=raw, headers={**JSON, "Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["detail"] == "invalid bearer token"
    if path == "/flush_cache":
        assert httpx.get(url, headers=AUTH).status_code == 405  # GET never mutates
    r = httpx.post(url, content=raw, headers={**JSON, **AUTH})
    assert r.status_code == 200, r.text


def test_without_a_token_mutations_still_need_json() -> None:
    with StandinEngine("prefill", enable_pd_role_switch=True) as e:
        url = e.endpoints.http_url  # type: ignore[union-attr]
        plain = {"Content-Type": "text/plain"}
        assert httpx.post(f"{url}/flush_cache", content="{}", headers=plain).status_code == 415
        assert httpx.post(f"{url}/flush_cache", json={}).status_code == 200


def _raw_request(url: str, head: str) -> tuple[int, str]:
    """Send only `head` (no body) and read the answer: the engine answers before a body."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 20:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode()


def test_a_100_mb_body_is_refused_before_it_is_read(engine: TorchEngine) -> None:
    limit = engine.max_body_bytes
    assert limit == 16 * 32768 + (1 << 20)
    head = ("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000000\r\n\r\n")  # fmt: skip
    status, body = _raw_request(_url(engine), head)
    assert status == 413 and f"at most {limit} bytes" in json.loads(body)["detail"]

    def chunks():  # type: ignore[no-untyped-def]  # no length: counted as it arrives
        yield b'{"text": "'
        for _ in range(64):
            yield b"x" * 65536

    r = httpx.post(f"{_url(engine)}/generate", content=chunks(), headers=JSON, timeout=30)
    assert r.status_code == 413 and f"at most {limit} bytes" in r.json()["detail"]


def test_kv_eviction_holds_a_bounded_map_and_an_empty_one_clears_it(engine: TorchEngine) -> None:
    url = f"{_url(engine)}/kv_eviction"
    limit = httpx.get(url).json()["max_counted_blocks"]
    assert limit == 4096  # max(4096, 4 x (128 + 128) pages)
    big = {"branch_counts": {str(h): 1 for h in range(limit + 1)}}
    r = httpx.post(url, json=big, headers=AUTH)
    assert r.status_code == 400 and f"at most {limit}" in r.json()["message"]
    huge = {"branch_counts": {str(h): 1 for h in range(200_000)}}  # the probe's map
    assert httpx.post(url, json=huge, headers=AUTH).status_code == 413
    half = {"branch_counts": {str(h): 2 for h in range(limit // 2 + 1)}}
    assert httpx.post(url, json=half, headers=AUTH).json()["counted_blocks"] == limit // 2 + 1
    other = {"branch_counts": {str(-h - 1): 2 for h in range(limit // 2 + 1)}}
    r = httpx.post(url, json=other, headers=AUTH)  # the merged map would pass the limit
    assert r.status_code == 400 and "would exceed" in r.json()["message"]
    r = httpx.post(url, json={"branch_counts": {}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["counted_blocks"] == 0
    assert engine.sched.cache.counts == {}


def test_stopping_with_requests_in_flight_answers_them_and_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers: list[int] = []
    engine = TorchEngine(EngineConfig(gpu_pages=640, host_pages=0), "null")  # 2 run, 1 waits
    url = engine.start().http_url
    long = {"max_new_tokens": 3000, "ignore_eos": True}

    def call(stream: bool) -> None:
        body = {"text": "stopping " * 8, "stream": stream, "sampling_params": long}
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
            text = r.read().decode()
            answers.append(503 if "the engine is stopping" in text else r.status_code)

    with caplog.at_level(logging.WARNING):
        clients = [threading.Thread(target=call, args=(s,)) for s in (True, False, True)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 30
        while engine.inflight < 3 or not engine.sched.running:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engine.stop()
        for t in clients:
            t.join(30)
    assert answers == [503, 503, 503]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def _readline(stream, timeout_s: float = 120.0) -> str:  # type: ignore[no-untyped-def]
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    assert got, "the engine printed nothing"
    return got[0]


def test_pdlab_engine_without_a_token_generates_one_in_a_private_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PDLAB_ENGINE_TOKEN"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    cmd = [sys.executable, "-m", "toolkit.cli", "engine", "--port", "0",
           "--kv-gpu-tokens", "1024", "--kv-host-tokens", "0"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready = _readline(proc.stdout)
        url = json.loads(ready.split("ready:", 1)[1])["http_url"]
        said = _readline(proc.stderr)
        path = Path(re.search(r"generated, in (\S+)\)", said).group(1))  # type: ignore[union-attr]
        assert path.parent == tmp_path / "pdlab"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 20
        assert httpx.post(f"{url}/flush_cache", json={}).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{url}/flush_cache", json={}, headers=auth).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert not path.exists()  # removed at exit
