"""DP ranks of an MoE model with expert parallelism: the rank rule and the step in lockstep."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.hardware.engine import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism
from cluster.sim.engine_model import DPBalancer, ReplayRequest, lockstep_time
from cluster.sim.engine_model.replay import replay

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


@pytest.fixture(scope="module")
def moe() -> IterationPricer:
    shape = ModelShape.load(FIXTURES / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json")
    tables = OperatorTables.load(FIXTURES / "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b")
    return IterationPricer(tables, shape, Parallelism(tp=1, dp=2, ep=2, link_gbps=16.0))


def test_the_balancer_picks_the_lowest_four_waiting_plus_running() -> None:
    counts = {0: (0, 10), 1: (1, 5)}  # scores 10 and 9
    b = DPBalancer(2)
    assert b.choose(0.0, lambda r, _t: counts[r]) == 1  # 4*1 + 5 < 10
    # between publishes its own choices count as waiting: rank 1 now scores 13
    assert b.choose(0.05, lambda r, _t: counts[r]) == 0
    assert b.view == [[1, 10], [2, 5]]
    # a tie goes to the lowest rank (one front-end client scans from 0)
    assert DPBalancer(3).choose(0.0, lambda r, _t: (0, 0)) == 0
    # the next 100 ms publish replaces the view, increments included
    counts = {0: (0, 40), 1: (0, 2)}
    assert b.choose(0.1, lambda r, _t: counts[r]) == 1 and b.view == [[0, 40], [1, 2]]
    # an unchanged snapshot is not published again: the local increments stay
    assert b.choose(0.25, lambda r, _t: counts[r]) == 1 and b.view == [[0, 40], [2, 2]]


def test_the_balancer_reads_the_counts_of_the_last_publish_tick() -> None:
    seen: list[float] = []
    b = DPBalancer(2)
    b.choose(0.234, lambda r, t: seen.append(t) or (0, 0))  # type: ignore[func-returns-value]
    b.choose(0.299, lambda r, t: seen.append(t) or (0, 0))  # type: ignore[func-returns-value]
    b.choose(0.301, lambda r, t: seen.append(t) or (0, 0))  # type: ignore[func-returns-value]
    assert seen == pytest.approx([0.2, 0.2, 0.3, 0.3])  # once per tick, for each rank


def test_the_busiest_rank_sets_the_step(moe: IterationPricer) -> None:
    light = ((), [800] * 16)
    heavy = ([(1500, 0)], [800] * 40)
    step = lockstep_time(moe, [heavy, light])
    alone = moe.time(*heavy, 1500 + 40 + 16)  # the heavy rank over the same group tokens
    assert step == pytest.approx(alone, rel=0.02)
    # the light rank's work adds no time beyond what it adds to the group's MoE tokens
    assert step <= lockstep_time(moe, [heavy, heavy])
    assert lockstep_time(moe, [heavy, light]) == lockstep_time(moe, [light, heavy])
    # not the sum of the ranks: the ranks run at once
    assert step < moe.time(*light, 1556.0) + alone
    # a rank without work runs the dummy batch: cheaper than any real batch beside it
    dummy = lockstep_time(moe, [light, None])
    assert dummy < lockstep_time(moe, [light, light]) and dummy >= moe.time(*light, 17.0) * 0.98


def test_dp_padding_when_every_rank_fits_a_cuda_graph(moe: IterationPricer) -> None:
    small, large = ((), [500] * 8), ((), [500] * 64)
    eager = lockstep_time(moe, [small, large])
    padded = lockstep_time(moe, [small, large], cuda_graph_tokens=256)
    assert padded > eager  # the MoE layers gather 2 x 64 tokens, not 72
    # a rank over the largest graph runs eager, and then no rank pads
    prefill = ([(512, 0)], [500] * 8)
    assert lockstep_time(moe, [prefill, large], cuda_graph_tokens=256) == lockstep_time(
        moe, [prefill, large]
    )


def test_unrecorded_ranks_spread_and_moe_ranks_step_together(moe: IterationPricer) -> None:
    eng = EngineSettings(
        max_num_seqs=8, max_num_batched_tokens=512, data_parallel_size=2, expert_parallel_size=2
    )
    reqs = [ReplayRequest(f"r{i}", 0.02 * i, 300, 40) for i in range(40)]
    e0, e1 = replay(reqs, eng, 4000, moe)
    assert abs(len(e0.requests) - len(e1.requests)) <= 4  # the balancer, not one rank
    # in step: both ranks end every step at the same moment, dummy ones included
    assert [t for t, *_ in e0.trace] == [t for t, *_ in e1.trace]
    assert e0.num_iterations + e0.dummy_iterations == e1.num_iterations + e1.dummy_iterations
    # a dense model's ranks are independent engines: their steps end at their own times
    dense = IterationPricer(moe.tables, moe.shape.__class__(**{**moe.shape.to_json(), "num_experts": 0, "top_k": 0}))  # fmt: skip
    d0, d1 = replay(reqs, eng, 4000, dense)
    assert d0.dummy_iterations == d1.dummy_iterations == 0
    assert [t for t, *_ in d0.trace] != [t for t, *_ in d1.trace]


def test_a_dummy_pass_is_a_one_token_decode_that_samples_nothing(moe: IterationPricer) -> None:
    """vLLM's execute_dummy_batch: dense operators, one decode's attention and the MoE
    block of one token over the group's tokens, no lm_head or sampler."""
    group = 1.0 + 40
    dummy = moe.dummy_cost(group)
    decode = moe.cost([], [1], group)
    assert dummy.per_sequence == 0 < decode.per_sequence
    assert (dummy.dense, dummy.attention, dummy.moe, dummy.communication) == pytest.approx(
        (decode.dense, decode.attention, decode.moe, decode.communication)
    )
    busy = ((), [800] * 40)
    with_dummy = lockstep_time(moe, [busy, None])
    assert with_dummy == pytest.approx(lockstep_time(moe, [busy, ((), [1])]), rel=0.01)
    assert lockstep_time(moe, [None, None]) < lockstep_time(moe, [((), [1]), ((), [1])])
