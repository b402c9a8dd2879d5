"""A live cluster of torch engines under pdlab's SGLang adapter (SPEC §6, §9 must-shows).

`SGLangCluster` discovers three torch engines (1 prefill, 2 decode) from a cluster file,
agent programs run through its proxy, the KV directory fills from the engines' KV events,
iteration rows with exact ΣA and activated experts land in DuckDB, and a decode -> prefill
switch through `ControlPlane.request_switch` keeps the node's KV in place.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine
from cluster.live.agent_client import TokenMap, play_programs
from cluster.live.cluster import SGLangCluster
from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
from cluster.live.serving import ServerThread
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds
from telemetry import open_reader
from toolkit.serve.sglang import create_sglang_app

TOKEN = "t0k"


def _until(pred, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _agent(program_id: str) -> Program:
    """Every turn kind of paper 003's programs in seven turns."""
    b = ProgramBuilder(program_id, "handmade", SegmentIds())
    system = Segment(7, 600)  # shared by every program (same token ids)
    root = b.start("root", (system, b.seg(200)), 40)
    b.step("root", (b.seg(120),), 30, gap_s=0.0, tool="bash")
    fork_at = b.step("root", (b.seg(80),), 20, gap_s=0.0, tool="bash")
    b.fork("alt", fork_at, (b.seg(60),), 20, gap_s=0.0)
    b.finish("alt")
    b.subagent("helper", root, (system, b.seg(300)), 20, gap_s=0.0)
    b.finish("helper")
    b.compact("root", 1, (b.seg(150),), 20, gap_s=0.0, tool="compact")
    b.step("root", (b.seg(50),), 20, gap_s=0.0, tool="bash")
    b.finish("root")
    return b.build()


@pytest.fixture
def torch_cluster(tmp_path):  # type: ignore[no-untyped-def]
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
    m = cfg.model
    settings = ClusterSettings(
        tokenizer="toy", moe_top_k=m.top_k, moe_experts=m.num_experts, health_interval_s=0.2
    )
    db = tmp_path / "torch.duckdb"
    cluster = SGLangCluster(ClusterConfig(specs, settings), db_path=db)
    server = ServerThread(create_sglang_app(cluster, TOKEN))
    try:
        server.start()
        yield engines, cluster, server, db
    finally:
        server.stop()
        for e in engines:
            e.stop()


def test_agents_fill_the_directory_and_telemetry_of_a_torch_cluster(torch_cluster) -> None:  # type: ignore[no-untyped-def]
    engines, cluster, server, db = torch_cluster
    cp = cluster.cp
    tokens = TokenMap(vocab_lo=1, vocab_hi=256, token_scale=0.1, seed=1)
    programs = [_agent("agent-0"), _agent("agent-1")]
    results = asyncio.run(play_programs(server.url, programs, tokens, max_output_tokens=4))
    assert len(results) == 14 and {r.status for r in results} == {200}
    assert {r.prefill_node for r in results} == {0} and {r.decode_node for r in results} <= {1, 2}
    decoders = sorted({r.decode_node for r in results})
    # The directory holds the prefill node's blocks and, unlike SGLang's decode without a
    # radix cache, the decode nodes' blocks too (the KV they received and generated).
    assert _until(lambda: cp.node_blocks(0) > 0)
    assert _until(lambda: all(cp.node_blocks(n) > 0 for n in decoders))

    # Decode -> prefill through the control plane: the node keeps its KV.
    node = decoders[0]
    with cp.lock:
        held = cp.node_blocks(node)
        cp.request_switch(node, "prefill", cluster.now(), trigger="manual")

    def state() -> dict:  # type: ignore[type-arg]
        return httpx.get(f"{server.url}/v1/cluster", timeout=10).json()["nodes"][node]

    assert _until(lambda: state()["phase"] == "prefill" and state()["switching"] is None)
    info = httpx.get(f"{engines[node].endpoints.http_url}/server_info", timeout=10).json()
    assert info["disaggregation_mode"] == "prefill"
    assert info["internal_states"][0]["kv_gpu_used_tokens"] > 0
    assert info["internal_states"][0]["kv_host_used_tokens"] > 0
    time.sleep(0.3)  # any KV event the switch might have sent has arrived
    assert cp.node_blocks(node) == held > 0  # no AllBlocksCleared
    s = state()
    assert s["kv_gpu_used"] + s["kv_host_used"] > 0 and s["last_switch"]["ok"]
    # The engine's own counts: the host tier (written through) is not empty.
    assert s["kv_host_used"] > 0 and s["kv_host_capacity"] == 1024 * 16
    server.stop()

    r = open_reader(db)
    pre, dec = r.table("prefill_iterations"), r.table("decode_iterations")
    assert pre.height > 0 and dec.height > 0
    assert set(pre["node_id"].to_list()) == {0} and set(dec["node_id"].to_list()) <= {1, 2}
    top_k, experts = engines[0].config.model.top_k, engines[0].config.model.num_experts
    for t in (pre, dec):
        assert t["experts_active"].null_count() == 0
        assert t["experts_active"].min() >= top_k and t["experts_active"].max() <= experts
    # Exact ΣA: a lone request of t_uc new tokens over t_c cached ones.
    one = pre.filter(pre["num_reqs"] == 1)
    want = one["t_uc"] * one["t_c"] + one["t_uc"] * (one["t_uc"] + 1) / 2
    assert one.height > 0 and (one["attn_pairs"] == want).all()
    assert (pre["t_c"] > 0).sum() > 0  # prefix reuse on the prefill engine
    # The router saw the same prefixes: request paths and the engine's blocks share hashes.
    assert (r.table("router_decisions")["cached_tokens"] > 0).sum() >= 4
    assert (r.table("requests")["t_c"] > 0).sum() >= 4
    kv = r.table("kv_events")
    assert {"gpu", "host"} <= set(kv["tier"].to_list())
    assert "cleared" not in set(kv["kind"].to_list())
    sw = r.table("phase_switches")
    assert sw["from_phase"].to_list() == ["decode"] and sw["to_phase"].to_list() == ["prefill"]


def test_a_switch_that_keeps_the_cache_records_no_lost_kv(torch_cluster) -> None:  # type: ignore[no-untyped-def]
    _, cluster, server, db = torch_cluster
    body = {"input_ids": list(range(1, 120)), "sampling_params": {"max_new_tokens": 3}}
    r = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert r.status_code == 200
    node = int(r.headers["x-pd-decode-node"])
    cp = cluster.cp
    assert _until(lambda: cp.node_blocks(node) > 0)
    with cp.lock:
        cp.request_switch(node, "prefill", cluster.now(), trigger="manual")
    assert _until(lambda: not cp.switches)
    server.stop()
    assert open_reader(db).table("phase_switches")["lost_kv_blocks"].to_list() == [0]


def test_branch_counts_reach_the_engines_and_leave_them_when_the_branch_ends(torch_cluster) -> None:  # type: ignore[no-untyped-def]
    engines, cluster, server, _ = torch_cluster
    cp = cluster.cp
    body = {"input_ids": list(range(1, 200)), "sampling_params": {"max_new_tokens": 2}}
    headers = {"X-Branch-Id": "agent-7/root", "X-Branch-Kind": "start", "X-Program-Id": "agent-7"}
    r = httpx.post(f"{server.url}/generate", json=body, headers=headers, timeout=60)
    assert r.status_code == 200
    node = int(r.headers["x-pd-prefill-node"])
    url = engines[node].endpoints.http_url

    def counted() -> int:
        return int(httpx.get(f"{url}/kv_eviction", timeout=10).json()["counted_blocks"])

    with cp.lock:
        want = len(cp.branch_counts(node))
    assert want >= 199 // 16  # the branch references the blocks of its context
    assert _until(lambda: counted() == want, timeout_s=20)
    r = httpx.post(f"{server.url}/v1/branches/agent-7/root/finish", timeout=10)
    assert r.status_code == 200
    with cp.lock:
        assert cp.branch_counts(node) == {}
    assert _until(lambda: counted() == 0, timeout_s=20)  # zeros were pushed: R_b forgotten
