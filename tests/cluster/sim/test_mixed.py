"""vLLM V1's mixed iterations on the simulator's collocated nodes with engine limits
(cluster/sim/mixed.py): decodes and prefill chunks run in one iteration, the batch stays
within max_num_seqs and the token budget, and the iteration is priced by the engine
model's rule (cluster/sim/engine_model/pricing.py)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from cluster.core import MemorySink
from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from cluster.sim.engine_model import ScheduledBatch, iteration_time
from cluster.sim.engine_model.replay import batch_pricer
from cluster.sim.engine_model.sequence import EngineRequest
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sim.tiered_memory import TieredMemory

LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
N = 12  # requests: 11 short ones decoding, then a long prompt
LONG = 6000
BUDGET = 1024
SEATS = 8
BASE = dict(
    nodes=1,
    split="collocated",
    planner="static",
    telemetry="full",
    duration_s=600.0,
    warmup_s=0.1,
    agents=1,
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N single-turn requests 20 ms apart; the last, a 6,000-token prompt, arrives while
    the others decode (400 tokens each)."""
    path = tmp_path_factory.mktemp("mixed") / "t.jsonl"
    with path.open("w") as f:
        for i in range(N):
            long = i == N - 1
            rec = {
                "timestamp": 20 * i + (200 if long else 0),
                "input_length": LONG if long else 300 + 10 * i,
                "output_length": 20 if long else 400,
                "hash_ids": [10 * i, 10 * i + 1],
            }
            f.write(json.dumps(rec) + "\n")
    return path


@pytest.fixture(scope="module")
def llama_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "llama.json"
    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", ModelShape.load(LLAMA)
    )
    path.write_text(json.dumps(prof.to_json()))
    return path


def _run(trace: Path, profile: str, **kw: object) -> tuple[Simulator, dict, MemorySink]:
    sink = MemorySink()
    sim = Simulator(SimConfig(workload=str(trace), profile=profile, **(BASE | kw)), sink=sink)
    return sim, sim.run(), sink


def _limited(trace: Path, profile: str) -> tuple[Simulator, dict, MemorySink]:
    return _run(trace, profile, max_num_seqs=SEATS, max_num_batched_tokens=BUDGET)


def _long_prefill(sim: Simulator, sink: MemorySink) -> tuple[list[dict], list[int]]:
    """The prefill rows of the iterations that ran the long prompt's chunks, in order, and
    its chunks' sizes."""
    long = next(r for r in sim.requests if r.t_in == LONG)
    mine = {
        r["iter_id"]: r["t_uc"]
        for r in sink.rows("prefill_iteration_requests")
        if r["request_id"] == long.request_id
    }
    rows = sorted(
        (r for r in sink.rows("prefill_iterations") if r["iter_id"] in mine),
        key=lambda r: r["t_start"],
    )
    return rows, [mine[r["iter_id"]] for r in rows]


def _max_decode_gap(sink: MemorySink, t0: float, t1: float) -> float:
    """Longest time between the starts of consecutive decode rows within [t0, t1]."""
    starts = sorted(r["t_start"] for r in sink.rows("decode_iterations"))
    inside = [t for t in starts if t0 <= t <= t1]
    return max(b - a for a, b in itertools.pairwise(inside))


@pytest.mark.parametrize("profile", ["h200", "llama"])
def test_decodes_and_a_prefill_chunk_share_each_iteration(trace, llama_profile, profile):
    prof = str(llama_profile) if profile == "llama" else profile
    sim, s, sink = _limited(trace, prof)
    assert s["programs_finished"] == N and all(r.t_done is not None for r in sim.requests)
    chunks, sizes = _long_prefill(sim, sink)
    long = next(r for r in sim.requests if r.t_in == LONG)
    assert len(chunks) >= LONG // BUDGET and sum(sizes) == long.t_uc
    assert max(sizes) < BUDGET  # the decodes took their tokens from every chunk's budget
    decode = {(r["t_start"], r["duration_s"]): r for r in sink.rows("decode_iterations")}
    t_fwd = sim.profile.t_fwd
    for c in chunks:
        # the same iteration logged twice: its chunks as a prefill row, its decodes as a
        # decode row, with one start and one duration
        d = decode.get((c["t_start"], c["duration_s"]))
        assert d is not None, f"prefill iteration at {c['t_start']} ran without the decodes"
        assert d["batch_size"] >= 1 and c["num_reqs"] + d["batch_size"] <= SEATS
        assert c["t_uc"] + d["batch_size"] * t_fwd <= BUDGET
    # A decode's inter-token gap while the long prompt prefills is one mixed iteration, far
    # below the time the whole prompt takes.
    t0, t1 = chunks[0]["t_start"], chunks[-1]["t_start"] + chunks[-1]["duration_s"]
    gap = _max_decode_gap(sink, t0, t1)
    assert gap == pytest.approx(max(c["duration_s"] for c in chunks), rel=1e-9)
    assert gap < 0.5 * (t1 - t0)
    assert sim.engine.mixed.iterations >= len(chunks)


def test_without_limits_a_collocated_node_alternates(trace):
    """The default (no limits) is unchanged: prefill iterations apart from decode epochs,
    so a decode waits for the whole prompt (one 6,000-token iteration)."""
    sim, s, sink = _run(trace, "h200")
    assert s["programs_finished"] == N and sim.engine.mixed.iterations == 0
    (chunk,), _ = _long_prefill(sim, sink)
    decode = {(r["t_start"], r["duration_s"]) for r in sink.rows("decode_iterations")}
    assert (chunk["t_start"], chunk["duration_s"]) not in decode
    t0 = chunk["t_start"]
    gap = _max_decode_gap(sink, t0 - 1.0, t0 + chunk["duration_s"] + 1.0)
    assert gap >= chunk["duration_s"]


@pytest.mark.parametrize("profile", ["h200", "llama"])
def test_every_iteration_stays_within_seats_and_budget(trace, llama_profile, profile):
    prof = str(llama_profile) if profile == "llama" else profile
    sim, s, sink = _limited(trace, prof)
    decode = {
        (r["t_start"], r["duration_s"]): r["batch_size"] for r in sink.rows("decode_iterations")
    }
    assert max(decode.values()) <= SEATS
    assert max(decode.values()) == SEATS  # the cap was reached: others waited for a seat
    t_fwd = sim.profile.t_fwd
    mixed = 0
    for r in sink.rows("prefill_iterations"):
        b = decode.get((r["t_start"], r["duration_s"]), 0)
        mixed += b > 0
        assert r["num_reqs"] + b <= SEATS
        assert r["t_uc"] + b * t_fwd <= BUDGET
    assert mixed == sim.engine.mixed.iterations == s["engine_limits"]["mixed_iterations"] > 0
    assert s["engine_limits"]["priced_by"] == (
        "measured grid" if profile == "llama" else "profile forms"
    )
    assert s["decode_refused"] > 0 or sim.engine.prefill.seat_waits > 0


def test_a_small_kv_preempts_in_mixed_iterations_and_every_request_finishes(trace):
    sim, s, _ = _run(
        trace, "h200", max_num_seqs=SEATS, max_num_batched_tokens=BUDGET, l1_tokens=3000
    )
    assert s["programs_finished"] == N
    assert s["preemptions_total"] > 0 and sim.engine.mixed.iterations > 0
    for r in sim.requests:
        assert r.decode_left <= 0 and r.generated >= r.t_out - 1 - 1e-9  # every decoded token
    assert sim.nodes[0].memory.decode_kv == 0  # type: ignore[attr-defined]


def test_a_mixed_iteration_is_priced_as_the_engine_model_prices_it(trace, llama_profile):
    sim = Simulator(
        SimConfig(
            workload=str(trace),
            profile=str(llama_profile),
            **(BASE | {"max_num_seqs": SEATS, "max_num_batched_tokens": BUDGET}),
        )
    )
    pricer = sim.profile.pricer
    assert pricer is not None and sim.engine.prefill.pricer is pricer
    # the engine model's batch: a 512-token chunk over 1,024 computed tokens, three decodes
    chunk = EngineRequest("p", 0.0, 2000, 10, computed_tokens=1024)
    decodes = [EngineRequest(f"d{i}", 0.0, 700 + i, 50, generated_tokens=5) for i in range(3)]
    for d in decodes:
        d.computed_tokens = d.num_tokens - 1
    batch = ScheduledBatch([(chunk, 512), *((d, 1) for d in decodes)], [])
    engine_model = batch_pricer(pricer)(batch, float(batch.num_tokens))
    # the simulator's chunk (request, t_uc, A, t_rst, t_c) and its decodes' contexts (KV
    # held before the iteration's token)
    chunks = [(None, 512, 0.0, 0, 1024)]
    ctx = [d.computed_tokens for d in decodes]
    mixed = sim.engine.mixed.price(chunks, ctx)  # type: ignore[arg-type]
    assert mixed == pytest.approx(engine_model, rel=1e-12)
    assert engine_model == iteration_time(pricer, batch.prefill_chunks, batch.decode_kv)
    # the mixed iteration costs more than its chunk alone, less than chunk and decodes apart
    alone = iteration_time(pricer, [(512, 1024)], ())
    apart = alone + iteration_time(pricer, (), batch.decode_kv)
    assert alone < engine_model < apart


def test_a_prompt_holds_its_kv_from_its_first_chunk(trace):
    """vLLM V1 admits a request only when its prompt's KV fits next to what its running
    requests hold (scheduler_reserve_full_isl): on a collocated node with limits and a small
    KV, what the node's requests hold (prompt plus generated tokens) never exceeds the
    capacity while more than one holds KV, and the node's count is theirs. (Admitting
    every prompt and holding joiners back overshot the capacity by ~6,000 tokens here.)"""
    sim = Simulator(
        SimConfig(
            workload=str(trace),
            profile="h200",
            **(
                BASE
                | {
                    "telemetry": "compact",
                    "max_num_seqs": SEATS,
                    "max_num_batched_tokens": BUDGET,
                    "l1_tokens": 3000,
                }
            ),
        )
    )
    node = sim.nodes[0]
    mem = node.memory
    assert isinstance(mem, TieredMemory) and mem.reserve_prompts
    cap, checked, t = mem.l1.capacity_tokens, 0, 0.0
    while len([r for r in sim.requests if r.t_done is not None]) < N:
        t += 0.02
        assert t < 300.0, "the run did not finish"
        sim.step_until(t)
        holders = node.prefilling + node.decode_batch + node.join_queue
        assert mem.decode_kv - mem.epoch_reserved == sum(r.kv_private for r in holders)
        if len(holders) > 1:
            checked += 1
            assert sum(r.t_in + math.ceil(r.generated) for r in holders) <= cap
    assert checked > 100 and sim.preemptions > 0
