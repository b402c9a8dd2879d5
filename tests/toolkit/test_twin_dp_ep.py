"""`pdlab twin` of an MoE model served DP2 with expert parallelism (toolkit.twin.run).

The workload is the real ShareGPT run's (300 requests, Poisson ~10 req/s, outputs >= 512
tokens; Qwen3-32B's request file: Qwen3-30B-A3B shares its tokenizer) with the engine
settings of a Qwen3-30B-A3B DP2 + EP run (TP1 per rank, 128 seats per rank, 2048-token
budget) on RTX PRO 6000s, priced by that GPU's Qwen3-30B-A3B operator profile. Its request
file records no DP rank, as LLMServingSim's bench does not: the replay must spread the
requests as vLLM's DP load balancer does, not queue them all on rank 0 (which gave p50 TTFT
17 s at ~116 running of 128 seats on one rank while the other idled).
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from telemetry import open_reader
from toolkit.cli import app
from toolkit.importers import BenchRun, read_vllm_bench, write_runs
from toolkit.twin.engine_inputs import BALANCED, load_engine_inputs
from toolkit.twin.parameters import with_parameters
from toolkit.twin.run import TwinResult, replay_inputs, run_twin, sim_timings

MOE = BUNDLED / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("moe")
    run = tmp / "run"
    shutil.copytree(BUNDLED / "real_runs/rtxpro6000_qwen3_32b_vllm", run)
    meta = json.loads((run / "meta.json").read_text())
    meta["model"] = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    meta["engine_kwargs"].update(
        model=meta["model"],
        tensor_parallel_size=1,
        data_parallel_size=2,
        enable_expert_parallel=True,
        max_num_seqs=128,
    )
    (run / "meta.json").write_text(json.dumps(meta))
    db = tmp / "moe.duckdb"
    write_runs(db, [read_vllm_bench(run, run_id="moe", model_config=MOE)])
    prof = tmp / "moe.json"
    p = build_profile(
        BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b", ModelShape.load(MOE)
    )
    prof.write_text(json.dumps(p.to_json()))
    return db, prof


@pytest.fixture(scope="module")
def twin(moe: tuple[Path, Path]) -> TwinResult:
    db, prof = moe
    return run_twin(db, "moe", prof, samples=100, interval=False)


def test_the_dp2_ep_replay_at_10_rps_is_not_saturated(twin: TwinResult) -> None:
    e = twin.inputs.engine
    assert (e.data_parallel_size, e.expert_parallel_size, e.max_num_seqs) == (2, 2, 128)
    assert twin.inputs.ranks == BALANCED  # the run recorded no ranks
    # KV per rank from 96 GiB with half the experts: far more than the workload holds
    assert twin.inputs.kv.source == "GPU memory" and twin.inputs.kv.blocks > 30_000
    e0, e1 = twin.engines
    # the load balancer uses both ranks about equally
    assert 0.4 <= len(e0.requests) / 300 <= 0.6
    for rank in (e0, e1):
        # seats are not what paces the replay: below 3/4 of the 128 on average
        assert rank.running_mean < 0.75 * 128
        assert rank.num_preemptions == 0
        assert max(t[3] for t in rank.trace) < twin.inputs.kv.blocks / 2
    # most requests start at once: TTFT is a prefill, not a queue
    assert twin.metrics["ttft_p50_s"].sim < 1.0
    ttft = twin.sim.t_first_token - twin.sim.t_arrival
    assert np.mean(ttft < 1.0) > 0.6
    # in step: the ranks end every step together, a rank without work running dummy steps
    assert [t for t, *_ in e0.trace] == [t for t, *_ in e1.trace]


def test_the_twin_says_what_no_data_measured(moe: tuple[Path, Path], twin: TwinResult) -> None:
    params = {p.name: p for p in twin.inputs.parameters}
    # the run's cluster_config.json describes the link; nothing measured it on the run, so
    # its error is the collective cost's range
    assert params["link_gbps"].source == "described" and not params["link_gbps"].ranged
    assert params["link_gbps"].value == 16.0
    for name, source in (
        ("expert_load_skew", "assumed"),
        ("collective_cost", "assumed"),
        ("cpu_overhead", "assumed"),
        ("cuda_graph_saving_s", "assumed"),
        ("kv_blocks", "estimated"),  # from GPU memory
    ):
        p = params[name]
        assert p.source == source and p.ranged, name
        assert p.low is not None and p.high is not None and p.low <= p.value <= p.high, name
    assert (params["expert_load_skew"].low, params["expert_load_skew"].high) == (1.0, 1.2)
    assert params["cuda_graph_max_batch"].source == "assumed"  # not recorded: no DP padding
    # the CLI prints them and stores them with the twin run
    db, prof = moe
    args = ["twin", str(db), "--run", "moe", "--profile", str(prof), "--no-interval"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {p["name"]: p["source"] for p in doc["parameters"]}["expert_load_skew"] == "assumed"
    assert [r["requests"] for r in doc["dp_ranks"]] == [len(x.requests) for x in twin.engines]
    assert doc["engine"]["ranks"] == BALANCED
    stored = open_reader(db).runs().filter(run_id=doc["twin_run_id"])["config"][0]
    assert json.loads(stored)["parameters"] == doc["parameters"]
    text = runner.invoke(app, [*args, "--no-store"])
    assert "expert_load_skew = 1 (assumed, range 1-1.2)" in " ".join(text.stdout.split())
    assert "DP ranks (vLLM's DP load balancer)" in " ".join(text.stdout.split())


def test_assumed_parameters_can_be_swept(twin: TwinResult) -> None:
    def tpot(inputs) -> float:  # type: ignore[no-untyped-def]
        t = sim_timings(twin.requests, replay_inputs(inputs, twin.requests))
        m = t.t_out > 1
        return float(np.mean((t.t_done - t.t_first_token)[m] / (t.t_out[m] - 1)))

    base = tpot(twin.inputs)
    assert base == pytest.approx(twin.metrics["tpot_mean_s"].sim)
    # a busier busiest rank and a slower link each slow every step
    assert tpot(with_parameters(twin.inputs, {"expert_load_skew": 1.2})) > base
    slow = with_parameters(twin.inputs, {"link_gbps": 8.0})
    assert slow.pricer.parallel.link_gbps == 8.0 and tpot(slow) > base
    assert {p.name: p.value for p in slow.parameters}["link_gbps"] == 8.0
    small = with_parameters(twin.inputs, {"kv_blocks": 5000})
    assert small.kv.blocks == 5000 and small.kv.tokens == 5000 * 16
    with pytest.raises(ConfigError, match="unknown nope"):
        with_parameters(twin.inputs, {"nope": 1.0})


def test_ranks_of_an_older_import_are_recognised(tmp_path: Path, moe: tuple[Path, Path]) -> None:
    """Imported before the importer said "dp_ranks": every request on rank 0 is the default,
    not a rank; requests spread over ranks were recorded."""
    _, prof = moe
    engine = EngineSettings(
        engine="vllm", max_num_seqs=16, data_parallel_size=2, expert_parallel_size=2,
        num_gpu_blocks=2000,
    )  # fmt: skip
    for name, nodes, want in (("zero", [0] * 6, BALANCED), ("split", [0, 1] * 3, "recorded")):
        run = BenchRun(
            name, datetime(2026, 1, 1, tzinfo=UTC), "test", {"engine": engine.to_json()},
            ["dp0", "dp1"], "test",
        )  # fmt: skip
        for i, node in enumerate(nodes):
            run.add_request(
                request_id=f"r{i}", program_id=f"r{i}", branch_id=f"r{i}", t_arrival=0.1 * i,
                prefill_node=node, decode_node=node, t_in=100, t_c=0, t_fetch=0, t_out=10,
                t_first_token=0.1 * i + 0.05, t_done=0.1 * i + 0.5,
            )  # fmt: skip
        db = tmp_path / f"{name}.duckdb"
        write_runs(db, [run])
        x = load_engine_inputs(db, name, prof)
        assert x.ranks == want
        assert x.requests["node"].null_count() == (6 if want == BALANCED else 0)
