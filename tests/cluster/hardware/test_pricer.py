"""IterationPricer (cluster.hardware.pricer): exact at the profile's own points, sane between."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hardware_fixtures import LLAMA, P32, P4090, PMOE, QWEN32, QWEN_MOE

from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism

US = 1e-6


def _independent(profile: Path, layers: int):  # type: ignore[no-untyped-def]
    """Composition straight from the CSVs: layers x (dense + attention) + per-iteration ops."""
    dense: dict[int, float] = defaultdict(float)
    it: dict[int, float] = defaultdict(float)
    for r in csv.DictReader((profile / "dense.csv").open()):
        k, t = int(r["tokens"]), float(r["time_us"]) * US
        if r["layer"] in ("embedding", "final_layernorm"):
            it[k] += t
        else:
            dense[k] += t * (2 if r["layer"] == "layernorm" else 1)
    seq: dict[int, float] = defaultdict(float)
    for r in csv.DictReader((profile / "per_sequence.csv").open()):
        seq[int(r["sequences"])] += float(r["time_us"]) * US
    att = [
        tuple(float(x) for x in r.values())
        for r in csv.DictReader((profile / "attention.csv").open())
    ]
    out = []
    for pc, kp, nd, kd, t in att:
        n, s = int(pc + nd), int((pc > 0) + nd)
        if n in dense and s in seq:
            out.append(
                (
                    (int(pc), int(kp), int(nd), int(kd)),
                    layers * (dense[n] + t * US) + it[n] + seq[s],
                )
            )
    return out


def test_prices_every_measured_point_exactly() -> None:
    pricer = IterationPricer(OperatorTables.load(P4090), ModelShape.load(LLAMA))
    points = _independent(P4090, 32)
    assert len(points) > 500  # points whose token and sequence counts are measured exactly
    for (pc, kp, nd, kd), want in points:
        got = pricer.time([(pc, kp)] if pc else [], [kd] * nd)
        assert got == pytest.approx(want, rel=1e-9), (pc, kp, nd, kd)


def test_between_points_the_price_lies_between_its_neighbours() -> None:
    p = IterationPricer(OperatorTables.load(P4090), ModelShape.load(LLAMA))
    lo, hi = p.decode_time(32, 1024), p.decode_time(32, 2048)
    assert lo < p.decode_time(32, 1500) < hi
    assert p.decode_time(24, 1024) == pytest.approx(
        (p.decode_time(16, 1024) + p.decode_time(32, 1024)) / 2, rel=0.05
    )
    # heterogeneous contexts are priced at their mean (decode attention reads sum(ctx) of KV)
    assert p.time([], [512, 1536]) == pytest.approx(p.time([], [1024, 1024]))
    # a decode batch rides along a chunk: more than the chunk alone, less than both apart
    chunk, both = p.prefill_time(512, 0), p.time([(512, 0)], [1024] * 16)
    assert chunk < both < chunk + p.decode_time(16, 1024)
    # a second chunk adds its own attention above the launch floor, and its tokens
    two = p.time([(512, 0), (256, 1000)], [])
    assert two > p.time([(768, 0)], [])
    # beyond the measured grid: keeps growing
    assert p.prefill_time(4096, 0) > 1.9 * p.prefill_time(2048, 0)
    assert p.decode_time(64, 32_768) > p.decode_time(64, 16_384)
    assert p.time([], []) == 0.0
    cost = p.cost([(512, 100)], [700] * 8)
    assert cost.total == pytest.approx(p.time([(512, 100)], [700] * 8)) and cost.moe == 0.0


def test_moe_decode_grows_with_the_experts_the_batch_touches() -> None:
    shape = ModelShape.load(QWEN_MOE)
    p = IterationPricer(OperatorTables.load(PMOE), shape)
    moe = [p.moe_time(b) for b in (1, 2, 8, 64, 256)]
    assert moe == sorted(moe)
    # phi(B) saturates: past ~64 tokens nearly all 128 experts are touched
    assert (moe[4] - moe[3]) / (256 - 64) < (moe[2] - moe[1]) / (8 - 2)
    assert p.cost([], [1000] * 8).moe == pytest.approx(48 * moe[2])
    # EP 4 over a DP group of 4: each rank holds 32 experts; the busiest rank is slower
    ep = IterationPricer(p.tables, shape, Parallelism(tp=1, dp=4, ep=4))
    skew = IterationPricer(p.tables, shape, Parallelism(tp=1, dp=4, ep=4, expert_load_skew=1.5))
    assert skew.moe_time(256) > ep.moe_time(256) > 0
    assert ep.communication_time(256) > 0 and p.communication_time(256) == 0
    with pytest.raises(ValueError, match=r"MoE model but the profile has no moe\.csv"):
        IterationPricer(OperatorTables.load(P4090), shape)


def test_tensor_parallel_adds_all_reduces() -> None:
    shape = ModelShape.load(QWEN32)
    tables = OperatorTables.load(P32, tp=2)
    slow = IterationPricer(tables, shape, Parallelism(tp=2, link_gbps=10))
    fast = IterationPricer(tables, shape, Parallelism(tp=2, link_gbps=100))
    c = slow.cost([(2048, 0)], [])
    # 2 per layer + the embedding's, each moving (t-1)/t * 2 of the 2048 x 5120 bf16 activations
    per = 10e-6 + 2048 * 5120 * 2 / 10e9
    assert c.communication == pytest.approx((2 * 64 + 1) * per)
    assert fast.time([(2048, 0)], []) < slow.time([(2048, 0)], [])
    assert np.isfinite(c.total)


def test_an_ep_rank_prices_its_share_of_the_expert_token_pairs() -> None:
    """moe.csv times one GPU with every expert, each token routed to top-8: under EP 2 a
    rank computes half of the group's expert-token pairs over the experts it holds."""
    shape = ModelShape.load(QWEN_MOE)
    tables = OperatorTables.load(PMOE)
    one = IterationPricer(tables, shape)
    ep2 = IterationPricer(tables, shape, Parallelism(tp=1, dp=2, ep=2))
    group = 256.0
    local_experts = 64 * (1 - (1 - 8 / 128) ** group)
    assert ep2.moe_time(128, group) == pytest.approx(one._moe(group / 2, local_experts))  # type: ignore[union-attr]
    # half the pairs and half the weights to read: faster than one GPU over the group
    assert ep2.moe_time(128, group) < one.moe_time(group)
    skew = IterationPricer(tables, shape, Parallelism(tp=1, dp=2, ep=2, expert_load_skew=1.2))
    assert skew.moe_time(128, group) > ep2.moe_time(128, group)


def test_a_table_timed_per_ep_rank_is_priced_as_it_stands() -> None:
    """A MoE table that already times one EP rank for the group's tokens, exchange included
    (moe_kind "per-ep-rank": AIConfigurator's), is read at the group's tokens: no share of
    the pairs, no skew, no TP split, no exchange on top; moe.csv keeps ep-model's rule."""
    from dataclasses import replace

    shape = ModelShape.load(QWEN_MOE)
    one_gpu = OperatorTables.load(PMOE)
    per_rank = replace(one_gpu, moe_kind="per-ep-rank")
    par = Parallelism(tp=2, dp=2, ep=4, link_gbps=16.0, expert_load_skew=1.3)
    shared, as_is = IterationPricer(one_gpu, shape, par), IterationPricer(per_rank, shape, par)
    grid = as_is._moe
    assert grid is not None
    for group in (4.0, 256.0, 2048.0):
        assert as_is.moe_time(group / 2, group) == pytest.approx(grid(group, 32.0))
        assert shared.moe_time(group / 2, group) != pytest.approx(grid(group, 32.0))
    assert as_is.moe_time(128.0) == pytest.approx(grid(256.0, 32.0))  # dp x tokens by default
    assert as_is.expert_exchange_time(256.0) == 0.0 < shared.expert_exchange_time(256.0)
    c_as_is, c_shared = as_is.cost([], [500] * 64, 128.0), shared.cost([], [500] * 64, 128.0)
    assert c_shared.communication - c_as_is.communication == pytest.approx(
        48 * shared.expert_exchange_time(128.0)
    )


def test_the_expert_exchange_grows_with_tokens_and_ep() -> None:
    """Dispatch (all-gather of hidden states and router logits) and combine (reduce-scatter
    of hidden states) per MoE layer: latency + (e-1)/e of the group's bytes over the link."""
    shape = ModelShape.load(QWEN_MOE)
    tables = OperatorTables.load(PMOE)

    def ex(ep: int, tokens: float, gbps: float = 16.0) -> float:
        par = Parallelism(tp=1, dp=ep, ep=ep, link_gbps=gbps, link_latency_s=20e-6)
        return IterationPricer(tables, shape, par).expert_exchange_time(tokens)

    assert ex(2, 1000) == pytest.approx(
        2 * 20e-6 + 0.5 * 1000 * (2 * 2048 + 128) * 2 / 16e9
    )  # Qwen3-30B-A3B: hidden 2048, 128 experts, bf16
    assert ex(2, 100) < ex(2, 1000) < ex(2, 4000)
    assert ex(2, 1000) < ex(4, 1000) < ex(8, 1000)  # a larger share crosses the link
    assert ex(2, 1000, gbps=64) < ex(2, 1000)
    assert ex(1, 1000) == 0.0  # no EP: nothing crosses
    # the iteration carries one exchange per MoE layer
    p = IterationPricer(tables, shape, Parallelism(tp=1, dp=2, ep=2, link_gbps=16.0))
    c = p.cost([], [500] * 64, 128.0)
    assert c.communication == pytest.approx(48 * p.expert_exchange_time(128.0))
