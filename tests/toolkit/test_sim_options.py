"""CLI options to SimConfig in one place: the defaults that depend on other options, the policy
parameters, and a complete check before anything runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.sim.simulator import SimConfig
from toolkit.cli.sim_options import (
    SimOptions,
    check_config,
    clean_json,
    key_values,
    parse_value,
    policy_options,
)


def test_no_options_is_simconfigs_default_run():
    assert SimOptions().to_config() == SimConfig()


def test_agents_default_only_for_a_closed_loop():
    assert SimOptions().to_config().agents == 126
    cfg = SimOptions(arrival_rate=30.0).to_config()
    assert cfg.agents is None and cfg.arrival_rate_per_min == 30.0
    with pytest.raises(ConfigError, match="give exactly one of --agents"):
        SimOptions(agents=10, arrival_rate=30.0).to_config()


@pytest.mark.parametrize(
    ("duration", "warmup", "expected"),
    [(None, None, 600.0), (60.0, None, 10.0), (1800.0, None, 300.0), (7200.0, None, 600.0),
     (60.0, 0.0, 0.0), (3600.0, 900.0, 900.0)],
)  # fmt: skip
def test_warmup_defaults_to_a_sixth_of_the_run_at_most_600_s(duration, warmup, expected):
    cfg = SimOptions(duration=duration, warmup=warmup, nodes=2, split="1P1D").to_config()
    assert cfg.warmup_s == expected


def test_cli_names_map_to_simconfig_fields():
    opts = SimOptions(
        duration=120.0, learn=5.0, relaunch=30.0, window=50.0, cooldown=10.0, slices=4,
        l1_tokens=1000, host_kv=True, kv_fetch="sync", max_programs=3,
    )  # fmt: skip
    got = opts.fields()
    assert {k: got[k] for k in ("duration_s", "learn_s", "relaunch_s", "window_s")} == {
        "duration_s": 120.0, "learn_s": 5.0, "relaunch_s": 30.0, "window_s": 50.0,
    }  # fmt: skip
    assert got["cooldown_s"] == 10.0 and got["slices"] == 4 and got["kv_fetch"] == "sync"
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    assert set(got) <= fields


def test_policy_parameters_and_their_errors():
    cfg = SimOptions(
        nodes=1, split="collocated", host_kv=False, retention="ttl", scheduling="plas",
        policy_param=("retention.tau_s=5",),
    ).to_config()  # fmt: skip
    assert cfg.retention == "ttl" and cfg.scheduling == "plas"
    assert cfg.retention_params == {"tau_s": 5} and cfg.scheduling_params == {}
    with pytest.raises(ConfigError, match="scheduling policy 'plas': bad parameters"):
        SimOptions(scheduling="plas", policy_param=("scheduling.note=x",)).to_config()
    with pytest.raises(ConfigError, match=r"FAMILY\.KEY=VALUE with FAMILY one of retention"):
        policy_options(None, None, None, ["ttl.tau=1"])
    with pytest.raises(ConfigError, match="--policy-param 'retention' must look like KEY=VALUE"):
        policy_options(None, None, None, ["retention"])
    assert policy_options(None, None, None, [])["scheduling"] == "fcfs"


def test_the_check_catches_what_only_the_simulator_knows():
    bad = SimOptions(profile="no-such-gpu")
    cfg = bad.to_config(check=False)  # SimConfig alone accepts any profile name
    with pytest.raises(ConfigError, match="no-such-gpu"):
        check_config(cfg)
    with pytest.raises(ConfigError, match="unknown retention policy 'nope'"):
        SimOptions(retention="nope").to_config()
    with pytest.raises(ConfigError, match="--nodes must be >= 2"):
        SimOptions(nodes=0).to_config()


def test_value_parsing_and_json_cleaning():
    assert parse_value("3") == 3 and parse_value("true") is True and parse_value("ttl") == "ttl"
    assert key_values(["a=b=c", " k =1"], "--base") == [("a", "b=c"), ("k", "1")]
    with pytest.raises(ConfigError, match="--base '=1' must look like KEY=VALUE"):
        key_values(["=1"], "--base")
    nan, inf = float("nan"), float("inf")
    assert clean_json({"a": nan, "b": [1.0, inf, (2.0, -inf)], "c": "x"}) == {
        "a": None, "b": [1.0, None, [2.0, None]], "c": "x",
    }  # fmt: skip


def test_a_timestamped_trace_takes_its_warmup_from_its_span(tmp_path):
    """A 60 s trace in a 3,600 s run: the run ends after ~60 s, so the default warmup is a
    sixth of the trace (10 s), not 600 s that would leave nothing measured."""
    trace = tmp_path / "t.csv"
    rows = [f"{6.0 * i},{800 + i},{10 + i}" for i in range(11)]  # arrivals 0..60 s
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    small = dict(workload=str(trace), nodes=2, split="1P1D")
    assert SimOptions(**small).to_config().warmup_s == 10.0
    assert SimOptions(**small, duration=30.0).to_config().warmup_s == 5.0  # the run is shorter
    assert SimOptions(**small, warmup=20.0).to_config().warmup_s == 20.0  # given: kept
    cycled = SimOptions(**small, cycle=True).to_config()  # cycling runs the whole duration
    assert cycled.trace_cycle is True and cycled.warmup_s == 600.0
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
    untimed = SimOptions(workload=str(fixtures / "sweagent_turns_slice.jsonl")).fields()
    assert untimed["warmup_s"] == 600.0  # no arrival times: the duration decides


def test_hook_budget_reaches_the_config_and_zero_means_no_limit() -> None:
    from cluster.policies.guard import DEFAULT_HOOK_BUDGET_S

    assert SimOptions().to_config().hook_budget_s == DEFAULT_HOOK_BUDGET_S
    assert SimOptions(hook_budget=0.5).to_config().hook_budget_s == 0.5
    assert SimOptions(hook_budget=0).to_config().hook_budget_s is None
    with pytest.raises(ConfigError, match="hook_budget_s must be"):
        SimOptions(hook_budget=-1).to_config()
