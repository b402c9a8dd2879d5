"""The control server over a cluster it has never heard of: the `ClusterEngines` protocol suffices.

`ToyCluster` is a third implementation written in this one module (as a torch-engine cluster
would be): a control plane, engines that finish a switch after a moment on a thread of
their own (or refuse it), requests completed on demand. Served with `create_app` on a real
loopback port, every endpoint of SPEC §6 answers from the protocol alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
from cluster.control.engines import CompletedRequest, NodeStatus, RequestListener
from cluster.core import MemorySink, TelemetrySink, tee
from cluster.server import ControlService, ServiceConfig, create_app
from cluster.sglang.live.serving import ServerThread
from models import DecodeModel, NodeModel, PrefillModel

NODE = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))
TOKEN = "toy-token"


class ToyCluster:
    """Four engines 2P2D on a wall clock; node 3 refuses every switch."""

    source = "toy"
    speed = 1.0

    def __init__(self) -> None:
        self.sink = MemorySink()
        self.cp: ControlPlane | None = None
        self.listener: RequestListener | None = None
        self.tap: TelemetrySink | None = None
        self.t0 = time.monotonic()
        self.stopped = False
        self.timeline: list[tuple[float, int, int]] = []
        self.flushes = 0
        self.threads: list[threading.Thread] = []

    run_id = "toy-run"
    db_path = None
    error = None

    @property
    def control_plane(self) -> ControlPlane | None:
        return self.cp

    def set_request_listener(self, listener: RequestListener) -> None:
        self.listener = listener

    def set_telemetry_tap(self, tap: TelemetrySink) -> None:
        self.tap = tap

    def start(self) -> None:
        phases = {0: "prefill", 1: "prefill", 2: "decode", 3: "decode"}
        cfg = ControlPlaneConfig(planner="static", planner_mode="off")
        rows = tee(self.sink, self.tap)  # the database's rows, and the server's metrics
        self.cp = ControlPlane(phases, dict.fromkeys(phases, NODE), cfg, rows, backend=self)  # type: ignore[arg-type]
        self.timeline.append((0.0, 2, 2))

    def stop(self) -> dict[str, Any]:
        self.stopped = True
        for t in self.threads:
            t.join(5)
        return {"run_id": self.run_id, "switches": self.cp.num_switches if self.cp else 0}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def ended(self) -> str | None:
        return "the toy cluster stopped" if self.stopped else None

    def node_ids(self) -> list[int]:
        return [0, 1, 2, 3]

    def node_status(self, node: int) -> NodeStatus:
        return NodeStatus(
            False, node, 1, 0, 100 * node, 1000, 0, 0, 5, 7, {"toy": f"engine {node}"}
        )

    def in_flight(self) -> int:
        return 2

    def split_timeline(self) -> list[tuple[float, int, int]]:
        return self.timeline

    def health_details(self) -> dict[str, Any]:
        return {"source": self.source}

    def cluster_details(self) -> dict[str, Any]:
        return {"source": self.source}

    def flush_telemetry(self) -> None:
        self.flushes += 1

    # EngineBackend: a switch takes 0.2 s; node 3's engine refuses.
    def begin_switch(self, node: int, to_phase: str, mode: str, now: float) -> None:
        def run() -> None:
            time.sleep(0.2)
            assert self.cp is not None
            with self.cp.lock:
                if node == 3:
                    self.cp.cancel_switch(node)
                else:
                    self.cp.complete_switch(node, self.now(), drained=1)
                    self.timeline.append((self.now(), *self.cp.split()))

        t = threading.Thread(target=run)
        self.threads.append(t)
        t.start()

    def complete(self, n: int) -> None:
        assert self.cp is not None and self.listener is not None
        with self.cp.lock:
            now = self.now()
            for i in range(n):
                self.listener(CompletedRequest(now - 1.0 - i, now - 0.5, now))


@pytest.fixture
def toy() -> Iterator[tuple[ToyCluster, ControlService, str]]:
    cluster = ToyCluster()
    service = ControlService(cluster, ServiceConfig(sample_every_s=0.1, flush_every_s=0.1))
    with ServerThread(create_app(service, TOKEN)) as server:
        yield cluster, service, server.url
    assert service.summary == {"run_id": "toy-run", "switches": 1}


def test_every_endpoint_answers_from_the_protocol(
    toy: tuple[ToyCluster, ControlService, str],
) -> None:
    cluster, _service, url = toy
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=10) as http:
        h = http.get("/v1/health").json()
        assert (h["status"], h["run_id"], h["source"], h["finished"]) == (
            "ok",
            "toy-run",
            "toy",
            False,
        )
        cluster.complete(3)
        c = http.get("/v1/cluster").json()
        assert c["split"] == {"prefill": 2, "decode": 2} and c["source"] == "toy"
        assert c["nodes"][3] == {
            "id": 3, "phase": "decode", "switching": None, "out_of_service": False, "queue": 3,
            "running": 1, "waiting_kv": 0, "kv_gpu_used": 300, "kv_gpu_capacity": 1000,
            "kv_host_used": 0, "kv_host_capacity": 0, "prefill_iterations": 5,
            "decode_iterations": 7, "toy": "engine 3",
        }  # fmt: skip
        lat = c["latency"]
        assert c["requests_completed"] == 3 and lat["requests"] == 3 and lat["in_flight"] == 2
        assert lat["ttft_p50_s"] == pytest.approx(0.5 + 1.0, abs=1e-6)
        # A switch the engine carries out, and one it refuses (rolled back, no row).
        r = http.post("/v1/nodes/0/phase", json={"phase": "decode"}, headers=auth)
        assert r.status_code == 200 and r.json()["status"] == "switching"
        r = http.post("/v1/nodes/3/phase", json={"phase": "prefill"}, headers=auth)
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while any(n["switching"] for n in http.get("/v1/cluster").json()["nodes"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        phases = [n["phase"] for n in http.get("/v1/cluster").json()["nodes"]]
        assert phases == ["decode", "prefill", "decode", "decode"]
        assert [r["node_id"] for r in cluster.sink.rows("phase_switches")] == [0]
        r = http.post("/v1/nodes/1/phase", json={"phase": "decode"}, headers=auth)
        assert r.status_code == 409 and "last available prefill node" in r.json()["detail"]
        assert (
            http.post("/v1/nodes/7/phase", json={"phase": "decode"}, headers=auth).status_code
            == 404
        )
        # Planner and router settings, branches, directory, metrics, timeline.
        assert (
            http.put("/v1/planner", json={"mode": "advise"}, headers=auth).json()["mode"]
            == "advise"
        )
        r = http.put("/v1/planner", json={"window_s": 30}, headers=auth)
        assert (
            r.status_code == 422 and "start pdlab serve with --planner gain" in r.json()["detail"]
        )
        r = http.put("/v1/router", json={"policy": "round-robin", "copy_price": 1e-6}, headers=auth)
        assert r.json()["policy"] == "round-robin" and r.json()["copy_price"] == 1e-6
        assert http.post("/v1/planner/apply", headers=auth).status_code == 409
        assert http.get("/v1/branches").json() == {"active": 0, "branch_ids": []}
        assert http.get("/v1/branches/x").status_code == 404
        assert http.get("/v1/directory/stats").json()["block_tokens"] == 256
        metrics = http.get("/metrics").text
        assert "pdlab_requests_completed_total 3.0" in metrics
        # The switch row the control plane wrote reached the server's counters too.
        assert (
            'pdlab_node_phase_switches_total{from_phase="prefill",node="0",to_phase="decode",'
            'trigger="manual"} 1.0' in metrics
        )
        assert 'pdlab_kv_cache_usage_perc{node="3",tier="gpu"} 0.3' in metrics
        tl = http.get("/v1/timeline").json()
        assert len(tl["samples"]["t"]) >= 1 and set(tl["samples"]["queued"]) <= {6}
        assert [s["prefill"] for s in tl["split"]] == [2, 1]
        assert cluster.flushes >= 1
        # Once the cluster ended, mutations are refused with its reason; reads go on.
        cluster.stopped = True
        r = http.post("/v1/nodes/2/phase", json={"phase": "prefill"}, headers=auth)
        assert r.json()["detail"] == "the toy cluster stopped; cannot switch node 2"
        assert http.get("/v1/health").json()["finished"]
