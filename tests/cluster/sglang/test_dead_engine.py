"""A dead engine under a launched cluster is never silent (issue 28, Low).

`pdlab serve --engines torch` launches its engines as `LaunchedCluster` does here (with the
SGLang stand-in as the engine: the same processes, health checks and proxy, no torch). When
an engine process is killed (-9): `/v1/health` says `degraded` and names the node, `/metrics`
reports the node unhealthy and drops its (now stale) queue and KV gauges, a switch of that
node answers 409 instead of 200-then-fail, the other nodes keep serving, and the run ends
`failed` with the death in its status detail and a `cleared` KV row per tier for the node.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx

from cluster.live.cluster_file import ClusterSettings
from cluster.live.launched import EngineLaunch, LaunchedCluster
from cluster.live.serving import ServerThread
from telemetry import open_reader
from toolkit.serve.sglang import create_sglang_app

STANDIN = (sys.executable, "-m", "cluster.engines.standin.server", "--role", "{role}",
           "--host", "{host}", "--port", "{port}", "--bootstrap-port", "0",
           "--enable-pd-role-switch", "--time-scale", "0.01")  # fmt: skip
TOKEN = "dead-engine"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _until(pred, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def _generate(url: str) -> httpx.Response:
    body = {"text": "a dead engine " * 20, "sampling_params": {"max_new_tokens": 4}}
    return httpx.post(f"{url}/generate", json=body, timeout=30)


def test_a_dead_engine_is_reported_refused_a_switch_and_ends_the_run_failed(
    tmp_path: Path,
) -> None:
    launch = EngineLaunch(STANDIN, ("prefill", "decode", "decode"), log_dir=tmp_path / "logs")
    settings = ClusterSettings(
        tokenizer="toy", health_interval_s=0.2, decode_cuda_graph_memory_gb=1.0
    )
    db = tmp_path / "live.duckdb"
    cluster = LaunchedCluster(launch, settings, db_path=db, source="standin")
    try:
        with ServerThread(create_sglang_app(cluster, TOKEN)) as server:
            url = server.url
            assert all(_generate(url).status_code == 200 for _ in range(4))
            health = httpx.get(f"{url}/v1/health").json()
            assert health["status"] == "ok" and health["nodes_down"] == []
            assert 'pdlab_node_healthy{node="2"} 1.0' in httpx.get(f"{url}/metrics").text

            victim = cluster.processes[2]
            os.killpg(victim.pid, signal.SIGKILL)
            health = _until(
                lambda: (h := httpx.get(f"{url}/v1/health").json())["status"] == "degraded" and h
            )
            (down,) = health["nodes_down"]
            assert down["node"] == 2 and "exited with -9" in down["error"]
            metrics = httpx.get(f"{url}/metrics").text
            assert 'pdlab_node_healthy{node="2"} 0.0' in metrics
            assert 'pdlab_node_healthy{node="1"} 1.0' in metrics
            assert 'pdlab_node_kv_gpu_used_tokens{node="2"}' not in metrics
            assert 'pdlab_node_kv_gpu_used_tokens{node="1"}' in metrics

            r = httpx.post(f"{url}/v1/nodes/2/phase", json={"phase": "prefill"}, headers=AUTH)
            assert r.status_code == 409 and "engine is down" in r.json()["detail"], r.text
            node = httpx.get(f"{url}/v1/cluster").json()["nodes"][2]
            assert node["switching"] is None and not node["healthy"]
            assert node["kv_gpu_used"] == 0 and node["kv_blocks"] == 0  # its KV died with it
            assert all(_generate(url).status_code == 200 for _ in range(3))  # node 1 serves
    finally:
        summary = cluster.stop()
    assert summary is not None
    (outage,) = summary["outages"]
    assert outage["node_id"] == 2 and outage["died"] and outage["t_up"] is None

    r = open_reader(db)
    runs = r.runs()
    assert runs["status"].to_list() == ["failed"]
    detail = runs["status_detail"][0]
    assert "engine 2" in detail and "died" in detail and "exited with -9" in detail
    kv = r.table("kv_events")
    cleared = kv.filter((kv["node_id"] == 2) & (kv["kind"] == "cleared"))
    assert sorted(cleared["tier"].to_list()) == ["gpu", "host"]
    assert r.table("requests").height == 7
