"""End to end on loopback against SGLang stand-ins (SPEC §6 must-shows).

Agent programs (fork, sub-agent, compaction, branch finish) run through the proxy; KV
events from the engines build the directory and show up as prefix reuse in routing;
forward-pass metrics land in DuckDB and `toolkit.fit.run.fit_run` recovers the stand-ins'
iteration-time models; a manual phase switch through the REST API drains the node, calls
/pd_role_switch, and resumes routing with the node in its new role.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from cluster.engines.standin.scheduler import FAST_DECODE, FAST_PREFILL, SchedulerConfig
from cluster.engines.standin.server import StandinEngine
from cluster.live.agent_client import TokenMap, play_programs
from cluster.workloads import make_workload
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds
from telemetry import open_reader
from toolkit.fit.run import fit_run


def _small_agent(program_id: str) -> Program:
    """Every turn kind of paper 003's programs in nine turns."""
    b = ProgramBuilder(program_id, "handmade", SegmentIds())
    system = Segment(7, 600)  # a shared system prompt (same ids in every program)
    root = b.start("root", (system, b.seg(200)), 40)
    b.step("root", (b.seg(120),), 30, gap_s=0.0, tool="bash")
    fork_at = b.step("root", (b.seg(80),), 20, gap_s=0.0, tool="bash")
    b.fork("alt", fork_at, (b.seg(60),), 20, gap_s=0.0)
    b.step("alt", (b.seg(90),), 20, gap_s=0.0, tool="bash")
    b.finish("alt")
    b.subagent("helper", root, (system, b.seg(300)), 20, gap_s=0.0)
    b.finish("helper")
    b.compact("root", 1, (b.seg(150),), 20, gap_s=0.0, tool="compact")
    b.step("root", (b.seg(50),), 20, gap_s=0.0, tool="bash")
    b.finish("root")
    return b.build()


async def _burst(url: str, n: int) -> list[int]:
    """n concurrent requests of varied lengths (batch sizes and prompt lengths vary)."""
    async with httpx.AsyncClient() as c:
        rs = await asyncio.gather(
            *(
                c.post(
                    f"{url}/generate",
                    json={
                        "input_ids": [5000 + i] * (40 + 97 * i),
                        # long enough that all n overlap in decode: B ramps 1..n and back
                        "sampling_params": {"max_new_tokens": 30 + 5 * i},
                    },
                    timeout=60,
                )
                for i in range(n)
            )
        )
    return [r.status_code for r in rs]


def test_agents_build_the_directory_and_telemetry_that_pdlab_fit_fits(live_cluster) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster(refit_min_rows=10)
    cp = h.cluster.cp
    programs = [_small_agent("hand-0"), _small_agent("hand-1")]
    programs.append(make_workload("putnam", seed=2).next_program(0.0))
    tokens = TokenMap(token_scale=0.1, seed=1)
    results = asyncio.run(play_programs(h.url, programs, tokens, max_output_tokens=6))
    assert len(results) == sum(len(p.turns) for p in programs) > 18
    assert {r.status for r in results} == {200}
    assert {r.decode_node for r in results} == {2} and {r.prefill_node for r in results} <= {0, 1}
    statuses = asyncio.run(_burst(h.url, 12)) + asyncio.run(_burst(h.url, 12))
    assert set(statuses) == {200}
    with cp.lock:
        # Every branch finished through POST /v1/branches/{id}/finish: no counts remain.
        assert cp.active_branches() == []
        cp.check_invariants()
        assert cp.directory_stats()["counted_holdings"] == 0
        held = {n: cp.node_blocks(n) for n in (0, 1, 2)}
    assert held[0] + held[1] > 0 and held[2] == 0  # the decode stand-in caches nothing
    kv_rows = {n: h.cluster.engines[n].kv.num_rows for n in (0, 1, 2)}
    # Online learning: the router's models move from the profile to the engines' timings.
    assert h.cluster.refit_models() == {0: ("prefill",), 1: ("prefill",), 2: ("decode",)}
    with cp.lock:
        live = cp.models()
    assert live[0].prefill.c1 == pytest.approx(FAST_PREFILL.c1, rel=0.05)
    assert live[1].prefill.c0 == pytest.approx(FAST_PREFILL.c0, rel=0.05)
    assert live[2].decode.coef == pytest.approx(FAST_DECODE.coef, rel=0.05)
    node0 = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][0]
    assert node0["model"]["online_fit"]["phases"] == ["prefill"]
    assert node0["model"]["online_fit"]["mape"]["prefill"] < 0.02
    h.close()

    r = open_reader(h.db)
    req = r.table("requests")
    assert req.height == len(results) + 24 and req["t_done"].null_count() == 0
    # Prefix reuse: the putnam turns extend one context, so most find it cached where
    # the router sent them (engine-reported t_c, and the router's own cached_tokens).
    putnam = req.filter(req["program_id"] == programs[2].program_id).sort("t_arrival")
    assert (putnam["t_c"][1:] > 0).mean() > 0.9
    decisions = r.table("router_decisions")
    assert (decisions["cached_tokens"] > 0).sum() >= 20
    kinds = set(r.table("branch_events")["kind"].to_list())
    assert kinds == {"start", "append", "fork", "subagent", "compact", "finish"}
    kv = r.table("kv_events")
    assert {n: int((kv["node_id"] == n).sum()) for n in (0, 1, 2)} == kv_rows

    fit = fit_run(h.db, bootstrap=0)
    by_node = {n.node_id: n for n in fit.nodes}
    for n in (0, 1):
        pf = by_node[n].prefill
        assert pf.ok and pf.samples >= 10 and pf.mape < 0.02, pf
        c0, c1 = pf.coef[0], pf.coef[1]
        assert c0 == pytest.approx(FAST_PREFILL.c0, rel=0.05)
        assert c1 == pytest.approx(FAST_PREFILL.c1, rel=0.05)
        assert not by_node[n].decode.ok  # prefill engines run no decode passes
    dec = by_node[2].decode
    assert dec.ok and dec.mape < 0.02, dec
    assert dec.coef == pytest.approx((FAST_DECODE.d0, FAST_DECODE.d1, FAST_DECODE.d2), rel=0.05)
    # The same through the CLI: `pdlab fit DB --json` (and its model_fits rows).
    from typer.testing import CliRunner

    from toolkit.cli import app

    res = CliRunner().invoke(app, ["fit", str(h.db), "--json", "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model_fits_written"] and out["nodes"][2]["decode"]["coef"] is not None


def test_manual_phase_switch_through_the_rest_api(live_cluster, until) -> None:  # type: ignore[no-untyped-def]
    # A 2K-token prefill lasts ~6 s on node 1: the window in which the switch is asked for, seen
    # switching and drained must hold on a loaded machine too (it was ~1.5 s and raced there).
    slow = SchedulerConfig(time_scale=1200.0)
    engines = [
        StandinEngine("prefill", enable_pd_role_switch=True),
        StandinEngine("prefill", enable_pd_role_switch=True, config=slow),
        StandinEngine("decode", enable_pd_role_switch=True),
    ]
    for e in engines:
        e.start()
    h = live_cluster(engines=engines, router="round-robin")
    cp = h.cluster.cp
    short = {"text": "a short request " * 8, "sampling_params": {"max_new_tokens": 2}}
    for node in "010":  # round-robin: node 1 caches the short prompt; the long one goes there
        r = httpx.post(f"{h.url}/generate", json=short, timeout=20)
        assert r.headers["x-pd-prefill-node"] == node
    assert until(lambda: cp.node_blocks(1) > 0, 10.0)
    long_done: list[httpx.Response] = []
    long_body = {"input_ids": list(range(300, 2300)), "sampling_params": {"max_new_tokens": 3}}
    t = threading.Thread(
        target=lambda: long_done.append(httpx.post(f"{h.url}/generate", json=long_body, timeout=60))
    )
    t.start()
    assert until(lambda: h.cluster.proxy.outstanding(1) == 1, 10.0)  # prefilling for ~6 s

    denied = httpx.post(f"{h.url}/v1/nodes/1/phase", json={"phase": "decode"}, timeout=10)
    assert denied.status_code == 401
    r = httpx.post(
        f"{h.url}/v1/nodes/1/phase", json={"phase": "decode"}, headers=h.auth, timeout=10
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "switching" and r.json()["trigger"] == "manual"
    node1 = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][1]
    assert node1["switching"] is not None, node1
    assert node1["switching"]["to_phase"] == "decode" and node1["phase"] == "prefill"
    # Draining: nothing new goes to node 1 while its request finishes in place.
    for _ in range(2):
        got = httpx.post(f"{h.url}/generate", json=short, timeout=20)
        assert got.status_code == 200 and got.headers["x-pd-prefill-node"] == "0"
    again = httpx.post(
        f"{h.url}/v1/nodes/1/phase", json={"phase": "decode"}, headers=h.auth, timeout=10
    )
    assert again.status_code == 409 and "already switching" in again.json()["detail"]
    t.join(60)
    assert long_done and long_done[0].status_code == 200

    def phase1() -> str:
        return httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][1]["phase"]

    assert until(lambda: phase1() == "decode", 15.0)
    info = httpx.get(f"{engines[1].endpoints.http_url}/server_info", timeout=10).json()
    assert info["disaggregation_mode"] == "decode"
    node1 = httpx.get(f"{h.url}/v1/cluster", timeout=10).json()["nodes"][1]
    sw = node1["last_switch"]
    assert sw["ok"] and sw["method"] == "role-switch" and sw["drained"] == 1
    assert sw["lost_kv_blocks"] > 0 and sw["switch_s"] > 0
    # The switch released the prefix cache (AllBlocksCleared reached the directory).
    assert until(lambda: cp.node_blocks(1) == 0, 5.0)
    # Resumed as a decode node: the binder (fewest requests, lowest id) picks it now.
    got = httpx.post(f"{h.url}/generate", json=short, timeout=20)
    assert got.status_code == 200 and got.headers["x-pd-decode-node"] == "1"
    # ... and back to prefill (D -> P resets its counts, Alg. E.2).
    back = httpx.post(
        f"{h.url}/v1/nodes/1/phase", json={"phase": "prefill"}, headers=h.auth, timeout=10
    )
    assert back.status_code == 200
    assert until(lambda: phase1() == "prefill", 15.0)
    h.close()
    sw_rows = open_reader(h.db).table("phase_switches").sort("t_decided")
    assert sw_rows["trigger"].to_list() == ["manual", "manual"]
    assert sw_rows["from_phase"].to_list() == ["prefill", "decode"]
    assert sw_rows["drained"].to_list()[0] == 1
    assert (sw_rows["t_done"] > sw_rows["t_decided"]).all()


def test_pdlab_serve_sglang_serves_a_cluster_file(tmp_path, until) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal
    import socket
    import subprocess
    import sys
    from pathlib import Path

    engines = [StandinEngine(r, enable_pd_role_switch=True) for r in ("prefill", "decode")]
    for e in engines:
        e.start()
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(
        "[cluster]\ntokenizer = 'engine'\nmoe_top_k = 8\nmoe_experts = 64\n"
        + "".join(
            f"[[engines]]\nnode_id = {i}\nhttp_url = '{e.endpoints.http_url}'\n"
            for i, e in enumerate(engines)
        )
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "serve.duckdb"
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "serve", "--sglang", str(cfg), "--port", str(port),
         "--db", str(db), "--token", "t0k"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"pdlab serve: {url} token=t0k"), line

        def up() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert until(up, 30.0)
        chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=20)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        state = httpx.get(f"{url}/v1/cluster", timeout=10).json()
        assert state["source"] == "sglang" and state["split"] == {"prefill": 1, "decode": 1}
        r = httpx.post(
            f"{url}/v1/nodes/0/phase",
            json={"phase": "decode"},
            headers={"Authorization": "Bearer t0k"},
            timeout=10,
        )
        assert r.status_code == 409 and "last available prefill node" in r.json()["detail"]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'pdlab_split_nodes{phase="prefill"} 1.0' in metrics
        assert "pdlab_requests_completed_total 1.0" in metrics
        planner = httpx.get(f"{url}/v1/planner", timeout=10).json()
        assert planner["name"] == "static" and planner["mode"] == "advise"
        r = httpx.post(f"{url}/v1/planner/apply", headers={"Authorization": "Bearer t0k"})
        assert r.status_code == 409  # a static planner never recommends a split
        r = httpx.put(
            f"{url}/v1/router",
            json={"policy": "cache-aware"},
            headers={"Authorization": "Bearer t0k"},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["policy"] == "cache-aware"
        assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=20).status_code == 200
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(30)
        for e in engines:
            e.stop()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    reader = open_reader(db)
    assert reader.table("runs")["source"].to_list() == ["sglang"]
    assert reader.table("requests").height == 2
    assert reader.table("router_decisions")["policy"].to_list() == ["ttft", "cache-aware"]


def test_pdlab_serve_sglang_reports_an_unreachable_engine(tmp_path, closed_port) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    cfg = tmp_path / "cluster.toml"
    url = f"http://127.0.0.1:{closed_port}"
    cfg.write_text(f"[[engines]]\nnode_id = 0\nhttp_url = '{url}'\n")
    # A process of its own: were the engine found after all, `serve` would serve until killed,
    # and in-process it would leave its threads running under every later test.
    res = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "serve", "--sglang", str(cfg), "--port", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    # rich may wrap the line at any terminal width: compare with the line breaks as spaces
    assert f"cannot read {url}/server_info" in " ".join(out.split()), out
