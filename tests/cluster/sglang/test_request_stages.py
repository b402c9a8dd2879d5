"""Stage timestamps of live PD requests (`request_stages`) and the passes' CPU overhead.

A live cluster of real torch engines (1 prefill, 1 decode, in-process) serves a few agents
through the PD proxy. Every completed request gets a `request_stages` row whose stamps,
taken by the proxy and by both engines on one host's clock, are in the order a request
lives them; every iteration row carries the engine loop's overhead outside the forward.
"""

from __future__ import annotations

import asyncio

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

# The order a PD request lives its stages in (requests.* and request_stages.*), along the
# engines' path; the proxy forwards the first token somewhere between the decode engine
# emitting it and the request's end (after the last token's emission, when it lags).
ORDER = (
    "t_arrival",
    "t_dispatched",
    "t_prefill_received",
    "t_prefill_queued",
    "t_prefill_forward",
    "t_prefill_done",
    "t_kv_ready",
    "t_decode_join",
    "t_first_emit",
    "t_last_emit",
    "t_done",
)
FIRST = ("t_first_emit", "t_first_token", "t_done")


def _agent(program_id: str) -> Program:
    b = ProgramBuilder(program_id, "handmade", SegmentIds())
    b.start("root", (Segment(7, 150), b.seg(40)), 6)
    for _ in range(2):
        b.step("root", (b.seg(20),), 6, gap_s=0.0, tool="bash")
    b.finish("root")
    return b.build()


@pytest.fixture(scope="module")
def live_db(tmp_path_factory):  # type: ignore[no-untyped-def]
    cfg = EngineConfig(seed=1, gpu_pages=256, host_pages=512)
    engines = [TorchEngine(cfg, role) for role in ("prefill", "decode")]  # type: ignore[arg-type]
    for e in engines:
        e.start()
    specs = tuple(
        EngineSpec(node_id=i, http_url=e.endpoints.http_url)  # type: ignore[union-attr]
        for i, e in enumerate(engines)
    )
    m = cfg.model
    settings = ClusterSettings(tokenizer="toy", moe_top_k=m.top_k, moe_experts=m.num_experts)
    db = tmp_path_factory.mktemp("stages") / "live.duckdb"
    cluster = SGLangCluster(ClusterConfig(specs, settings), db_path=db)
    server = ServerThread(create_sglang_app(cluster, "t0k"))
    try:
        server.start()
        tokens = TokenMap(vocab_lo=1, vocab_hi=256, token_scale=1.0, seed=1)
        programs = [_agent(f"agent-{i}") for i in range(7)]
        results = asyncio.run(play_programs(server.url, programs, tokens, max_output_tokens=6))
        assert len(results) == 21 and {r.status for r in results} == {200}
        # the refit hands the measured overheads to the router and the planner
        cluster.refit_models()
        with cluster.cp.lock:
            priced = (cluster.cp.view.overhead_s, cluster.cp.models())
    finally:
        server.stop()
        for e in engines:
            e.stop()
    return db, priced


def test_every_request_has_its_stages_in_the_order_it_lived_them(live_db) -> None:  # type: ignore[no-untyped-def]
    r = open_reader(live_db[0])
    reqs = r.table("requests")
    stages = r.table("request_stages")
    assert stages.height == reqs.height == 21
    rows = reqs.join(stages, on=["run_id", "request_id"])
    assert rows.height == 21
    for col in (*ORDER, *FIRST):
        assert rows[col].null_count() == 0, col
    for row in rows.iter_rows(named=True):
        for chain in (ORDER, FIRST):
            times = [row[c] for c in chain]
            assert times == sorted(times), dict(zip(chain, times, strict=True))
    # the agents stream: the first token left the decode engine before the last one
    assert (rows["t_last_emit"] > rows["t_first_emit"]).all()
    # the proxy had the prefill's answer after the prefill pass, before the request ended
    assert (rows["t_prefill_answer"] >= rows["t_prefill_done"]).all()
    assert (rows["t_prefill_answer"] <= rows["t_done"]).all()


def test_iteration_rows_carry_the_passes_cpu_overhead_and_cpu_time(live_db) -> None:  # type: ignore[no-untyped-def]
    r = open_reader(live_db[0])
    for name in ("prefill_iterations", "decode_iterations"):
        t = r.table(name)
        assert t.height > 0
        over = t["overhead_s"].drop_nulls()
        # measured for (nearly) every pass: only a pass right after an idle wait may have 0
        assert over.len() >= 0.5 * t.height, name
        assert (over > 0).all() and (over < 1.0).all(), name
        # the forward's CPU time: measured for every pass, at most its wall time
        assert t["cpu_s"].null_count() == 0, name
        assert (t["cpu_s"] <= t["duration_s"] + 1e-4).all(), name


def test_the_live_router_and_planner_price_the_measured_overheads(live_db) -> None:  # type: ignore[no-untyped-def]
    db, (ttft_overhead_s, models) = live_db
    r = open_reader(db)
    rows = r.table("requests").join(r.table("request_stages"), on=["run_id", "request_id"])
    # at least the proxy-to-queue, hand-off and join stages of the first token, on average
    floor = (rows["t_prefill_queued"] - rows["t_arrival"]).mean() + (
        rows["t_kv_ready"] - rows["t_prefill_done"]
    ).mean()
    assert ttft_overhead_s >= 0.9 * floor > 0
    # every node's Eq. 4 charges the decode passes' CPU overhead (the prefill's needs
    # overhead_stats.MIN_SAMPLES passes, more than this short run's ~20)
    assert all(m.decode_overhead.per_pass_s > 0 for m in models.values())
