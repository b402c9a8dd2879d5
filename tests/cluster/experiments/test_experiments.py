"""`pdlab experiment`: configurations are valid simulator inputs and verdicts read the rows right.

The experiments themselves take minutes to an hour of CPU each; their figures are in the
closing notes. Here: every configuration builds a simulator, and each verdict picks the
rows and draws the conclusion it names (checked on rows that make it true and false).
"""

import pytest

from cluster.core import ConfigError
from cluster.experiments.evolving_infra import EXPERIMENTS, configs, verdict
from cluster.sim.simulator import Simulator


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_configuration_builds_a_simulator(name):
    cfgs = configs(name, quick=True)
    assert cfgs
    for cfg in cfgs:
        Simulator(cfg)  # validates split, profile, workload, policies
        assert cfg.warmup_s < cfg.duration_s


def test_planner_runs_are_scored_after_the_paper_warmup():
    for quick, warmup in ((True, 1200.0), (False, 1800.0)):
        cfgs = configs("planner", quick)
        assert {c.warmup_s for c in cfgs} == {warmup}
        # Learning, the first window and the first decision all end inside the warmup.
        assert all(c.learn_s + c.window_s + c.cooldown_s < c.warmup_s for c in cfgs)
        assert {c.split for c in cfgs if c.planner == "gain"} == {"6P3D", "3P6D"}


def _row(**kw):
    base = dict(
        workload="cc", initial_split="4P5D", final_split="4P5D", planner="static",
        router="ttft", eviction="branch", kv_fetch="async", throughput_rps=10.0,
        p95_ttft_s=2.0, mean_e2e_s=9.0, lost_kv_reuse=0.01, switches=0,
    )  # fmt: skip
    base.update(kw)
    return base


def test_eviction_verdict():
    rows = [_row(eviction="branch", lost_kv_reuse=0.05), _row(eviction="lru", lost_kv_reuse=0.2)]
    assert verdict("eviction", rows)["branch_loses_less"] is True
    rows[0]["lost_kv_reuse"] = 0.3
    assert verdict("eviction", rows)["branch_loses_less"] is False


def test_routing_verdict_needs_lower_p95_than_both_cache_aware_variants():
    rows = [
        _row(router="ttft", p95_ttft_s=1.2),
        _row(router="cache-aware", kv_fetch="none", p95_ttft_s=5.3),
        _row(router="cache-aware", kv_fetch="async", p95_ttft_s=3.7),
    ]
    assert verdict("routing", rows)["ttft_router_lower_p95"] is True
    rows[2]["p95_ttft_s"] = 1.0
    assert verdict("routing", rows)["ttft_router_lower_p95"] is False


def test_planner_verdict_within_one_node_of_the_best_static_split():
    statics = [
        _row(initial_split=s, final_split=s, mean_e2e_s=e)
        for s, e in (("2P7D", 12.0), ("3P6D", 8.5), ("4P5D", 9.0), ("5P4D", 9.9))
    ]
    gains = [
        _row(planner="gain", initial_split="6P3D", final_split="4P5D", mean_e2e_s=8.8, switches=2),
        _row(planner="gain", initial_split="3P6D", final_split="3P6D", mean_e2e_s=8.4),
    ]
    v = verdict("planner", statics + gains)
    assert v["best_static_split"] == "3P6D"
    assert v["within_one_node_of_best"] is True
    assert v["e2e_spread_between_starts"] == pytest.approx(0.4 / 8.4)
    gains[0]["final_split"] = "5P4D"  # two nodes away from 3P6D
    assert verdict("planner", statics + gains)["within_one_node_of_best"] is False


def test_shift_and_splits_verdicts():
    rows = [
        _row(workload="shift", planner="gain", initial_split="3P6D", throughput_rps=11.9),
        _row(workload="shift", initial_split="4P5D", throughput_rps=11.3),
        _row(workload="shift", initial_split="5P4D", throughput_rps=11.2),
    ]
    v = verdict("shift", rows)
    assert (v["best_static"], v["gain_at_least_best_static"]) == ("4P5D", True)
    rows[0]["throughput_rps"] = 11.0
    assert verdict("shift", rows)["gain_at_least_best_static"] is False
    splits = [
        _row(workload=wl, initial_split=s, mean_e2e_s=e)
        for wl, best in (("putnam", "2P7D"), ("cc", "4P5D"), ("osworld", "7P2D"))
        for s, e in ((best, 5.0), ("5P4D", 6.0))
    ]
    v = verdict("splits", splits)
    assert v["best_static_split"] == {"putnam": "2P7D", "cc": "4P5D", "osworld": "7P2D"}
    assert v["all_differ"] is True


def test_unknown_experiment_names_the_choices():
    with pytest.raises(ConfigError, match="choose one of: eviction, routing, splits"):
        configs("nope")
