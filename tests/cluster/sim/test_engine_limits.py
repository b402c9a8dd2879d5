"""Engine limits of the simulator's PD nodes (cluster/sim/config.py `engine_profile`,
prefill.py, decode.py, tiered_memory.py): a decode node at `max_num_seqs` queues, a small KV
capacity preempts and every request still finishes, the token budget chunks a long prompt,
KV capacity comes from GPU memory, and bad limits fail with errors naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError, MemorySink
from cluster.data import BUNDLED
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from cluster.sim.simulator import SimConfig, Simulator
from toolkit.cli import app

LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
N = 24  # requests in the trace
SMALL = dict(
    nodes=3,
    split="1P2D",
    planner="static",
    profile="h200",
    telemetry="compact",
    duration_s=600.0,
    warmup_s=0.1,
    agents=1,
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N single-turn requests, 50 ms apart; the last has a 6,000-token prompt."""
    path = tmp_path_factory.mktemp("limits") / "t.jsonl"
    with path.open("w") as f:
        for i in range(N):
            long = i == N - 1
            rec = {
                "timestamp": 50 * i,
                "input_length": 6000 if long else 1000 + 10 * i,
                "output_length": 30 if long else 240,
                "hash_ids": [10 * i, 10 * i + 1],
            }
            f.write(json.dumps(rec) + "\n")
    return path


def _run(trace: Path, **kw: object) -> tuple[Simulator, dict, MemorySink]:
    sink = MemorySink()
    sim = Simulator(SimConfig(workload=str(trace), **(SMALL | kw)), sink=sink)
    return sim, sim.run(), sink


@pytest.fixture(scope="module")
def unlimited(trace: Path) -> tuple[Simulator, dict, MemorySink]:
    return _run(trace)


def _all_finished(sim: Simulator, summary: dict) -> None:
    assert len(sim.requests) == N and all(r.t_done is not None for r in sim.requests)
    assert summary["programs_finished"] == N


def test_defaults_report_no_limits(unlimited):
    sim, s, sink = unlimited
    _all_finished(sim, s)
    assert "engine_limits" not in s and "mean_decode_wait_s" not in s
    assert max(r["batch_size"] for r in sink.rows("decode_iterations")) > 3


def test_a_decode_node_at_max_num_seqs_queues(trace, unlimited):
    sim, s, sink = _run(trace, max_num_seqs=3)
    _all_finished(sim, s)
    batches = [r["batch_size"] for r in sink.rows("decode_iterations")]
    assert max(batches) == 3  # never more, and the cap was reached
    assert s["engine_limits"]["max_num_seqs"] == 3
    assert s["decode_refused"] > 0  # requests waited for a seat...
    assert s["mean_decode_wait_s"] > 0
    assert s["mean_e2e_s"] > unlimited[1]["mean_e2e_s"]  # ...and finished later
    assert s["preemptions_total"] == 0  # the profile's KV holds them all


def test_a_small_kv_capacity_preempts_and_every_request_finishes(trace):
    # 5,000 GPU KV tokens per node: four ~1,100-token prompts fit, not their outputs too.
    sim, s, sink = _run(trace, max_num_seqs=16, l1_tokens=5000)
    _all_finished(sim, s)
    assert s["preemptions_total"] > 0
    assert s["engine_limits"]["kv_tokens_per_node"] == 5000
    assert any(r.preemptions for r in sim.requests)
    # A preempted request was recomputed on its decode node, and still produced every token.
    decode_nodes = {r.decode_node for r in sim.requests if r.preemptions}
    prefill_rows = {r["node_id"] for r in sink.rows("prefill_iterations")}
    assert decode_nodes <= prefill_rows
    for r in sim.requests:
        assert r.decode_left <= 0
        assert r.t_done > r.t_first_token  # type: ignore[operator]
        assert r.generated == r.t_out or r.t_out <= 1  # every token once in the KV count
    # Every decode's KV was given back: nothing leaks across preemptions and recomputes.
    assert all(n.memory.decode_kv == 0 for n in sim.nodes.values())  # type: ignore[attr-defined]


def test_the_token_budget_chunks_a_long_prompt(trace):
    sim, s, sink = _run(trace, max_num_batched_tokens=1024, telemetry="full")
    _all_finished(sim, s)
    rows = sink.rows("prefill_iterations")
    assert max(r["t_uc"] for r in rows) <= 1024
    long = next(r for r in sim.requests if r.t_in == 6000)
    chunks = [
        r["t_uc"]
        for r in sink.rows("prefill_iteration_requests")
        if r["request_id"] == long.request_id
    ]
    assert len(chunks) >= 6 and all(c <= 1024 for c in chunks)
    assert sum(chunks) == long.t_uc


def test_collocated_decodes_take_their_tokens_from_the_budget(trace):
    sim, s, sink = _run(
        trace, nodes=1, split="collocated", max_num_batched_tokens=1024, max_num_seqs=8
    )
    _all_finished(sim, s)
    assert max(r["t_uc"] for r in sink.rows("prefill_iterations")) <= 1024
    assert max(r["batch_size"] for r in sink.rows("decode_iterations")) <= 8
    # The rows do not say how many decodes ran beside each prefill iteration; the stage's
    # rule is checked on the node: running decodes take t_fwd tokens each, and a seat.
    prefill, node = sim.engine.prefill, sim.nodes[0]
    node.decode_batch = sim.requests[:5]
    t_fwd = sim.profile.t_fwd  # h200: 6 tokens fed per decode (speculative decoding)
    assert prefill._room(node) == (1024 - 5 * t_fwd, 8 - 5)
    node.decode_batch = sim.requests[:8]
    assert not prefill.ready(node)  # no seat left for a new prefill
    node.decode_batch = []


@pytest.fixture(scope="module")
def llama_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "llama.json"
    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", ModelShape.load(LLAMA)
    )
    path.write_text(json.dumps(prof.to_json()))
    return path


def test_kv_capacity_from_gpu_memory_on_the_command_line(trace, llama_profile):
    res = CliRunner().invoke(
        app,
        [
            "simulate", "--workload", str(trace), "--nodes", "2", "--split", "1P1D",
            "--planner", "static", "--profile", str(llama_profile), "--duration", "300",
            "--warmup", "0.1", "--telemetry", "compact", "--gpu-memory-gib", "24",
            "--gpu-memory-utilization", "0.8", "--max-num-seqs", "32", "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    lim = s["engine_limits"]
    shape = ModelShape.load(LLAMA)
    engine = EngineSettings(
        gpu_memory_bytes=24 * GIB,
        gpu_memory_utilization=0.8,
        max_num_seqs=32,
        max_num_batched_tokens=lim["max_num_batched_tokens"],
    )
    # 24 GiB x 0.8 = 19.2 GiB, less ~15 GiB of bf16 weights and the activation reserve,
    # at 128 KiB per token (32 layers x 8 KV heads x 128 x 2 x 2 bytes): ~25-30K tokens.
    assert lim["kv_source"] == "GPU memory"
    assert lim["kv_tokens_per_node"] == engine.kv_capacity(shape).tokens
    assert 20_000 < lim["kv_tokens_per_node"] < 35_000
    assert s["programs_finished"] == N and lim["max_num_seqs"] == 32


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_num_seqs": 0}, "--max-num-seqs must be an integer >= 1"),
        ({"max_num_batched_tokens": -5}, "--max-num-batched-tokens must be an integer >= 1"),
        ({"gpu_memory_gib": 0.0}, "--gpu-memory-gib must be > 0"),
        ({"gpu_memory_gib": 80.0, "gpu_memory_utilization": 1.5}, "in (0, 1]"),
        ({"gpu_memory_utilization": 0.9}, "needs --gpu-memory-gib"),
        ({"gpu_memory_gib": 80.0, "l1_tokens": 1000}, "give one of --gpu-memory-gib"),
        ({"gpu_memory_gib": 80.0}, "needs a profile with a model"),  # h200 preset has none
    ],
)
def test_bad_limits_fail_naming_the_flag(trace, kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Simulator(SimConfig(workload=str(trace), **(SMALL | kw)))


def test_no_room_for_kv_is_an_error(trace, llama_profile):
    with pytest.raises(ConfigError, match="no room for KV"):
        Simulator(
            SimConfig(
                workload=str(trace), **(SMALL | {"profile": str(llama_profile)}), gpu_memory_gib=8.0
            )
        )


def test_a_decode_node_switching_away_keeps_and_finishes_its_preempted_requests(trace):
    cfg = SimConfig(workload=str(trace), **(SMALL | {"max_num_seqs": 16, "l1_tokens": 5000}))
    sim = Simulator(cfg)
    t = 0.0
    while not any(r.recompute for n in (1, 2) for r in sim.nodes[n].queue):
        t += 0.01  # until a decode node holds a preempted request
        assert t < 30.0, "no preemption on a decode node"
        sim.step_until(t)
    node = next(sim.nodes[n] for n in (1, 2) if any(r.recompute for r in sim.nodes[n].queue))
    held = {r.request_id for r in node.queue if r.recompute}
    sim.cp.request_switch(node.id, "prefill", sim.now, trigger="manual")
    assert held <= {r.request_id for r in node.queue}  # running work: it stays
    s = sim.run()
    _all_finished(sim, s)
    assert held <= {r.request_id for r in sim.requests if r.decode_node == node.id}
    assert [(row["node_id"], row["to"]) for row in sim.switch_rows()] == [(node.id, "prefill")]
