"""`pdlab validate`'s intervals on the A6000 cluster setups: the model's error combined with
each row's own spread (toolkit.validate.cluster, toolkit.validate.cluster_interval), per-tick rows
covered by the share of ticks inside the twin's band, and "not known" where the model has
no measured bound (an MoE block composed from expert operators timed apart)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cluster.data import BUNDLED
from toolkit.samples.lss_a6000 import import_lss_a6000
from toolkit.twin.lss import (
    instance_parameters,
    instance_setups,
    kv_transfer_s,
    load_cluster_inputs,
)
from toolkit.twin.parameters import vary
from toolkit.validate.run import validate_runs

A6000 = BUNDLED / "lss_ispass26_a6000"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("intervals") / "real.duckdb"
    import_lss_a6000(path, A6000, runs=["a6000-fig5-PDD", "a6000-fig5-SM"])
    return path


def test_a_pd_splits_link_is_described_and_carried(db: Path) -> None:
    inputs = load_cluster_inputs(db, "a6000-fig5-PDD")
    params = instance_parameters(inputs)
    for per in params:  # both instances send or receive KV over the config's link
        p = {q.name: q for q in per}
        assert p["link_gbps"].source == "described" and p["link_gbps"].value == 112.0
        assert p["collective_cost"].ranged and p["kv_blocks"].source == "estimated"
    setups = instance_setups(inputs)
    cost = {q.name: q for q in params[0]}["collective_cost"]
    slow = [vary(s, cost, 1.25) for s in setups]
    base_s, slow_s = kv_transfer_s(inputs, setups)(1000), kv_transfer_s(inputs, slow)(1000)
    assert slow_s == pytest.approx(1.25 * base_s) and base_s > 0


def test_rows_combine_the_models_error_and_say_what_they_do_not_know(db: Path) -> None:
    t = validate_runs(db, samples=100, profile_replays=2)
    by = {(r.run, r.metric): r for r in t.rows}
    for metric in ("span_s", "throughput_tok_s"):
        r = by[("a6000-fig5-PDD", metric)]
        assert r.known and r.covered and r.half_width is not None and r.half_width < 0.05
        assert r.sources is not None
        # the tick resolution, the profile's held-out error, every ranged parameter
        assert {
            "ticks",
            "profile",
            "cpu_overhead",
            "cuda_graph_saving_s",
            "collective_cost",
        } <= set(r.sources)
        assert r.ci95[0] <= 0 <= r.ci95[1]
        down, up = r.sources["cpu_overhead"]
        assert (down == 0) != (up == 0)  # CPU time only slows: one side, by the metric
    # per-tick rows: covered means the real series lies in the twin's band on >= 95% of ticks
    tick = by[("a6000-fig5-PDD", "throughput_tick_mape")]
    assert tick.ticks_covered is not None and 0 < tick.ticks_covered < 1
    assert tick.covered == (tick.ticks_covered >= 0.95)
    doc = tick.to_json()
    assert isinstance(doc["covered"], bool) and doc["ticks_covered"] == tick.ticks_covered
    # the MoE setup's block is composed from expert operators timed apart: not known
    for metric in ("span_s", "throughput_tok_s", "throughput_tick_mape"):
        r = by[("a6000-fig5-SM", metric)]
        assert not r.known and not r.covered, metric
    span = by[("a6000-fig5-SM", "span_s")]
    assert span.sources is not None and math.isinf(span.sources["moe_block"][1])
    assert span.to_json()["ci95"][1] is None and span.to_json()["covered"] is False
