"""Faults of a live cluster on loopback: engines that die mid-request, publisher restarts
and malformed frames are survived with clear errors, and no telemetry already received is
lost (SPEC §6 must-shows).

The collector-level faults (sequence gaps, a cut TCP connection, malformed frames, replay)
are covered in test_sglang_collector_faults.py; here the whole cluster goes through them.
Engines that die are real processes (`python -m cluster.engines.standin.server`) killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.engines.standin.server import StandinEngine
from cluster.live.cluster_file import EngineSpec
from cluster.wire.toy_tokenizer import encode
from telemetry import open_reader

ROOT = Path(__file__).resolve().parents[3]


class StandinProcess:
    """A stand-in in its own process; `endpoints` as printed when it is ready."""

    def __init__(self, role: str, time_scale: float, tmp: Path) -> None:
        cmd = [
            sys.executable, "-m", "cluster.engines.standin.server", "--role", role, "--port", "0",
            "--bootstrap-port", "0", "--time-scale", str(time_scale),
            "--forward-metrics-endpoint", f"ipc://{tmp}/fpm-{role}",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.endpoints: dict[str, Any] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "ready:" in line:
                self.endpoints = json.loads(line.split("ready:", 1)[1])
                self._ready.set()
                return

    def wait(self, timeout_s: float = 60.0) -> StandinProcess:
        if not self._ready.wait(timeout_s):
            self.kill()
            raise RuntimeError("the stand-in process did not start")
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StandinProcess]]:
    """A slow prefill and a slow decode stand-in process, started in parallel."""
    tmp = tmp_path_factory.mktemp("procs")
    procs = {
        "prefill": StandinProcess("prefill", 200.0, tmp),
        "decode": StandinProcess("decode", 300.0, tmp),
    }
    try:
        for p in procs.values():
            p.wait()
        yield procs
    finally:
        for p in procs.values():
            p.kill()


def _spec(node: int, p: StandinProcess) -> EngineSpec:
    return EngineSpec(node_id=node, http_url=p.endpoints["http_url"])


def _sse(lines: list[str]) -> list[Any]:
    data = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def _node_rows(db: Path, table: str, node: int) -> int:
    t = open_reader(db).table(table)
    return int((t["node_id"] == node).sum())


def test_a_prefill_engine_killed_mid_request_is_retried_elsewhere(
    live_cluster, until, processes
) -> None:  # type: ignore[no-untyped-def]
    doomed = processes["prefill"]
    engines = [doomed.endpoints["http_url"], StandinEngine("prefill"), StandinEngine("decode")]
    for e in engines[1:]:
        e.start()
    # Health checks far apart: the request path notices the death first.
    h = live_cluster(engines=engines, router="round-robin", health_interval_s=30.0)
    short = {
        "text": "a short prompt for the process " * 4,
        "sampling_params": {"max_new_tokens": 2},
    }
    for node in "01":
        r = httpx.post(f"{h.url}/generate", json=short, timeout=30)
        assert r.headers["x-pd-prefill-node"] == node
    kv0, fpm0 = h.cluster.engines[0].kv, h.cluster.engines[0].fpm
    assert until(lambda: kv0.num_rows > 0 and fpm0.num_prefill_rows > 0, 10.0)
    long_text = "a long prompt that keeps the process busy for a while. " * 55  # ~3K tokens
    body = {"text": long_text, "sampling_params": {"max_new_tokens": 4}, "stream": True}
    out: dict[str, Any] = {}

    def stream() -> None:
        with httpx.stream("POST", f"{h.url}/generate", json=body, timeout=60) as r:
            out["headers"] = r.headers
            out["events"] = _sse(list(r.iter_lines()))

    t = threading.Thread(target=stream)
    t.start()
    assert until(lambda: h.cluster.proxy.outstanding(0) == 1, 10.0)
    rows_before = (kv0.num_rows, fpm0.num_prefill_rows)
    doomed.kill()  # SIGKILL while the process prefills the long prompt (~1.5 s)
    t.join(60)
    events = out["events"]
    assert out["headers"]["x-pd-attempts"] == "2" and out["headers"]["x-pd-prefill-node"] == "1"
    assert events[-1] == "[DONE]" and len(events) == 5  # 4 tokens, nothing lost
    assert events[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    node0 = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][0]
    assert node0["healthy"] is False and "engine 0" in node0["last_error"]
    assert until(lambda: kv0.stats.disconnects >= 1, 5.0)  # the collector saw it go
    assert (kv0.num_rows, fpm0.num_prefill_rows) == rows_before
    h.close()
    assert _node_rows(h.db, "kv_events", 0) == rows_before[0] > 0
    assert _node_rows(h.db, "prefill_iterations", 0) == rows_before[1] > 0
    req = open_reader(h.db).table("requests")
    assert req.height == 3 and req["t_done"].null_count() == 0


def test_a_decode_engine_killed_mid_stream_ends_the_stream_with_a_clear_error(
    live_cluster, until, processes
) -> None:  # type: ignore[no-untyped-def]
    doomed = processes["decode"]
    engines = [StandinEngine("prefill"), doomed.endpoints["http_url"]]
    engines[0].start()
    h = live_cluster(engines=engines, health_interval_s=30.0)
    fpm1 = h.cluster.engines[1].fpm
    body = {
        "text": "stream a long answer",
        "sampling_params": {"max_new_tokens": 60},
        "stream": True,
    }
    lines: list[str] = []
    with httpx.stream("POST", f"{h.url}/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if sum(ln.startswith("data: ") for ln in lines) == 3:
                assert until(lambda: fpm1.num_decode_rows > 0, 10.0)
                rows_before = fpm1.num_decode_rows
                doomed.kill()  # SIGKILL mid-stream (a decode step takes ~0.3 s there)
    events = _sse(lines)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    url = doomed.endpoints["http_url"]
    assert err["code"] == 502 and f"decode engine 1 ({url}) failed mid-stream" in err["message"]
    assert all("output_ids" in e for e in events[:-2]) and len(events) - 2 < 60
    with h.cluster.lock:
        assert 1 in h.cluster.cp.unavailable_nodes()  # the only decode engine
        assert h.cluster.cp.unavailable_reasons(1) == {"engine down"}
    r = httpx.post(f"{h.url}/generate", json={"text": "next"}, timeout=10)
    assert r.status_code == 503 and "no decode node is available" in r.json()["error"]["message"]
    assert fpm1.num_decode_rows == rows_before
    h.close()
    assert _node_rows(h.db, "decode_iterations", 1) == rows_before > 0
    req = open_reader(h.db).table("requests").sort("t_arrival")
    first = req.row(0, named=True)  # the interrupted request: first token, never done
    assert first["t_first_token"] is not None and first["t_done"] is None
    assert first["t_out"] == len(events) - 2


def test_publisher_restart_and_malformed_frames_keep_the_directory_right(
    live_cluster, until, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    def prefill(port: int = 0, ep: Any = None) -> StandinEngine:
        return StandinEngine(
            "prefill",
            port=port,
            kv_events_endpoint=None if ep is None else ep.kv_events,
            kv_replay_endpoint=None if ep is None else ep.kv_replay,
            forward_metrics_endpoint=f"ipc://{tmp_path}/fpm-p",
            bootstrap_port=0 if ep is None else ep.bootstrap_port,
        )

    engines = [prefill(), StandinEngine("decode")]
    for e in engines:
        e.start()
    h = live_cluster(engines=engines, health_interval_s=0.1)
    cp = h.cluster.cp
    bt = cp.config.block_tokens
    old_prompt = "the engine caches this before it restarts " * 5

    def gen(text: str) -> None:
        r = httpx.post(
            f"{h.url}/generate",
            json={"text": text, "sampling_params": {"max_new_tokens": 2}},
            timeout=20,
        )
        assert r.status_code == 200, r.text

    gen(old_prompt)
    from cluster.kv.hashing import token_block_hashes

    old_path = token_block_hashes(encode(old_prompt), bt)
    assert until(lambda: cp.cached_prefix(old_path, 0) == len(old_path))
    kv = h.cluster.engines[0].kv
    pub = engines[0].kv_publisher
    pub.send_raw([b"", b"\x00" * 8])  # two frames
    pub.publish(b"\xc1 not a msgpack batch")  # a sequenced payload that does not decode
    assert until(lambda: kv.stats.malformed == 2)
    stream = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][0]["kv_stream"]
    assert stream["malformed"] == 2 and stream["messages_lost"] == 0
    rows_before = kv.num_rows
    # Restart the engine on the same ports: a new process's sequence starts at 0 and its
    # cache is empty, but SGLang publishes no AllBlocksCleared for it.
    ep = engines[0].endpoints
    port = engines[0].port
    engines[0].stop()
    assert until(lambda: 0 in cp.unavailable_nodes(), 5.0)
    engines[0] = prefill(port, ep)
    engines[0].start()
    assert until(lambda: 0 not in cp.unavailable_nodes(), 5.0)
    new_prompt = "a different prompt after the restart " * 5
    gen(new_prompt)
    new_path = token_block_hashes(encode(new_prompt), bt)
    assert until(lambda: cp.cached_prefix(new_path, 0) == len(new_path))
    with cp.lock:
        # The stale blocks of the old process are gone; only the new prompt's are held.
        assert cp.cached_prefix(old_path, 0) == 0
        assert cp.node_blocks(0) == len(new_path)
    node0 = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][0]
    assert node0["publisher_restarts"] == 1 and node0["kv_stream"]["restarts"] == 1
    assert kv.num_rows > rows_before
    rows = kv.num_rows
    h.close()
    assert _node_rows(h.db, "kv_events", 0) == rows  # before and after the restart
