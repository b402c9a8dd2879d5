"""Policy sweeps (paper 003 §5.2): expansion, local vs Ray determinism, DuckDB results, the
OpenEvolve evaluator (§5.3) and the CLI."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.policies.experiments import smoke_spec
from cluster.sweep import (
    SweepSpec,
    aggregate,
    evaluate,
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


def test_24_configurations_agree_on_local_processes_and_ray(tmp_path):
    ray = pytest.importorskip("ray", reason="the 'ray' extra (ray[default]) is not installed")
    spec = smoke_spec()
    assert len(expand(spec)) >= 20
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


SEED_TTL = """
from cluster.policies import RetentionPolicy

class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + self.TAU_S)

    def on_turn_arrival(self, pcb, now):
        return "release"
"""

SHORTEST_CONTEXT_FIRST = """
import math
from cluster.policies import SchedulingPolicy

class EvolvedScheduling(SchedulingPolicy):
    def priority(self, pcb, now):
        return int(round(math.sqrt(max(0.0, pcb.attained_service_s)) * 1000.0 + 0.03 * pcb.context_tokens))
"""

PEEKING = """
from cluster.policies import SchedulingPolicy

class Oracle(SchedulingPolicy):
    def priority(self, pcb, now):
        return pcb.remaining_turns
"""


def test_openevolve_evaluator_scores_candidates_against_the_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLAB_EVAL_CELL", json.dumps(SMALL))
    seed = tmp_path / "seed.py"
    seed.write_text(textwrap.dedent(SEED_TTL))
    got = evaluate(str(seed))
    # The seed is the TTL policy the evaluator compares against: parity exactly.
    assert got["axis"] == "retention" and got["combined_score"] == pytest.approx(1.0, abs=1e-12)
    assert got["mean_jct_s"] > 0 and "error" not in got
    cand = tmp_path / "cand.py"
    cand.write_text(textwrap.dedent(SHORTEST_CONTEXT_FIRST))
    got = evaluate(str(cand))
    assert got["axis"] == "scheduling" and math.isfinite(got["combined_score"])
    assert got["combined_score"] == pytest.approx(got["seed_mean_jct_s"] / got["mean_jct_s"])
    bad = tmp_path / "peek.py"
    bad.write_text(textwrap.dedent(PEEKING))
    got = evaluate(str(bad))
    assert got["combined_score"] == 0.0 and "future state is not visible" in got["error"]
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert "no policy class found" in evaluate(str(empty))["error"]


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


def test_openevolve_evaluator_file_exposes_evaluate(tmp_path, monkeypatch):
    """OpenEvolve loads an evaluator *file*; the bundled one scores the paper's seed."""
    import importlib.util

    from cluster.policies.seeds import SEEDS_DIR

    spec = importlib.util.spec_from_file_location("oe_eval", SEEDS_DIR / "openevolve_evaluator.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("PDLAB_EVAL_CELL", json.dumps(SMALL))
    got = mod.evaluate(str(SEEDS_DIR / "plas_seed.py"))
    assert got["axis"] == "scheduling" and got["combined_score"] == pytest.approx(1.0)
