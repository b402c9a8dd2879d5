"""`pdlab attach` over a P/D fleet of stand-ins speaking vLLM's formats (SPEC §6, shadow mode).

Three stand-ins with `wire="vllm"` (1 prefill, 2 decode) serve vLLM's routes, /metrics
names, KV event format and pdlab's vLLM step stream; a test client plays vLLM's NIXL toy
proxy (prefill with `kv_transfer_params.do_remote_decode`, then decode with what prefill
returned). pdlab attaches from a fleet file (vLLM advertises neither its publishers nor its
role) and, through the REST API only: sees every engine, fills the KV directory, writes
iteration rows from the step stream and `engine_metrics` from /metrics, shows the router's
and planner's recommendations, refuses the planner's auto mode and a phase switch of a vLLM
node (409, vLLM cannot switch in place), and switches nothing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.engines.standin.server import StandinEngine
from cluster.live.attached import AttachedFleet
from cluster.live.fleet_file import load_fleet_file
from cluster.live.serving import ServerThread
from telemetry import open_reader
from toolkit.cli.attach import create_attach_app
from toolkit.client import PdlabApiError, PdlabClient

TOKEN = "t0k"


def _until(pred: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s")


def _proxy_traffic(prefill: str, decodes: list[str], stop: threading.Event) -> list[int]:
    """vLLM's toy P/D proxy: prefill with do_remote_decode, decode with its kv_transfer_params."""
    done = [0]
    with httpx.Client(timeout=30) as c:
        i = 0
        while not stop.is_set():
            prompt = "shared system prompt " * 20 + f"question {i} " * (5 + i % 7)
            r = c.post(f"{prefill}/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                       "kv_transfer_params": {"do_remote_decode": True}})  # fmt: skip
            r.raise_for_status()
            params = r.json()["kv_transfer_params"]
            r = c.post(f"{decodes[i % 2]}/v1/completions",
                       json={"prompt": prompt, "max_tokens": 12, "kv_transfer_params": params})  # fmt: skip
            r.raise_for_status()
            done[0] += 1
            i += 1
    return done


@pytest.fixture
def vllm_fleet(tmp_path: Path) -> Any:
    engines = [StandinEngine(role, wire="vllm") for role in ("prefill", "decode", "decode")]
    for e in engines:
        e.start()
    lines = ["[fleet]", "window_s = 10", "slices = 2", "scrape_every_s = 0.5",
             "refit_every_s = 2", "refit_min_rows = 5"]  # fmt: skip
    for e in engines:
        ep = e.endpoints
        assert ep is not None and e.kv_publisher is not None
        lines += ["[[engines]]", f'url = "{ep.http_url}"', f'role = "{e.role}"',
                  f'kv_events = "{ep.kv_events}"', f'kv_replay = "{ep.kv_replay}"',
                  f'vllm_steps = "{ep.forward_metrics}"',
                  f'vllm_steps_replay = "{e.fpm_publisher.replay_endpoint}"']  # type: ignore[union-attr]  # fmt: skip
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    try:
        yield engines, path
    finally:
        for e in engines:
            e.stop()


def test_attach_watches_a_vllm_fleet_in_shadow_mode(vllm_fleet: Any, tmp_path: Path) -> None:
    engines, path = vllm_fleet
    db = tmp_path / "attach.duckdb"
    fleet = AttachedFleet(load_fleet_file(path), db_path=db, run_id="attach-vllm")
    server = ServerThread(create_attach_app(fleet, TOKEN)).start()
    stop = threading.Event()
    urls = [e.endpoints.http_url for e in engines]
    result: list[list[int]] = []
    traffic = threading.Thread(
        target=lambda: result.append(_proxy_traffic(urls[0], urls[1:], stop))
    )
    try:
        client = PdlabClient(server.url, TOKEN)
        health = client.health()
        assert health["mode"] == "shadow" and health["engines_up"] == 3
        cl = client.cluster()
        assert [(n["kind"], n["role"]) for n in cl["nodes"]] == [
            ("vllm", "prefill"),
            ("vllm", "decode"),
            ("vllm", "decode"),
        ]
        assert not any(n["can_switch"] for n in cl["nodes"])
        traffic.start()
        cl = _until(lambda: (c := client.cluster())["shadow"]["router"].get("node") is not None
                    and c["requests_completed"] > 0 and c)  # fmt: skip
        shadow = cl["shadow"]
        assert shadow["acting"] is False and shadow["router"]["node"] == 0
        assert shadow["router"]["predicted_ttft_s"] > 0 and shadow["router"]["prompt_tokens"] > 100
        assert cl["nodes"][0]["kv_blocks"] > 0  # the directory holds the prefill's blocks
        assert cl["nodes"][1]["streams"]["vllm_steps"]["messages"] > 0
        assert cl["requests_observed"] > 0
        with pytest.raises(PdlabApiError) as bad:
            client.set_planner(mode="auto")
        assert bad.value.status == 422 and "advise, off" in bad.value.detail
        with pytest.raises(PdlabApiError) as refused:
            client.switch(1, "prefill")
        assert refused.value.status == 409 and "vLLM" in refused.value.detail
        planner = _until(lambda: (p := client.cluster()["shadow"]["planner"]).get("t") and p, 20)
        assert planner["current_split"] == "1P2D" and "recommended_split" in planner
        final = client.cluster()
        assert final["switches"] == 0
    finally:
        stop.set()
        if traffic.is_alive():
            traffic.join()
        server.stop()
    assert result and result[0][0] > 5
    r = open_reader(db)
    run = "attach-vllm"
    assert r.runs()["source"].to_list() == ["attach"]
    kv = r.table("kv_events", run_id=run)
    assert kv.height > 0 and set(kv["node_id"]) == {0}  # only the prefill stores prompt KV
    dec = r.table("decode_iterations", run_id=run)
    pre = r.table("prefill_iterations", run_id=run)
    assert dec.height > 0 and set(dec["node_id"]) <= {1, 2} and pre.height > 0
    metrics = r.sql("SELECT DISTINCT metric FROM engine_metrics WHERE run_id = 'attach-vllm'")[
        "metric"
    ].to_list()
    assert {"vllm:num_requests_running", "vllm:request_success_total"} <= set(metrics)
    assert r.table("router_decisions", run_id=run).height > 0
    assert r.table("phase_switches", run_id=run).height == 0
