"""A short live run on two nodes: last-node refusals, the end of the run, clean shutdown."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from telemetry import open_reader
from toolkit.client import launch_server


def test_last_node_refusal_run_end_and_consolidation(tmp_path: Path) -> None:
    db = tmp_path / "short.duckdb"
    srv = launch_server(
        "--nodes", "2", "--split", "1P1D", "--agents", "8", "--workload", "putnam",
        "--duration", "120", token="t0k", db=db, speed=60.0,
    )  # fmt: skip
    auth = {"Authorization": "Bearer t0k"}
    try:
        with httpx.Client(base_url=srv.url, timeout=15.0) as http:
            r = http.post("/v1/nodes/0/phase", json={"phase": "decode"}, headers=auth)
            assert r.status_code == 409
            assert r.json()["detail"] == (
                "node 0 is the last available prefill node; a switch would leave no prefill node"
            )
            deadline = time.monotonic() + 30
            while not http.get("/v1/health").json()["finished"]:
                assert time.monotonic() < deadline, "the 120 s run did not end at 60x"
                time.sleep(0.2)
            state = http.get("/v1/cluster").json()
            assert state["time"] == 120.0 and state["finished"]
            r = http.post("/v1/nodes/1/phase", json={"phase": "prefill"}, headers=auth)
            assert r.status_code == 409
            assert r.json()["detail"] == (
                "the simulated run ended at t=120.0 s (--duration); cannot switch node 1"
            )
            r = http.post("/v1/planner/apply", headers=auth)
            assert r.status_code == 409 and "run ended" in r.json()["detail"]
            # Reads keep working after the end.
            assert http.get("/metrics").status_code == 200
    finally:
        code = srv.stop()
    assert code == 0, srv.log()
    reader = open_reader(db)
    runs = reader.runs()
    assert runs.height == 1 and not runs["live"][0] and runs["source"][0] == "live-sim"
    req = reader.sql("SELECT count(*) AS n, max(t_done) AS last FROM requests")
    assert req["n"][0] > 0 and req["last"][0] <= 120.0
    assert reader.sql("SELECT count(*) AS n FROM phase_switches")["n"][0] == 0
