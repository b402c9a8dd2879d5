"""Policy sweeps (paper 003 §5.2): expansion, checks before any run, local vs Ray determinism,
DuckDB results and the CLI. (The OpenEvolve evaluator is tested with the experiments.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.experiments.policy_sweeps import smoke_spec
from cluster.sweep import (
    SweepSpec,
    aggregate,
    check_points,
    default_warmup_s,
    expand,
    read_results,
    run_sweep,
    write_results,
)
from toolkit.cli import app

SMALL = {
    "workload": "putnam",
    "nodes": 1,
    "split": "collocated",
    "agents": 8,
    "duration_s": 300.0,
    "warmup_s": 0.0,
    "planner": "static",
    "host_kv": False,
    "l1_tokens": 60_000,
    "profile": "h200",
    "telemetry": "compact",
}


def test_expand_grid_random_and_seeds_deterministically():
    spec = SweepSpec(
        base=SMALL,
        grid={"retention": ["lru", "ttl"], "scheduling": ["fcfs", "plas"]},
        random={"retention_params.tau_s": ("loguniform", 0.5, 20.0), "agents": ("int", 2, 9)},
        samples=3,
        seeds=(0, 7),
        seed=11,
    )
    points = expand(spec)
    assert len(points) == 2 * 2 * 3 * 2
    assert points == expand(spec)  # same draws every time
    assert [p.seed for p in points[:2]] == [0, 7] and points[0].params == points[1].params
    for p in points:
        assert 0.5 <= p.config["retention_params"]["tau_s"] <= 20.0
        assert 2 <= p.config["agents"] <= 9 and p.config["retention"] in ("lru", "ttl")
    assert len({json.dumps(p.params, sort_keys=True) for p in points}) == 12


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (SweepSpec(base={"nodez": 1}), "unknown sweep axis 'nodez'"),
        (SweepSpec(base={}, grid={"seed": [1, 2]}), "replicate over seeds"),
        (SweepSpec(base={}, grid={"retention": []}), "non-empty list"),
        (SweepSpec(base={}, random={"agents": ("normal", 1, 2)}, samples=2), "not a distribution"),
        (SweepSpec(base={}, random={"agents": ("int", 1, 2)}), "samples >= 1"),
        (SweepSpec(base={}, grid={"nodes.x": [1]}), "unknown sweep axis"),
    ],
)
def test_bad_specs_name_what_is_allowed(spec, match):
    with pytest.raises(ConfigError, match=match):
        expand(spec)


def _stable(rows):
    return [{k: v for k, v in r.items() if k not in ("wall_seconds", "backend")} for r in rows]


def test_configurations_agree_on_local_processes_and_ray(tmp_path):
    ray = pytest.importorskip("ray", reason="the 'ray' extra (ray[default]) is not installed")
    # The smoke preset's two workloads and its extreme retention policies, two schedulers: 8 of
    # its 24 runs (all 24 took three minutes of a 2-core CI machine, twice over).
    smoke = smoke_spec()
    grid = smoke.grid | {"retention": ["lru", "evict-always"], "scheduling": ["fcfs", "plas"]}
    spec = dataclasses.replace(smoke, grid=grid)
    assert len(expand(spec)) == 8
    local = run_sweep(spec, backend="local", processes=2)
    try:
        remote = run_sweep(spec, backend="ray", processes=2)
    finally:
        ray.shutdown()
    assert _stable(local) == _stable(remote)
    assert {r["backend"] for r in remote} == {"ray"}
    # The sweep measured something that differs between policies.
    hits = {(r["params"]["workload"], r["params"]["retention"]): r["kv_hit_rate"] for r in local}
    assert hits[("putnam", "evict-always")] < hits[("putnam", "lru")]
    db = tmp_path / "s.duckdb"
    sid = write_results(db, local, "smoke-local")
    write_results(db, remote, "smoke-ray")
    got = read_results(db, sid)
    assert got.height == len(local) and set(got["backend"]) == {"local"}
    assert read_results(db).height == 2 * len(local)
    row = got.row(0, named=True)
    assert json.loads(row["params"]) == local[0]["params"]
    assert json.loads(row["summary"])["requests"] == local[0]["requests"]


def test_results_store_nan_as_null_and_aggregate_pairs_seeds(tmp_path):
    spec = SweepSpec(
        base=SMALL | {"duration_s": 120.0},  # too short for programs to finish: JCT is NaN
        grid={"scheduling": ["fcfs", "plas"]},
        seeds=(0, 1),
    )
    rows = run_sweep(spec, backend="local", processes=1)
    assert all(r["mean_jct_s"] is None for r in rows)
    sid = write_results(tmp_path / "n.duckdb", rows)
    got = read_results(tmp_path / "n.duckdb", sid)
    assert got["mean_jct_s"].null_count() == len(rows)
    agg = aggregate(rows)
    assert [a["seeds"] for a in agg] == [2, 2] and agg[0]["delta_jct"] is None


def test_cli_sweep_and_simulate_report_program_metrics(tmp_path):
    runner = CliRunner()
    db = tmp_path / "cli.duckdb"
    args = ["sweep", "--grid", "retention=lru,evict-always", "--seeds", "0", "--processes", "1"]
    for k, v in SMALL.items():
        args += ["--base", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    res = runner.invoke(app, [*args, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["rows"]) == 2 and out["aggregate"][1]["params"] == {"retention": "evict-always"}
    assert read_results(db, out["sweep_id"]).height == 2
    res = runner.invoke(app, [*args, "--grid", "nodez=1"])
    assert res.exit_code == 2 and "unknown sweep axis 'nodez'" in res.output
    sim = [
        "simulate", "--workload", "putnam", "--nodes", "1", "--split", "collocated",
        "--agents", "8", "--duration", "300", "--warmup", "0", "--planner", "static",
        "--no-host-kv", "--l1-tokens", "60000", "--profile", "h200",
        "--retention", "ttl", "--policy-param", "retention.tau_s=5", "--scheduling", "plas",
        "--json",
    ]  # fmt: skip
    res = runner.invoke(app, sim)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["retention"] == "ttl" and summary["scheduling"] == "plas"
    assert summary["mean_jct_s"] > 0 and summary["p99_jct_s"] >= summary["mean_jct_s"]
    res = runner.invoke(app, [*sim[:-1], "--policy-param", "ttl.tau=1", "--json"])
    assert res.exit_code == 2 and "FAMILY.KEY=VALUE" in res.output
    res = runner.invoke(app, [*sim[:-1], "--learn", "60", "--json"])  # warmup is 0
    assert res.exit_code == 2 and "need 0 < --learn <= --warmup" in res.output


def test_a_short_run_without_a_warmup_gets_a_sixth_of_it():
    spec = SweepSpec(base={"duration_s": 60.0}, grid={"duration_s": [60.0, 1200.0, 7200.0]})
    assert [p.config["warmup_s"] for p in expand(spec)] == [10.0, 200.0, 600.0]
    assert default_warmup_s(3600.0) == 600.0  # SimConfig's own default run keeps its warmup
    given = SweepSpec(base={"duration_s": 60.0, "warmup_s": 0.0})
    assert expand(given)[0].config["warmup_s"] == 0.0
    assert "warmup_s" not in expand(SweepSpec(base={"nodes": 2}))[0].config  # SimConfig's 600 s


def test_a_trace_replayed_at_its_times_gets_a_sixth_of_its_span(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [f"{12.0 * i},{800 + i},{10 + i}" for i in range(11)]  # arrivals 0..120 s
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows))
    spec = SweepSpec(
        base={"workload": str(trace)},
        grid={"trace_cycle": [False, True], "duration_s": [60.0, 3600.0]},
    )
    got = {(p.params["trace_cycle"], p.params["duration_s"]): p.config["warmup_s"]
           for p in expand(spec)}  # fmt: skip
    # Replayed once: the run ends soon after the last arrival, 120 s (or at 60 s).
    assert got == {(False, 60.0): 10.0, (False, 3600.0): 20.0, (True, 60.0): 10.0,
                   (True, 3600.0): 600.0}  # fmt: skip
    no_duration = expand(SweepSpec(base={"workload": str(trace)}))[0].config
    assert no_duration["warmup_s"] == 20.0  # SimConfig's 3,600 s run, the trace's 120 s span


def test_check_points_names_the_bad_point_before_anything_runs():
    spec = SweepSpec(base=SMALL, grid={"retention": ["lru", "no-such-policy"]}, seeds=(0, 1))
    points = expand(spec)
    with pytest.raises(ConfigError, match=r"sweep point 1 \(retention='no-such-policy'\): unknown"):
        check_points(points)
    with pytest.raises(ConfigError, match="sweep point 0: --nodes must be >= 2"):
        check_points(expand(SweepSpec(base=SMALL | {"nodes": 0, "split": "1P1D"})))
    with pytest.raises(ConfigError, match="sweep point 0: need 0 <= --warmup < --duration"):
        run_sweep(SweepSpec(base=SMALL | {"warmup_s": 300.0}))


def test_cli_sweep_refuses_to_guess_what_to_sweep():
    res = CliRunner().invoke(app, ["sweep"])
    assert res.exit_code == 2
    assert "nothing to sweep" in res.output
    assert all(opt in res.output for opt in ("--preset", "--grid", "--random", "--base"))
    res = CliRunner().invoke(app, ["sweep", "--seeds", "0", "--processes", "1"])
    assert res.exit_code == 2 and "nothing to sweep" in res.output


def test_cli_sweep_checks_every_point_before_the_progress_bar(tmp_path):
    args = ["sweep", "--processes", "1", "--db", str(tmp_path / "s.duckdb")]
    for k, v in SMALL.items():
        args += ["--base", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    res = CliRunner().invoke(app, [*args, "--grid", "scheduling=fcfs,no-such-policy"])
    assert res.exit_code == 2
    assert "sweep point 1 (scheduling='no-such-policy')" in res.output
    assert "runs" not in res.output  # no progress bar was drawn
    assert not (tmp_path / "s.duckdb").exists()
    res = CliRunner().invoke(app, [*args, "--backend", "dask"])
    assert res.exit_code == 2 and "--backend must be one of local, ray" in res.output
    res = CliRunner().invoke(app, [*args, "--seeds", "0,x"])
    assert res.exit_code == 2 and "--seeds '0,x' must be comma-separated integers" in res.output


def test_cli_sweep_of_a_short_run_needs_no_warmup(tmp_path):
    args = ["sweep", "--processes", "1", "--json"]
    for k, v in (SMALL | {"duration_s": 60.0}).items():
        if k != "warmup_s":
            args += ["--base", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["rows"]
    assert row["config"]["warmup_s"] == 10.0 and row["sim_seconds"] == 60.0
