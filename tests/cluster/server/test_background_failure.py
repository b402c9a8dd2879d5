"""A background failure stops the run cleanly and every endpoint says so (SPEC §6).

Two real failures, each served over HTTP on loopback: the paced simulation's own thread
raising (a user scheduling policy that fails at t > 40 s), and the server's housekeeping
failing to store the telemetry (engines whose flush raises). Either way the run is stopped:
health says `finished: true` with the error, every mutating endpoint answers 503 naming it,
reads keep answering, and what was stored stays in the database, the run consolidated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cluster.live.serving import ServerThread
from cluster.policies.scheduling import SchedulingPolicy
from cluster.server import ControlService, ServiceConfig, create_app
from cluster.sim.paced import PaceConfig, PacedSimulation
from cluster.sim.simulator import SimConfig
from telemetry import open_reader

TOKEN = "fail-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MUTATIONS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/nodes/0/phase", {"phase": "decode"}),
    ("PUT", "/v1/planner", {"mode": "off"}),
    ("PUT", "/v1/router", {"policy": "round-robin"}),
    ("POST", "/v1/planner/apply", None),
]
READS = ["/v1/cluster", "/v1/timeline", "/v1/planner", "/v1/router", "/v1/branches",
         "/v1/directory/stats", "/metrics"]  # fmt: skip


class FailsAfter40s(SchedulingPolicy):
    """FCFS until t = 40 s of simulated time, then the hook raises."""

    name = "fails-after-40s"
    uses_signals = False

    def priority(self, pcb: Any, now: float) -> float:
        if now > 40.0:
            raise RuntimeError("priority hook exploded")
        return now


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def check_stopped_everywhere(http: httpx.Client, needle: str) -> dict[str, Any]:
    health = wait_until(
        lambda: (h := http.get("/v1/health").json())["finished"] and h, 30, "the run to stop"
    )
    assert health["status"] == "error" and needle in health["error"], health
    for method, path, body in MUTATIONS:
        r = http.request(method, path, json=body, headers=AUTH)
        assert r.status_code == 503, (path, r.text)
        detail = r.json()["detail"]
        assert detail.startswith("the run was stopped after a failure (") and needle in detail
    for path in READS:
        assert http.get(path).status_code == 200, path
    state = http.get("/v1/cluster").json()
    assert state["finished"] and len(state["nodes"]) == 4
    return health


def test_a_failed_pacing_thread_stops_the_run_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "failing.duckdb"
    cfg = SimConfig(
        workload="cc", nodes=4, split="2P2D", agents=24, duration_s=86_400, warmup_s=0,
        window_s=60, slices=4, scheduling=FailsAfter40s,
    )  # fmt: skip
    engines = PacedSimulation(cfg, db, PaceConfig(speed=40.0))
    service = ControlService(engines, ServiceConfig(sample_every_s=0.1, flush_every_s=0.5))
    with (
        ServerThread(create_app(service, TOKEN)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        health = check_stopped_everywhere(http, "RuntimeError: priority hook exploded")
        assert "the paced simulation failed at t=4" in health["error"]
        time.sleep(0.3)  # the clock no longer moves
        assert http.get("/v1/cluster").json()["time"] == health["time"]
        assert http.get("/v1/timeline").json()["samples"]["t"], "the timeline stays readable"
    # Stopped once, when the failure was seen: summarized with the error, run consolidated.
    summary = service.summary
    assert summary is not None and "priority hook exploded" in summary["error"]
    assert 40.0 < summary["sim_seconds"] < 45.0 and summary["requests"] > 0
    reader = open_reader(db)
    runs = reader.runs()
    assert runs.height == 1 and not runs["live"][0]
    stored = reader.sql("SELECT count(*) AS n, max(t_done) AS last FROM requests")
    assert stored["n"][0] == summary["requests"] and stored["last"][0] <= 45.0


class UnstorableCluster(PacedSimulation):
    """A paced simulation whose telemetry store starts failing after the first flushes."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.flushes = 0

    def flush_telemetry(self) -> None:
        self.flushes += 1
        if self.flushes > 2:
            raise OSError("disk full")
        super().flush_telemetry()


def test_a_failed_housekeeping_flush_stops_the_run(tmp_path: Path) -> None:
    cfg = SimConfig(workload="putnam", nodes=4, split="2P2D", agents=8, duration_s=86_400,
                    warmup_s=0)  # fmt: skip
    engines = UnstorableCluster(cfg, tmp_path / "unstorable.duckdb", PaceConfig(speed=20.0))
    service = ControlService(engines, ServiceConfig(sample_every_s=0.1, flush_every_s=0.2))
    with (
        ServerThread(create_app(service, TOKEN)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        health = check_stopped_everywhere(http, "housekeeping: OSError: disk full")
    assert health["error"] == "housekeeping: OSError: disk full"
    assert service.summary is not None and service.summary["requests"] >= 0
    runs = open_reader(tmp_path / "unstorable.duckdb").runs()
    assert runs.height == 1 and not runs["live"][0]
