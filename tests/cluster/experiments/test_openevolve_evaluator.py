"""The OpenEvolve evaluator (paper 003 §5.3): scores against the seed policy, errors score 0,
and the bundled evaluator file exposes `evaluate` as OpenEvolve loads it (by path)."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.experiments.openevolve_evaluator import evaluate
from cluster.experiments.policy_sweeps import PRESETS, preset

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


def test_openevolve_evaluator_file_exposes_evaluate(tmp_path, monkeypatch):
    """OpenEvolve loads an evaluator *file*; the bundled one scores the paper's seed."""
    import importlib.util

    import cluster.experiments
    from cluster.policies.seeds import SEEDS_DIR

    evaluator = Path(cluster.experiments.__file__).parent / "openevolve_evaluator.py"
    spec = importlib.util.spec_from_file_location("oe_eval", evaluator)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("PDLAB_EVAL_CELL", json.dumps(SMALL))
    got = mod.evaluate(str(SEEDS_DIR / "plas_seed.py"))
    assert got["axis"] == "scheduling" and got["combined_score"] == pytest.approx(1.0)


def test_presets_are_named_sweeps_and_a_miss_lists_them():
    assert set(PRESETS) == {"table1", "policies", "smoke"}
    smoke = preset("smoke")
    assert smoke.name == "smoke" and len(smoke.grid["retention"]) == 4
    assert len(preset("table1", quick=True).seeds) < len(preset("table1").seeds)
    with pytest.raises(ConfigError, match="unknown sweep preset 'nope'; choose one of: table1"):
        preset("nope")
