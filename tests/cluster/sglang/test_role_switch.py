"""Phase switches of live engines: the relaunch fallback and switches the engine refuses.

The relaunch command is a real shell command: it asks a small orchestrator (an HTTP server
in this test, as a user's script might ask systemd or a job scheduler) to restart the
stand-in in the new role on the same ports.
"""

from __future__ import annotations

import shlex
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

from cluster.engines.standin.server import StandinEngine
from telemetry import open_reader


class Orchestrator:
    """Restarts stand-in i with a new role when GET /relaunch?node=i&role=R arrives."""

    def __init__(self, engines: list[StandinEngine], tmp: Path) -> None:
        self.engines = engines
        self.tmp = tmp
        self.calls: list[tuple[int, str]] = []
        orch = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                q = parse_qs(urlsplit(self.path).query)
                node, role = int(q["node"][0]), q["role"][0]
                orch.relaunch(node, role)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def relaunch(self, node: int, role: str) -> None:
        old = self.engines[node]
        ep = old.endpoints
        assert ep is not None
        old.stop()
        self.engines[node] = StandinEngine(
            role,  # type: ignore[arg-type]
            port=old.port,
            kv_events_endpoint=ep.kv_events,
            kv_replay_endpoint=ep.kv_replay,
            forward_metrics_endpoint=f"ipc://{self.tmp}/fpm-{node}-{len(self.calls)}",
            bootstrap_port=ep.bootstrap_port or 0,
        )
        self.engines[node].start()
        self.calls.append((node, role))

    def command(self) -> str:
        fetch = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1]).read()"
        url = f"{self.url}/relaunch?node={{node_id}}&role={{role}}"
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(fetch)} '{url}'"

    def close(self) -> None:
        self.httpd.shutdown()


def _gen(url: str, text: str) -> httpx.Response:
    r = httpx.post(
        f"{url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}}, timeout=20
    )
    assert r.status_code == 200, r.text
    return r


def test_relaunch_fallback_switches_an_engine_without_role_switch(
    live_cluster, until, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    engines = [StandinEngine(r) for r in ("prefill", "prefill", "decode")]  # no role switch
    for e in engines:
        e.start()
    orch = Orchestrator(engines, tmp_path)
    try:
        h = live_cluster(engines=engines, router="round-robin", relaunch_command=orch.command())
        cp = h.cluster.cp
        prompt = "cached on node zero before the switch " * 4
        assert _gen(h.url, prompt).headers["x-pd-prefill-node"] == "0"
        assert until(lambda: cp.node_blocks(0) > 0)
        held = cp.node_blocks(0)
        r = httpx.post(
            f"{h.url}/v1/nodes/0/phase", json={"phase": "decode"}, headers=h.auth, timeout=10
        )
        assert r.status_code == 200, r.text

        def node0() -> dict:
            return httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][0]

        assert until(lambda: node0()["phase"] == "decode", 20.0)
        sw = node0()["last_switch"]
        assert sw["ok"] and sw["method"] == "relaunch" and sw["lost_kv_blocks"] == held
        assert orch.calls == [(0, "decode")]
        assert cp.node_blocks(0) == 0  # relaunch mode drops the node's KV
        # The relaunched engine decodes (binder: fewest requests, lowest id).
        assert _gen(h.url, "after the relaunch").headers["x-pd-decode-node"] == "0"
        # Back to prefill: the new engine's KV events reach the directory again.
        r = httpx.post(
            f"{h.url}/v1/nodes/0/phase", json={"phase": "prefill"}, headers=h.auth, timeout=10
        )
        assert r.status_code == 200
        assert until(lambda: node0()["phase"] == "prefill", 20.0)
        for i in range(4):  # round-robin over both prefill engines
            _gen(h.url, f"{i} stored again on the relaunched engine " * 4)
        assert until(lambda: cp.node_blocks(0) > 0)
        h.close()
    finally:
        orch.close()
    rows = open_reader(h.db).table("phase_switches").sort("t_decided")
    assert rows["to_phase"].to_list() == ["decode", "prefill"]
    assert rows["trigger"].to_list() == ["manual", "manual"]


def test_switches_the_engine_refuses_are_given_up_and_the_node_keeps_serving(
    live_cluster, until
) -> None:  # type: ignore[no-untyped-def]
    engines = [
        StandinEngine("prefill", enable_pd_role_switch=True, free_gpu_memory_gb=0.5),
        StandinEngine("prefill"),  # no --enable-pd-role-switch, and no relaunch command
        StandinEngine("prefill", enable_pd_role_switch=True),
        StandinEngine("decode", enable_pd_role_switch=True),
    ]
    for e in engines:
        e.start()
    h = live_cluster(engines=engines, decode_cuda_graph_memory_gb=2.0)
    cp = h.cluster.cp

    def node(n: int) -> dict:
        return httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][n]

    for n in (0, 1):
        r = httpx.post(
            f"{h.url}/v1/nodes/{n}/phase", json={"phase": "decode"}, headers=h.auth, timeout=10
        )
        assert r.status_code == 200
    assert until(lambda: node(0)["last_switch"] is not None and node(1)["last_switch"] is not None)
    s0, s1 = node(0)["last_switch"], node(1)["last_switch"]
    assert not s0["ok"] and "insufficient decode CUDA graph headroom" in s0["message"]
    assert "required=2.000 GB" in s0["message"]
    assert not s1["ok"] and "no relaunch_command is configured" in s1["message"]
    with cp.lock:
        assert cp.switches == {} and cp.unavailable_nodes() == set()
        cp.check_invariants()  # the given-up switches were rolled back (cancel_switch)
        assert cp.phases() == {0: "prefill", 1: "prefill", 2: "prefill", 3: "decode"}
    # The last decode node cannot switch; an unknown node is 404; a bad phase 422.
    r = httpx.post(f"{h.url}/v1/nodes/3/phase", json={"phase": "prefill"}, headers=h.auth)
    assert r.status_code == 409 and "last available decode node" in r.json()["detail"]
    r = httpx.post(f"{h.url}/v1/nodes/9/phase", json={"phase": "prefill"}, headers=h.auth)
    assert r.status_code == 404
    r = httpx.post(f"{h.url}/v1/nodes/0/phase", json={"phase": "both"}, headers=h.auth)
    assert r.status_code == 422
    # Refused nodes serve prefill again; a switch the engine accepts still works.
    assert {int(_gen(h.url, f"{i} again").headers["x-pd-prefill-node"]) for i in range(6)} <= {
        0,
        1,
        2,
    }
    r = httpx.post(f"{h.url}/v1/nodes/2/phase", json={"phase": "decode"}, headers=h.auth)
    assert r.status_code == 200
    assert until(lambda: node(2)["phase"] == "decode")
    assert node(2)["last_switch"]["method"] == "role-switch"
    h.close()
    rows = open_reader(h.db).table("phase_switches")
    assert rows["node_id"].to_list() == [2]  # only completed switches are rows
