"""The torch engine's operator profile (issue 22, DP+EP): what `pdlab profile import` reads.

A small grid measured on this machine loads as an LLMServingSim bundle and prices
iterations; the synthetic routing of the MoE table has the slots per token expert
parallelism gives; the link fit recovers the latency and bandwidth it was made from; the
rank's scheduler loop costs something per pass; the ranks' bundles average key by key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.engines.torch.config import preset
from cluster.engines.torch.loop_profile import _mean_csv, fit_link, scheduler_overhead_us
from cluster.engines.torch.op_profile import Grid, local_slots, measure_profile, synthetic_routing
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism

SMALL = Grid(tokens=(1, 8, 64), sequences=(1, 4), prefill_chunks=(16, 64), kv_prefill=(0, 64),
             n_decode=(1, 16), kv_decode=(16, 64), experts=(1, 4))  # fmt: skip


def test_a_measured_bundle_prices_iterations(tmp_path: Path) -> None:
    model = preset("tiny-moe")
    out = measure_profile(model, tmp_path / "b", ep=2, reps=3, grid=SMALL,
                          scheduler_us={1: 90.0, 4: 150.0})  # fmt: skip
    tables = OperatorTables.load(out)
    assert {"layernorm", "qkv_proj", "router", "embedding", "lm_head", "scheduler"} <= set(
        tables.ops
    )
    assert tables.moe is not None and set(tables.moe[:, 1]) == {1.0, 4.0}
    shape = ModelShape.load(out / "config.json")
    assert (shape.num_experts, shape.top_k, shape.num_layers) == (16, 2, 4)
    pricer = IterationPricer(tables, shape, Parallelism(dp=2, ep=2))
    one, many = pricer.decode_time(1, 32), pricer.decode_time(16, 32)
    assert 0 < one < many
    assert pricer.prefill_time(64) > pricer.prefill_time(16) > 0


def test_synthetic_routing_has_the_slots_of_expert_parallelism() -> None:
    assert local_slots(2, 2) == pytest.approx(4 / 3) and local_slots(4, 1) == 4
    ids = synthetic_routing(2000, 8, 2, 2, seed=1)
    slots = (ids >= 0).sum(1).float()
    assert slots.min() >= 1 and slots.mean() == pytest.approx(4 / 3, abs=0.05)
    assert sorted(set(ids[ids >= 0].tolist())) == list(range(8))
    for row in ids.tolist():  # a token's experts are distinct
        used = [e for e in row if e >= 0]
        assert len(used) == len(set(used))


def test_link_fit_recovers_latency_and_bandwidth() -> None:
    model = preset("tiny-moe")
    lat, gbps, ep = 300e-6, 2.0, 2
    per_token = model.d_model * 4
    points = [{"tokens_per_rank": n, "group_tokens": n * ep,
               "seconds": 2 * (lat + (ep - 1) / ep * n * ep * per_token / (gbps * 1e9))}
              for n in (1, 4, 16, 64, 256)]  # fmt: skip
    link = fit_link(points, model, ep, "cpu")
    assert link["link_latency_s"] == pytest.approx(lat, rel=1e-6)
    assert link["link_gbps"] == pytest.approx(gbps, rel=1e-6)
    assert "measured: gloo" in link["source"]


def test_scheduler_loop_overhead_is_measured() -> None:
    got = scheduler_overhead_us(preset("tiny-moe"), (1, 2), new_tokens=6)
    assert set(got) == {1, 2} and all(0 < us < 1e6 for us in got.values())


def test_ranks_bundles_average_key_by_key(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("layer,tokens,time_us\nqkv_proj,1,10.0\nqkv_proj,2,20.0\n")
    b.write_text("layer,tokens,time_us\nqkv_proj,1,30.0\nqkv_proj,2,40.0\n")
    _mean_csv([a, b], tmp_path / "m.csv")
    assert (tmp_path / "m.csv").read_text().splitlines() == [
        "layer,tokens,time_us", "qkv_proj,1,20.000", "qkv_proj,2,30.000"]  # fmt: skip


def test_a_log_directory_without_settings_is_refused(tmp_path: Path) -> None:
    from toolkit.importers.fields import ImportFileError
    from toolkit.importers.torch_group import read_group_run

    with pytest.raises(ImportFileError, match=r"group.json: line 1: missing"):
        read_group_run(tmp_path, "r")


def test_moe_rows_are_keyed_by_expert_token_pairs() -> None:
    """An EP rank's MoE table, measured by the tokens it receives after dispatch, is keyed
    as the pricer reads moe.csv (pairs / top_k), so a layer of G group tokens over EP 2,
    priced at G/2 such tokens, costs what the measured row of G·(1 − (1 − 1/2)^k) received
    tokens does."""
    import numpy as np

    from cluster.engines.torch.op_profile import pair_keyed_moe
    from cluster.hardware.pricer import MoeGrid

    k, ep = 2, 2
    received = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    rows = [(r, e, 50.0 + 3.0 * r * e**0.5 + (r > 32) * 40.0 * (r - 32)) for r in received
            for e in (1, 4, 8)]  # fmt: skip
    measured = MoeGrid(np.array(rows, dtype=float))
    keyed = MoeGrid(np.array(pair_keyed_moe(rows, k, ep), dtype=float))
    for group in (3.0, 10.0, 40.0, 77.0, 300.0):
        for experts in (1.0, 2.5, 8.0):
            got = keyed(group / ep, experts)
            want = measured(group * (1 - (1 - 1 / ep) ** k), experts)
            assert got == pytest.approx(want, rel=1e-6), (group, experts)
    assert pair_keyed_moe(rows, k, 1) == [(float(r), e, us) for r, e, us in rows]
