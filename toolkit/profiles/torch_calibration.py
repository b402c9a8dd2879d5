"""An operator profile of the torch engine calibrated in situ on a recorded group run.

Operators timed alone (cluster.engines.torch.op_profile) run in tight loops with warm
caches; in a serving DP×EP group on a shared CPU the same work runs between all-to-alls,
beside the other ranks, the front end and the client, and takes longer. This module
measures by how much on one recorded run (`toolkit.importers.torch_group`), so other runs
can be priced with it — as `pdlab fit` fits an iteration model on a run's own rows, but
keeping the profile's operator grid and fitting only its scale:

1. compute: per pass and rank, the compute the profile prices (everything but the EP
   collectives) is set against the compute measured (`dp_passes.duration_s` minus the
   pass's `moe_layer_loads.comm_s`). Fixed costs (launches, Python, per-layer overheads)
   and per-unit costs (per token, per context token) do not slow down alike, so the priced
   compute is split into the part every table charges at its smallest key (`fixed`: an
   operator's time at one token or one sequence, attention's floor) and the rest (`unit`),
   and measured = a·fixed + b·unit is fitted over the run's real passes (least squares,
   a, b >= 0); every table T becomes a·T0 + b·(T − T0), T0 its value at the smallest key;
2. the link, as the lockstep pays for it: per lockstep step (every rank ran a pass), the
   step's period (one step's start to the next's, the slowest rank's loop) less what the
   calibrated tables price for the ranks' compute in step (`pricing.lockstep_time` without
   collectives) is what the MoE layers' dispatch and combine cost, their waits for the
   other ranks included; fitted (least squares, >= 0, each step weighted by the requests
   it holds, as TPOT and E2E average over requests) as the pricer charges it per MoE
   layer, 2·latency + (e−1)/e·bytes/bandwidth with the pricer's bytes of the group's
   tokens (cluster.hardware.pricer.expert_exchange_time).

`calibrate(bundle, db, run, out)` writes the calibrated bundle (and `calibration.json`:
a and b, the link, the per-phase and per-step ratios before and after, the run it was
fitted on); `pdlab profile import` of it says "fitted on run X" in the profile's notes and
link source, which `pdlab twin` prints. Calibrate on a run kept for that purpose and
compare the twin on others: a factor measured on a run and used on the same run is tuning.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from scipy.optimize import nnls

from cluster.engines.torch.config import ModelConfig
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism
from cluster.sim.engine_model.pricing import lockstep_time

_PASSES = """
SELECT p.node_id, p.wave, p.step, p.kind, p.t_start, p.duration_s, d.batch_size,
       d.ctx_tokens, f.t_uc, f.t_c, f.num_reqs, c.comm, c.tokens_in, c.layers
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
NO_LINK_GBPS = 1e12  # collectives priced at ~0 s: the compute of a lockstep step alone


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


def _work(r: dict[str, Any]) -> tuple[list[tuple[int, int]], list[int]] | None:
    """(prefill chunks, decode contexts) of one logged pass as the pricer takes them;
    None for a dummy pass."""
    if r["kind"] == "decode":
        b = int(r["batch_size"])
        return [], [int(r["ctx_tokens"]) // b] * b
    if r["kind"] == "prefill":
        n = int(r["num_reqs"])
        return [(int(r["t_uc"]) // n, int(r["t_c"]) // n)] * n, []
    return None


def _compute(pricer: IterationPricer, r: dict[str, Any]) -> float:
    work = _work(r)
    cost = pricer.dummy_cost() if work is None else pricer.cost(*work)
    return cost.total - cost.communication


def _measured(r: dict[str, Any]) -> float:
    return max(float(r["duration_s"]) - float(r["comm"]), 0.0)


def compute_ratios(rows: list[dict[str, Any]], pricer: IterationPricer) -> dict[str, float]:
    """Σ measured / Σ priced compute per pass kind and over all real passes."""
    sums: dict[str, list[float]] = {}
    for r in rows:
        priced = _compute(pricer, r)
        for key in (r["kind"], "real" if r["kind"] != "dummy" else "dummy"):
            s = sums.setdefault(key, [0.0, 0.0])
            s[0] += _measured(r)
            s[1] += priced
    return {k: m / p for k, (m, p) in sums.items() if p > 0}


def lockstep_steps(rows: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], float]]:
    """(the ranks' passes, the step's period s) of every step all ranks ran: the time from
    its first pass's start to the next step's (the slowest rank's whole loop), or the
    slowest pass when the wave ends there."""
    steps: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        steps.setdefault((int(r["wave"]), int(r["step"])), []).append(r)
    n = max(len(rs) for rs in steps.values())
    out = []
    for (wave, step), rs in sorted(steps.items()):
        if len(rs) < n:
            continue
        rs.sort(key=lambda r: r["node_id"])
        nxt = steps.get((wave, step + 1))
        start = min(float(r["t_start"]) for r in rs)
        longest = max(float(r["duration_s"]) for r in rs)
        period = min(float(r["t_start"]) for r in nxt) - start if nxt else longest
        out.append((rs, period))
    return out


def step_prices(
    steps: list[tuple[list[dict[str, Any]], float]], pricer: IterationPricer
) -> np.ndarray:
    """Per step: its period and `pricing.lockstep_time` of its ranks' batches."""
    return np.array([(p, lockstep_time(pricer, [_work(r) for r in rs])) for rs, p in steps])


def _requests(rs: list[dict[str, Any]]) -> float:
    """Requests a step holds over its ranks (at least 1: a step of dummy passes)."""
    n = sum(int(r["batch_size"] or 0) + int(r["num_reqs"] or 0) for r in rs)
    return float(max(n, 1))


def lockstep_ratios(rows: list[dict[str, Any]], pricer: IterationPricer) -> dict[str, float]:
    """Σ measured step periods / Σ priced steps, over all steps (`step`), weighted by the
    requests each holds (`step_per_request`: what TPOT sees), and per kind of step."""
    steps = lockstep_steps(rows)
    prices = step_prices(steps, pricer)
    out: dict[str, list[float]] = {}
    for (rs, _p), (real, priced) in zip(steps, prices, strict=True):
        kind = "step:" + ",".join(sorted(r["kind"] for r in rs))
        w = _requests(rs)
        for key, weight in (("step", 1.0), ("step_per_request", w), (kind, 1.0)):
            s = out.setdefault(key, [0.0, 0.0])
            s[0] += weight * real
            s[1] += weight * priced
    return {k: m / p for k, (m, p) in out.items() if p > 0}


def fit_step_link(
    rows: list[dict[str, Any]], pricer: IterationPricer
) -> tuple[float, float, float]:
    """(latency s, bandwidth GB/s, relative RMSE of the steps) of the link that prices the
    lockstep steps of `rows` with `pricer`'s compute (module docstring, step 2)."""
    par, shape = pricer.parallel, pricer.shape
    bare = IterationPricer(pricer.tables, shape, replace(par, link_gbps=NO_LINK_GBPS,
                                                        link_latency_s=0.0))  # fmt: skip
    steps = lockstep_steps(rows)
    prices = step_prices(steps, bare)
    layers = shape.num_moe_layers
    share = (par.ep - 1) / par.ep
    per_token = (2 * shape.hidden_size + shape.num_experts) * shape.dtype_bytes
    group = np.array([sum(int(r["tokens_in"]) for r in rs) for rs, _p in steps], dtype=float)
    x = np.c_[np.full(len(steps), 2.0 * layers), layers * share * per_token * group]
    w = np.sqrt([_requests(rs) for rs, _p in steps])
    (lat, s_per_byte), _ = nnls(x * w[:, None], (prices[:, 0] - prices[:, 1]) * w)
    gbps = 1.0 / (s_per_byte * 1e9) if s_per_byte > 0 else NO_LINK_GBPS
    fit = prices[:, 1] + x @ np.array([lat, s_per_byte])
    rel = float(np.sqrt(np.mean(((fit - prices[:, 0]) / prices[:, 0]) ** 2)))
    return float(lat), float(gbps), rel


def calibrate(bundle: str | Path, db: str | Path, run: str, out: str | Path) -> dict[str, Any]:
    """Write `bundle` calibrated on `run` of `db` to `out` (module docstring)."""
    src, dst = Path(bundle), Path(out)
    rows, config = pass_rows(db, run)
    model = ModelConfig(**config["torch_engine"]["model"])
    shape = ModelShape.from_hf_config(model.hf_config(), source=model.name)
    par = Parallelism(dp=int(config["dp_group"]["dp"]), ep=int(config["dp_group"]["ep"]))
    link0 = json.loads((src / "link.json").read_text())
    full = IterationPricer(OperatorTables.load(src), shape,
                           replace(par, link_gbps=link0["link_gbps"],
                                   link_latency_s=link0["link_latency_s"]))  # fmt: skip
    shutil.copytree(src, dst, dirs_exist_ok=True)
    _rewrite(src, dst, 1.0, 0.0)  # every table at its smallest key: the fixed part
    fixed = IterationPricer(OperatorTables.load(dst), shape, par)
    real = [r for r in rows if r["kind"] != "dummy"]
    x = np.array([[_compute(fixed, r), _compute(full, r) - _compute(fixed, r)] for r in real])
    (a, b), _ = nnls(x, np.array([_measured(r) for r in real]))
    _rewrite(src, dst, float(a), float(b))
    scaled = IterationPricer(OperatorTables.load(dst), shape, par)
    lat, gbps, rel = fit_step_link(rows, scaled)
    source = f"fitted on run {run}: the lockstep steps' periods less their priced compute"
    link = {"link_gbps": gbps, "link_latency_s": lat, "fit_rel_rmse": rel, "source": source,
            "measured_alone": {k: link0.get(k) for k in ("link_gbps", "link_latency_s", "source")}}  # fmt: skip
    (dst / "link.json").write_text(json.dumps(link, indent=1) + "\n")
    calibrated = IterationPricer(scaled.tables, shape,
                                 replace(par, link_gbps=gbps, link_latency_s=lat))  # fmt: skip
    doc = {"run": run, "fitted_on": run, "db": str(db), "fixed_factor": float(a),
           "unit_factor": float(b), "link_gbps": gbps, "link_latency_s": lat,
           "step_fit_rel_rmse": rel, "passes": len(rows),
           "ratio_before": compute_ratios(rows, full), "ratio_after": compute_ratios(rows, scaled),
           "step_ratio_before": lockstep_ratios(rows, full),
           "step_ratio_after": lockstep_ratios(rows, calibrated)}  # fmt: skip
    (dst / "calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


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
