"""The twin of a PD cluster run (`pdlab twin DB --run R`, toolkit.twin.cluster).

A simulated run replayed against itself comes out close (the fits recover its profile, the
recorded cached prefixes are found again); a small live torch run (1P1D, in-process engines)
gives finite real and simulated figures with intervals and a stored 'twin' run; the CLI
prints the vLLM twin's JSON shape; a run without iteration rows, or no cluster run at all,
is a one-line error with exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime

import duckdb
import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.sim.config import SimConfig
from cluster.sim.runner import simulate
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds
from telemetry import open_reader
from toolkit.cli import app
from toolkit.importers import BenchRun, write_runs
from toolkit.twin.cluster import run_cluster_twin

runner = CliRunner()


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A small simulated 1P2D run (static split) with full telemetry."""
    db = tmp_path_factory.mktemp("twin-cluster") / "sim.duckdb"
    cfg = SimConfig(
        workload="cc",
        nodes=3,
        split="1P2D",
        agents=6,
        duration_s=90.0,
        warmup_s=0.0,
        planner="static",
        seed=3,
    )
    return db, simulate(cfg, db)["run_id"]


def test_a_simulated_run_replayed_against_itself_comes_out_close(sim_run) -> None:  # type: ignore[no-untyped-def]
    db, run_id = sim_run
    twin = run_cluster_twin(db, run_id, store=False, samples=200)
    doc = twin.to_json()
    c = doc["cluster"]
    assert (c["nodes"], c["split"], c["source"], c["switches"]) == (3, "1P2D", "sim", 0)
    assert doc["requests"] == twin.inputs.requests.height > 50
    # every recorded cached prefix is found again (to the block), so prefill does the same work
    assert c["cached_tokens"]["sim"] <= c["cached_tokens"]["real"]
    assert c["cached_tokens"]["sim"] >= 0.97 * c["cached_tokens"]["real"]
    # the fits price the simulator's iterations to a few percent (its noise is 3%), so the
    # mean correction of their relative errors is small
    assert all(f["mape"] < 0.06 for f in c["fits"] if f["coef"] is not None)
    assert 0.95 < c["scale"]["prefill"] < 1.05 and 0.95 < c["scale"]["decode"] < 1.05
    m = twin.metrics
    assert abs(m["e2e_mean_s"].error) < 0.05
    assert abs(m["tpot_mean_s"].error) < 0.05
    assert abs(m["ttft_mean_s"].error) < 0.15
    assert abs(m["throughput_rps"].error) < 0.05


def test_the_cli_prints_the_engine_twins_json_shape_and_stores_a_twin_run(sim_run) -> None:  # type: ignore[no-untyped-def]
    db, run_id = sim_run
    res = runner.invoke(app, ["twin", str(db), "--run", run_id, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"run_id", "twin_run_id", "metrics", "requests", "replay_wall_s", "iterations",
            "preemptions", "cluster"} <= set(doc)  # fmt: skip
    assert set(doc["metrics"]["ttft_mean_s"]) == {"real", "sim", "error", "ci95"}
    assert {f"{k}_{s}_s" for k in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99")}
    assert len(doc["metrics"]) == 13 and doc["run_id"] == run_id
    twin_id = doc["twin_run_id"]
    runs = open_reader(db).runs()
    assert runs.filter(runs["run_id"] == twin_id)["source"].to_list() == ["twin"]
    reqs = open_reader(db).table("requests")
    assert (reqs["run_id"] == twin_id).sum() == doc["requests"]
    # the table form says what the twin kept and how well the fits held
    res = runner.invoke(app, ["twin", str(db), "--run", run_id, "--no-store"])
    assert res.exit_code == 0, res.output
    assert "1P2D (static)" in res.stdout and "held-out MAPE" in res.stdout


def test_a_run_without_iteration_rows_is_a_clear_error(sim_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db, run_id = sim_run
    bare = tmp_path / "bare.duckdb"
    with duckdb.connect(str(bare)) as con:
        con.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
        for t in ("runs", "nodes", "requests", "prefill_iterations", "decode_iterations"):
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM src.{t} WHERE run_id = ?", [run_id])
        con.execute("DELETE FROM prefill_iterations")
        con.execute("DELETE FROM decode_iterations")
    with pytest.raises(ConfigError, match="0 prefill and 0 decode iteration rows"):
        run_cluster_twin(bare, run_id, store=False)
    res = runner.invoke(app, ["twin", str(bare)])
    assert res.exit_code == 2 and "iteration rows" in res.output
    # an engine model's settings need --profile
    res = runner.invoke(app, ["twin", str(bare), "--max-num-seqs", "8"])
    assert res.exit_code == 2 and "--max-num-seqs" in res.output and "--profile" in res.output


def test_an_imported_benchmark_run_needs_a_profile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "bench.duckdb"
    run = BenchRun("bench", datetime(2026, 1, 1, tzinfo=UTC), "vllm", {"engine": {}}, ["e0"], "x")
    run.add_request(
        request_id="r0", program_id="r0", branch_id="r0", t_arrival=0.0, prefill_node=0,
        decode_node=0, t_in=10, t_c=0, t_fetch=0, t_out=2, t_first_token=0.1, t_done=0.2,
    )  # fmt: skip
    write_runs(db, [run])
    res = runner.invoke(app, ["twin", str(db)])
    assert res.exit_code == 2 and "not a PD cluster run" in res.output and "--profile" in res.output


def _agent(program_id: str) -> Program:
    """Four turns of one branch behind a shared system prompt."""
    b = ProgramBuilder(program_id, "handmade", SegmentIds())
    b.start("root", (Segment(7, 200), b.seg(60)), 8)
    for _ in range(3):
        b.step("root", (b.seg(30),), 8, gap_s=0.0, tool="bash")
    b.finish("root")
    return b.build()


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A small live torch run: 1 prefill and 1 decode engine, five agents at once (decode
    batches of 1 to 5, so Eq. 2 can be fitted)."""
    from cluster.engines.torch.config import EngineConfig
    from cluster.engines.torch.engine import TorchEngine
    from cluster.live.agent_client import TokenMap, play_programs
    from cluster.live.cluster import SGLangCluster
    from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
    from cluster.live.serving import ServerThread
    from toolkit.serve.sglang import create_sglang_app

    cfg = EngineConfig(seed=1, gpu_pages=512, host_pages=1024)
    engines = [TorchEngine(cfg, role, enable_pd_role_switch=True) for role in ("prefill", "decode")]  # type: ignore[arg-type]
    for e in engines:
        e.start()
    specs = tuple(
        EngineSpec(node_id=i, http_url=e.endpoints.http_url)  # type: ignore[union-attr]
        for i, e in enumerate(engines)
    )
    m = cfg.model
    settings = ClusterSettings(tokenizer="toy", moe_top_k=m.top_k, moe_experts=m.num_experts)
    db = tmp_path_factory.mktemp("twin-torch") / "torch.duckdb"
    cluster = SGLangCluster(ClusterConfig(specs, settings), db_path=db)
    server = ServerThread(create_sglang_app(cluster, "t0k"))
    try:
        server.start()
        programs = [_agent(f"agent-{i}") for i in range(5)]
        tokens = TokenMap(vocab_lo=1, vocab_hi=256, token_scale=1.0, seed=1)
        results = asyncio.run(play_programs(server.url, programs, tokens, max_output_tokens=8))
        assert len(results) == 20 and {r.status for r in results} == {200}
    finally:
        server.stop()
        for e in engines:
            e.stop()
    return db


def test_the_twin_of_a_live_torch_run_has_finite_figures_with_intervals(torch_run) -> None:  # type: ignore[no-untyped-def]
    twin = run_cluster_twin(torch_run, None, samples=200)
    c = twin.inputs.cluster
    # (`pdlab serve --engines torch` records source 'torch'; this cluster is SGLangCluster's)
    assert (c.source, c.split, c.block_tokens, c.kv_tokens) == ("sglang", "1P1D", 16, 512 * 16)
    prof = twin.inputs.profile
    assert (prof.top_k, prof.num_experts, prof.t_fwd) == (2, 16, 1.0)  # tiny-moe, no MTP
    # rescaled to the measured pass time, summed per phase (CPU passes: a heavy upper tail)
    assert all(math.isfinite(x) and x > 0 for x in twin.inputs.scale)
    raw = run_cluster_twin(torch_run, twin.run_id, samples=50, store=False, rescale=False)
    assert raw.inputs.scale == (1.0, 1.0)
    assert raw.inputs.profile.decode[2] * twin.inputs.scale[1] == pytest.approx(prof.decode[2])
    assert len(twin.sim_requests) == 20
    for name in ("ttft_mean_s", "ttft_p90_s", "e2e_mean_s", "e2e_p90_s", "tpot_mean_s"):
        m = twin.metrics[name]
        assert m.real > 0 and m.sim > 0 and math.isfinite(m.error), (name, m)
        assert m.ci95[0] <= m.error <= m.ci95[1], (name, m)
    # the twin run: the real request ids on the real time axis
    reqs = open_reader(torch_run).table("requests")
    real = reqs.filter(reqs["run_id"] == twin.run_id).sort("request_id")
    # The agents stream their answers, so the real first token is out before the decode
    # ends: each later token took at least a fraction of the shortest decode pass.
    step = float(open_reader(torch_run).table("decode_iterations")["duration_s"].min())
    multi = real.filter(real["t_out"] > 1)
    assert multi.height > 0
    assert ((multi["t_done"] - multi["t_first_token"]) >= 0.5 * step * (multi["t_out"] - 1)).all()
    sim = reqs.filter(reqs["run_id"] == twin.twin_run_id).sort("request_id")
    assert sim["request_id"].to_list() == real["request_id"].to_list()
    assert sim["t_arrival"].to_list() == pytest.approx(real["t_arrival"].to_list())
    assert (sim["t_first_token"] > sim["t_arrival"]).all()


def test_the_twin_of_a_live_torch_run_prices_its_serving_overheads(torch_run) -> None:  # type: ignore[no-untyped-def]
    runs = open_reader(torch_run).runs()
    rid = runs.filter(runs["source"] != "twin")["run_id"][0]  # (other tests stored twins)
    twin = run_cluster_twin(torch_run, rid, samples=50, store=False)
    over = twin.to_json()["cluster"]["overheads"]
    # measured from the run's request stages and passes, per stage
    assert {"ingress", "handoff", "first_out", "last_out", "decode_pass"} <= set(over)
    assert all(v["samples"] > 0 and v["mean_s"] >= 0 for v in over.values())
    bare = run_cluster_twin(torch_run, rid, samples=50, store=False, overheads=False)
    assert bare.inputs.overheads is None and bare.to_json()["cluster"]["overheads"] == {}
    # the first token reaches the client after the proxy, the hand-off and the way out
    added = over["ingress"]["mean_s"] + over["first_out"]["mean_s"]
    gap = twin.metrics["ttft_mean_s"].sim - bare.metrics["ttft_mean_s"].sim
    assert gap > 0.5 * added > 0
    assert twin.metrics["e2e_mean_s"].sim > bare.metrics["e2e_mean_s"].sim
