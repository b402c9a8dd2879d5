"""Fuzzing a `pdlab engine` process's HTTP API with random requests (issue 28, Must show).

Whatever arrives — random bytes, random JSON, /generate and OpenAI bodies whose every field
may be junk (wrong types, huge or negative numbers, NaN, empty or oversized prompts, bad
bootstrap fields), the engine's own mutations with or without JSON, token or a body at all,
oversized bodies with or without a length — the engine answers a 2xx or a 4xx (never a 5xx,
never a dropped connection), a 4xx with a one-line message, within `ANSWER_S`; its RSS stays
under `RSS_CAP_MIB` above its size when idle; and it serves a short request afterwards with
nothing left running or queued.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-token"
ANSWER_S = 20.0  # an answer, even to a valid generation (outputs here are <= 8 tokens)
RSS_CAP_MIB = 200  # growth over the idle engine's RSS, sampled after every request
ROUTES = ["/generate", "/v1/completions", "/v1/chat/completions", "/v1/tokenize",
          "/pdlab/kv_digest", "/kv_eviction", "/pd_role_switch", "/flush_cache"]  # fmt: skip

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**400, -(10**30), 0, -1, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["", "\ud800", "x" * 5000]),
)
json_values = st.recursive(
    junk,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=10,
)
small_ids = st.lists(st.integers(0, 255), min_size=1, max_size=24)
ids_field = st.one_of(small_ids, st.lists(junk, max_size=4), junk)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_new_tokens": st.one_of(st.integers(1, 8), junk),
        "temperature": st.one_of(st.floats(0, 2), junk),
        "ignore_eos": st.one_of(st.booleans(), junk),
    },
)
generate_body = st.fixed_dictionaries(
    {"sampling_params": st.one_of(sampling, junk)},
    optional={
        "text": st.one_of(st.text(min_size=1, max_size=20), junk),
        "input_ids": ids_field,
        "stream": st.one_of(st.booleans(), junk),
        "rid": st.one_of(st.text(max_size=10), junk),
        "bootstrap_room": junk,
        "bootstrap_port": junk,
        "bootstrap_host": junk,
    },
)
openai_body = st.fixed_dictionaries(
    {"max_tokens": st.one_of(st.integers(1, 8), junk)},
    optional={
        "prompt": st.one_of(st.text(min_size=1, max_size=20), ids_field, junk),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {}, optional={"role": junk, "content": st.one_of(st.text(max_size=10), junk)}
                ),
                max_size=3,
            ),
            junk,
        ),
        "temperature": junk,
        "stream": st.one_of(st.booleans(), junk),
        "ignore_eos": junk,
        "max_completion_tokens": junk,
    },
)
engine_body = st.fixed_dictionaries(
    {},
    optional={
        "policy": st.one_of(st.sampled_from(["lru", "branch", "fifo"]), junk),
        "branch_counts": st.one_of(
            st.dictionaries(
                st.one_of(st.integers(-(2**64), 2**64).map(str), st.text(max_size=4)),
                junk,
                max_size=5,
            ),
            junk,
        ),
        "new_role": st.one_of(st.sampled_from(["prefill", "decode", "null"]), junk),
        "prepare_only": junk,
        "input_ids": ids_field,
    },
)


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


any_body = st.one_of(
    st.binary(max_size=64),
    json_values.map(_encode),
    st.sampled_from([b"[" * 50_000 + b"]" * 50_000, b'{"text": "' + b"y" * 3_000_000 + b'"}']),
)
# Mostly a route with a body of its own shape (so checks past the JSON are reached), else
# anything to anywhere.
routed = st.one_of(
    st.tuples(st.just("/generate"), generate_body.map(_encode)),
    st.tuples(
        st.sampled_from(["/v1/completions", "/v1/chat/completions"]), openai_body.map(_encode)
    ),
    st.tuples(
        st.sampled_from(["/kv_eviction", "/pd_role_switch", "/flush_cache", "/pdlab/kv_digest"]),
        engine_body.map(_encode),
    ),
    st.tuples(st.sampled_from(ROUTES), any_body),
)
requests = st.tuples(
    routed,
    st.sampled_from(["application/json"] * 3 + ["text/plain", None]),
    st.sampled_from([True] * 3 + [False]),  # with the token
    st.booleans(),  # sent chunked (no Content-Length)
)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking against a process
    derandomize=True,
)


class Engine:
    """A `pdlab engine` process (tiny-moe, small KV pool) and its idle RSS."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-m", "toolkit.cli", "engine", "--port", "0",
               "--kv-gpu-tokens", "4096", "--kv-host-tokens", "0"]  # fmt: skip
        env = {**os.environ, "PDLAB_ENGINE_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(180)
        assert got and "ready:" in got[0], self.proc.stderr.read() if self.proc.stderr else ""
        self.url = json.loads(got[0].split("ready:", 1)[1])["http_url"]
        self.ps = psutil.Process(self.proc.pid)
        short(self.url)  # warm: the first pass allocates what every later one reuses
        self.idle_rss = self.ps.memory_info().rss
        self.peak_rss = self.idle_rss

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.proc.stderr.read() if self.proc.stderr else ""


def short(url: str) -> httpx.Response:
    body = {"text": "still serving", "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(f"{url}/generate", json=body, timeout=ANSWER_S)
    assert r.status_code == 200, r.text
    return r


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    """The engine; after the fuzz it serves a short request with nothing left running or
    queued, its RSS stayed under the cap, and it stops with no traceback."""
    e = Engine()
    try:
        yield e
        assert short(e.url).json()["meta_info"]["completion_tokens"] == 2
        info = httpx.get(f"{e.url}/server_info", timeout=10).json()["internal_states"][0]
        assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
        grown_mib = (e.peak_rss - e.idle_rss) / 2**20
        assert grown_mib < RSS_CAP_MIB, f"RSS grew {grown_mib:.0f} MiB"
    finally:
        log = e.stop()
    assert "Traceback" not in log, log[-3000:]
    assert e.proc.returncode == 0


def _one_line(r: httpx.Response) -> str:
    try:
        doc = r.json()
    except ValueError:
        return r.text.strip()  # /flush_cache answers plain text, as SGLang's
    if isinstance(doc.get("error"), dict):
        return str(doc["error"].get("message"))
    return str(doc.get("message") or doc.get("detail"))


@FUZZ
@given(req=requests)
def test_any_request_gets_a_2xx_or_a_one_line_4xx(engine: Engine, req: Any) -> None:
    (route, body), ctype, with_token, chunked = req
    headers = {"Authorization": f"Bearer {TOKEN}"} if with_token else {}
    if ctype is not None:
        headers["Content-Type"] = ctype
    content: Any = body
    if chunked:
        content = (body[i : i + 65536] for i in range(0, max(len(body), 1), 65536))
    try:
        r = httpx.post(engine.url + route, content=content, headers=headers, timeout=ANSWER_S)
    except httpx.HTTPError as e:
        pytest.fail(f"{route}: no answer ({type(e).__name__}: {e}) to {body[:200]!r}")
    engine.sample()
    assert r.status_code < 500, (route, r.status_code, r.text[:300], body[:200])
    if r.status_code >= 400:
        message = _one_line(r)
        assert message and "\n" not in message and len(message) < 1000, (route, message)
    grown_mib = (engine.peak_rss - engine.idle_rss) / 2**20
    assert grown_mib < RSS_CAP_MIB, f"RSS grew {grown_mib:.0f} MiB after {route}"
