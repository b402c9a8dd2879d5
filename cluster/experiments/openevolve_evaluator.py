"""OpenEvolve evaluator (paper 003 §5.3): `evaluate(program_path) -> {'combined_score': ...}`.

Point OpenEvolve at this file with a seed policy, e.g.

    python openevolve-run.py cluster/policies/seeds/plas_seed.py \\
        cluster/experiments/openevolve_evaluator.py --config my_config.yaml

or call `cluster.experiments.openevolve_evaluator.evaluate` in code. The candidate file
defines one policy (retention, scheduling or dispatch, detected from its hooks); it runs on
the target cell and the score is seed mean JCT / candidate mean JCT (1.0 = parity). The cell
is `EVAL_CELL` ("search-cell": 30 SWE-agent programs at 0.1 programs/s on the
memory-pressure engine of `policy_sweeps`), or $PDLAB_EVAL_CELL (a cell name or a JSON
object of SimConfig fields); the seed policy of each axis is `EVAL_SEEDS`, or
$PDLAB_EVAL_SEED.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from cluster.core import ConfigError
from cluster.experiments.policy_sweeps import cell
from cluster.policies.loader import HOOKS, load_policy
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sweep.results import finite, jsonable

EVAL_CELL: str | dict[str, Any] = "search-cell"  # paper 003 §5.3: 30 programs at 0.1 JPS
EVAL_SEEDS: dict[str, str] = {"retention": "ttl", "scheduling": "plas", "dispatch": "least-loaded"}
_seed_jct_cache: dict[str, float] = {}


def _eval_cell() -> dict[str, Any]:
    spec: Any = os.environ.get("PDLAB_EVAL_CELL") or EVAL_CELL
    if isinstance(spec, str) and spec.strip().startswith("{"):
        spec = json.loads(spec)
    if isinstance(spec, str):
        return cell(spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"the evaluation cell must be a preset name or a dict, got {spec!r}")
    return dict(spec)


def _axis_of(path: str) -> str:
    for family in ("retention", "scheduling", "dispatch"):
        try:
            load_policy(family, path)
        except ConfigError:
            continue
        return family
    raise ConfigError(
        f"{path}: no policy class found; a candidate implements one of: "
        + "; ".join(f"{f}: {', '.join(h)}" for f, h in HOOKS.items())
    )


def _mean_jct(cell_cfg: dict[str, Any], axis: str, spec: str) -> tuple[float, dict[str, Any]]:
    cfg = SimConfig(**(cell_cfg | {axis: spec}))
    summary = Simulator(cfg).run()
    jct = summary["mean_jct_s"]
    if not (isinstance(jct, float) and math.isfinite(jct) and jct > 0):
        raise ConfigError(f"the cell finished no program (mean JCT {jct}); lengthen duration_s")
    return jct, summary


def evaluate(program_path: str) -> dict[str, Any]:
    """OpenEvolve entry point: {'combined_score': seed JCT / candidate JCT, ...}.

    A candidate that breaks the policy contract (reads future state, returns a bad
    decision, lacks hooks) scores 0 with the error in `error`."""
    try:
        path = str(Path(program_path))
        axis = _axis_of(path)
        cell_cfg = _eval_cell()
        seed_spec = os.environ.get("PDLAB_EVAL_SEED") or EVAL_SEEDS[axis]
        key = json.dumps(jsonable(cell_cfg), sort_keys=True) + f"|{axis}={seed_spec}"
        if key not in _seed_jct_cache:
            _seed_jct_cache[key] = _mean_jct(cell_cfg, axis, seed_spec)[0]
        seed_jct = _seed_jct_cache[key]
        jct, summary = _mean_jct(cell_cfg, axis, path)
    except ConfigError as err:  # PolicyError included
        return {"combined_score": 0.0, "error": str(err)}
    return {
        "combined_score": seed_jct / jct,
        "mean_jct_s": jct,
        "seed_mean_jct_s": seed_jct,
        "p99_jct_s": finite(summary["p99_jct_s"]) or 0.0,
        "preemptions": float(summary["preemptions"]),
        "axis": axis,
    }
