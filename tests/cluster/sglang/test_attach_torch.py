"""`pdlab attach` over a 3-node cluster of pdlab's torch engines it did not start (SPEC §6).

Three torch engines (1 prefill, 2 decode, tiny preset, `--enable-pd-role-switch`) serve
behind their own router — pdlab's PD proxy of `pdlab serve --sglang`, planner off — which
takes the requests. `AttachedFleet` discovers the engines from /server_info alone, collects
their KV events, forward-pass metrics and SGLang-named /metrics into its own run, fits the
nodes online and shows the router's and planner's recommendations (GET /v1/cluster
"shadow", and the dashboard widget's shadow line) while switching nothing; a switch asked
through the REST API is carried out on the engine (POST /pd_role_switch) and recorded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine
from cluster.live.attached import AttachedFleet
from cluster.live.cluster import SGLangCluster
from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
from cluster.live.fleet_file import AttachedEngine, FleetConfig, FleetSettings
from cluster.live.serving import ServerThread
from telemetry import open_reader
from toolkit.cli.attach import create_attach_app
from toolkit.client import PdlabClient
from toolkit.serve.sglang import create_sglang_app
from toolkit.widgets import ClusterDashboard

TOKEN = "t0k"


def _until(pred: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s")


@pytest.fixture
def torch_fleet(tmp_path: Path) -> Any:
    """The fleet, started separately from pdlab attach: engines and their own router."""
    cfg = EngineConfig(seed=1, gpu_pages=512, host_pages=1024)
    engines = [
        TorchEngine(cfg, role, enable_pd_role_switch=True)  # type: ignore[arg-type]
        for role in ("prefill", "decode", "decode")
    ]
    for e in engines:
        e.start()
    specs = tuple(
        EngineSpec(node_id=i, http_url=e.endpoints.http_url)  # type: ignore[union-attr]
        for i, e in enumerate(engines)
    )
    settings = ClusterSettings(tokenizer="toy", planner_mode="off", health_interval_s=0.5)
    router = SGLangCluster(ClusterConfig(specs, settings), db_path=tmp_path / "router.duckdb")
    server = ServerThread(create_sglang_app(router, TOKEN)).start()
    try:
        yield engines, server
    finally:
        server.stop()
        for e in engines:
            e.stop()


def _traffic(url: str, stop: threading.Event, done: list[int]) -> None:
    with httpx.Client(timeout=60) as c:
        i = 0
        while not stop.is_set():
            ids = list(range(1, 120)) + [200 + i % 50] * (10 + i % 40)  # a shared prefix
            r = c.post(f"{url}/generate", json={"input_ids": ids,
                       "sampling_params": {"max_new_tokens": 4}})  # fmt: skip
            assert r.status_code == 200, r.text
            done[0] += 1
            i += 1


def test_attach_over_torch_engines_recommends_and_switches_only_when_asked(
    torch_fleet: Any, tmp_path: Path
) -> None:
    engines, router = torch_fleet
    db = tmp_path / "attach.duckdb"
    fleet = AttachedFleet(
        FleetConfig(
            tuple(AttachedEngine(url=e.endpoints.http_url) for e in engines),
            FleetSettings(
                router_url=router.url,
                window_s=10,
                slices=2,
                scrape_every_s=0.5,
                refit_every_s=2,
                refit_min_rows=5,
            ),
        ),
        db_path=db,
        run_id="attach-torch",
    )
    server = ServerThread(create_attach_app(fleet, TOKEN)).start()
    stop, done = threading.Event(), [0]
    traffic = threading.Thread(target=_traffic, args=(router.url, stop, done))
    try:
        client = PdlabClient(server.url, TOKEN)
        cl = client.cluster()
        assert [(n["kind"], n["phase"], n["can_switch"]) for n in cl["nodes"]] == [
            ("sglang", "prefill", True),
            ("sglang", "decode", True),
            ("sglang", "decode", True),
        ]
        assert _until(lambda: client.health()["router"]["healthy"], 10) is True
        traffic.start()
        _until(lambda: client.cluster()["shadow"]["router"].get("node") == 0)
        cl = _until(lambda: "t" in (c := client.cluster())["shadow"]["planner"] and c)
        assert cl["switches"] == 0 and cl["split"] == {"prefill": 1, "decode": 2}
        assert cl["nodes"][0]["kv_blocks"] > 0
        assert any(n["model"]["online_fit"] for n in cl["nodes"])
        dash = ClusterDashboard(client=client)
        assert dash.refresh()
        assert "shadow mode" in dash.shadow.value and "node 0" in dash.shadow.value
        assert list(dash.mode.options) == ["advise", "off"]
        stop.set()
        traffic.join()
        time.sleep(1.0)  # the engines drain
        # Asked: a decode engine started with --enable-pd-role-switch switches in place.
        started = client.switch(2, "prefill")
        assert started["trigger"] == "manual"
        after = client.wait_for_phase(2, "prefill", timeout_s=60)
        assert after["last_switch"]["ok"]
        info = httpx.get(f"{engines[2].endpoints.http_url}/server_info", timeout=10).json()
        assert info["disaggregation_mode"] == "prefill"
    finally:
        stop.set()
        if traffic.is_alive():
            traffic.join()
        server.stop()
    assert done[0] > 5
    r = open_reader(db)
    run = "attach-torch"
    pre = r.table("prefill_iterations", run_id=run)
    dec = r.table("decode_iterations", run_id=run)
    assert pre.height > 0 and dec.height > 0 and pre["experts_active"].null_count() == 0
    names = set(r.sql("SELECT DISTINCT metric FROM engine_metrics")["metric"].to_list())
    assert {"sglang:num_running_reqs", "sglang:num_requests_total"} <= names
    sw = r.table("phase_switches", run_id=run)
    assert sw["trigger"].to_list() == ["manual"] and sw["node_id"].to_list() == [2]
    assert r.table("planner_windows", run_id=run).height > 0
