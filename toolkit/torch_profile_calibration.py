"""An operator profile of the torch engine calibrated in situ on a recorded group run.

Operators timed alone (cluster.engines.torch.op_profile) run in tight loops with warm
caches; in a serving DP×EP group on a shared CPU the same work runs between all-to-alls,
beside the other ranks, the front end and the client, and takes longer. This module
measures by how much on one recorded run (`toolkit.importers.torch_group`), so other runs
can be priced with it:

- per pass and rank, the compute the profile prices (everything but the EP collectives) is
  set against the compute measured (`dp_passes.duration_s` minus the pass's
  `moe_layer_loads.comm_s`). Fixed costs (launches, Python, per-layer overheads) and
  per-unit costs (per token, per context token) do not slow down alike, so the priced
  compute is split into the part every table charges at its smallest key (`fixed`: an
  operator's time at one token or one sequence, attention's floor) and the rest (`unit`),
  and measured = a·fixed + b·unit is fitted over the run's real passes (least squares,
  a, b >= 0); every table T becomes a·T0 + b·(T − T0), T0 its value at the smallest key;
- the link is refitted on the run's collectives: per lockstep step, the time one MoE layer
  spent in its collectives on the rank that waited least, averaged by the step's group
  tokens, fitted as the pricer charges it (loop_profile.fit_link).

`calibrate(bundle, db, run, out)` writes the calibrated bundle (and `calibration.json`:
a and b, the per-phase ratios before and after, the run it came from); import it with
`pdlab profile import` as the measured one. Calibrate on a run kept for that purpose and
compare the twin on others: a factor measured on a run and used on the same run is tuning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from scipy.optimize import nnls

from cluster.engines.torch.config import ModelConfig
from cluster.engines.torch.loop_profile import fit_link
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism

_PASSES = """
SELECT p.node_id, p.wave, p.step, p.kind, p.duration_s, d.batch_size, d.ctx_tokens,
       f.t_uc, f.t_c, f.num_reqs, c.comm, c.tokens_in, c.layers
FROM dp_passes p
JOIN (SELECT node_id, pass_id, sum(comm_s) AS comm, max(tokens_in) AS tokens_in,
             count(*) AS layers
      FROM moe_layer_loads WHERE run_id = $run GROUP BY 1, 2) c
  ON c.node_id = p.node_id AND c.pass_id = p.pass_id
LEFT JOIN decode_iterations d ON d.run_id = p.run_id AND d.node_id = p.node_id
  AND p.kind = 'decode' AND d.iter_id = p.iter_id
LEFT JOIN prefill_iterations f ON f.run_id = p.run_id AND f.node_id = p.node_id
  AND p.kind = 'prefill' AND f.iter_id = p.iter_id
WHERE p.run_id = $run
"""


def pass_rows(db: str | Path, run: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every pass of `run` with its rank's compute and collectives, and the run's config."""
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute(_PASSES, {"run": run})
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        cfg = con.execute("SELECT config FROM runs WHERE run_id = ?", [run]).fetchone()
    if not rows or cfg is None:
        raise ValueError(f"run {run!r} has no DP passes in {db} (record it with --log-dir)")
    return rows, json.loads(cfg[0])


def _work(r: dict[str, Any]) -> tuple[list[tuple[int, int]], list[int]]:
    """(prefill chunks, decode contexts) of one logged pass, as the pricer takes them."""
    if r["kind"] == "decode":
        b = int(r["batch_size"])
        return [], [int(r["ctx_tokens"]) // b] * b
    if r["kind"] == "prefill":
        n = int(r["num_reqs"])
        return [(int(r["t_uc"]) // n, int(r["t_c"]) // n)] * n, []
    return [], [1]  # a dummy pass: one token


def _compute(pricer: IterationPricer, r: dict[str, Any]) -> float:
    cost = pricer.cost(*_work(r))
    return cost.total - cost.communication


def compute_ratios(rows: list[dict[str, Any]], pricer: IterationPricer) -> dict[str, float]:
    """Σ measured / Σ priced compute per pass kind and over all real passes."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        priced = _compute(pricer, r)
        measured = max(float(r["duration_s"]) - float(r["comm"]), 0.0)
        for key in (r["kind"], "real" if r["kind"] != "dummy" else "dummy"):
            s = sums.setdefault(key, [0.0, 0.0])
            s[0] += measured
            s[1] += priced
    return {k: m / p for k, (m, p) in sums.items() if p > 0}


def calibrate(bundle: str | Path, db: str | Path, run: str, out: str | Path) -> dict[str, Any]:
    """Write `bundle` calibrated on `run` of `db` to `out` (module docstring)."""
    src, dst = Path(bundle), Path(out)
    rows, config = pass_rows(db, run)
    model = ModelConfig(**config["torch_engine"]["model"])
    shape = ModelShape.from_hf_config(model.hf_config(), source=model.name)
    par = Parallelism(dp=int(config["dp_group"]["dp"]), ep=int(config["dp_group"]["ep"]))
    full = IterationPricer(OperatorTables.load(src), shape, par)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    _rewrite(src, dst, 1.0, 0.0)  # every table at its smallest key: the fixed part
    fixed = IterationPricer(OperatorTables.load(dst), shape, par)
    real = [r for r in rows if r["kind"] != "dummy"]
    x = np.array([[_compute(fixed, r), _compute(full, r) - _compute(fixed, r)] for r in real])
    y = np.array([max(float(r["duration_s"]) - float(r["comm"]), 0.0) for r in real])
    (a, b), _ = nnls(x, y)
    _rewrite(src, dst, float(a), float(b))
    before = compute_ratios(rows, full)
    after = compute_ratios(rows, IterationPricer(OperatorTables.load(dst), shape, par))
    link = fit_link(_link_points(rows, par.ep), model, par.ep, "cpu", robust=False)
    link["source"] = f"calibrated: collectives of run {run} (rank that waited least per step)"
    (dst / "link.json").write_text(json.dumps(link, indent=1) + "\n")
    calibrated = IterationPricer(OperatorTables.load(dst), shape,
                                 Parallelism(dp=par.dp, ep=par.ep, link_gbps=link["link_gbps"],
                                             link_latency_s=link["link_latency_s"]))  # fmt: skip
    doc = {"run": run, "db": str(db), "fixed_factor": float(a), "unit_factor": float(b),
           "ratio_before": before, "ratio_after": after, "passes": len(rows),
           "link_gbps": link["link_gbps"], "link_latency_s": link["link_latency_s"],
           **lockstep_ratios(rows, calibrated)}  # fmt: skip
    (dst / "calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def lockstep_ratios(rows: list[dict[str, Any]], pricer: IterationPricer) -> dict[str, float]:
    """What the ranks' lockstep adds to priced passes, over the steps every rank ran:
    `step_compute_ratio` = Σ max over ranks of measured compute / Σ max of priced compute
    (noisy ranks: the mean of a maximum exceeds the maximum of the means), and
    `step_ratio` = Σ measured step (the slowest rank's pass) / Σ (max priced compute +
    priced collectives)."""
    steps: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        steps.setdefault((r["wave"], r["step"]), []).append(r)
    n = max(len(rs) for rs in steps.values())
    sums = np.zeros(4)
    for rs in steps.values():
        if len(rs) < n:
            continue
        g = float(sum(int(r["tokens_in"]) for r in rs))
        priced = [pricer.cost(*_work(r), group_tokens=g) for r in rs]
        sums += (
            max(max(float(r["duration_s"]) - float(r["comm"]), 0.0) for r in rs),
            max(c.total - c.communication for c in priced),
            max(float(r["duration_s"]) for r in rs),
            max(c.total for c in priced),
        )
    return {"step_compute_ratio": float(sums[0] / sums[1]), "step_ratio": float(sums[2] / sums[3])}


def _link_points(rows: list[dict[str, Any]], ep: int) -> list[dict[str, Any]]:
    """Per lockstep step: group tokens and the least-waiting rank's collectives per layer."""
    steps: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        steps.setdefault((r["wave"], r["step"]), []).append(r)
    by_tokens: dict[int, list[float]] = {}
    for rs in steps.values():
        if len(rs) == ep:
            g = sum(int(r["tokens_in"]) for r in rs)
            per_layer = min(float(r["comm"]) / int(r["layers"]) for r in rs)
            by_tokens.setdefault(g, []).append(per_layer)
    # The mean, not the median: collectives on a busy CPU are heavy-tailed, and the mean
    # pass time is what mean TPOT adds up.
    return [{"group_tokens": g, "tokens_per_rank": g / ep, "seconds": sum(xs) / len(xs),
             "samples": len(xs)} for g, xs in sorted(by_tokens.items())]  # fmt: skip


_KEYS = {"dense.csv": 1, "per_sequence.csv": 1, "moe.csv": -1, "attention.csv": None}


def _rewrite(src: Path, dst: Path, a: float, b: float) -> None:
    """Each table T of `src` as a·T0 + b·(T − T0) in `dst` (T0: its value at the smallest
    key — per operator, per activated-experts row of moe.csv, attention's minimum)."""
    for name, group_col in _KEYS.items():
        if not (src / name).is_file():
            continue
        lines = (src / name).read_text().splitlines()
        rows = [line.split(",") for line in lines[1:]]
        t0: dict[str, tuple[float, float]] = {}  # group -> (smallest key, its time)
        for r in rows:
            g = "" if group_col is None else (r[0] if group_col == 1 else r[1])
            key = float(r[1]) if group_col == 1 else (float(r[0]) if group_col == -1 else 0.0)
            t = float(r[-1])
            best = t0.get(g)
            if best is None or key < best[0] or (group_col is None and t < best[1]):
                t0[g] = (key, t)
        out = [lines[0]]
        for r in rows:
            g = "" if group_col is None else (r[0] if group_col == 1 else r[1])
            base, t = t0[g][1], float(r[-1])
            out.append(",".join([*r[:-1], f"{a * base + b * (t - base):.3f}"]))
        (dst / name).write_text("\n".join(out) + "\n")
