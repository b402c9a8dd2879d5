"""Policy sweeps on local processes or Ray, and an OpenEvolve evaluator (paper 003 §5.2-5.3).

A `SweepSpec` names a base configuration (SimConfig fields) and the axes to vary: a grid
(every combination) and/or random draws (seeded), each point replicated over `seeds`.
Axis names are SimConfig fields or `<dict field>.<key>` for the dict-valued fields
(`retention_params.tau_s`, `workload_params.run`). Each point runs one simulation in a
worker - a local `ProcessPoolExecutor` or a Ray cluster (`backend="ray"`, the same
function as a Ray task) - and becomes one row: the point's parameters and the run's
summary. Simulations are deterministic given their configuration, so both backends give
identical rows (wall time aside). Rows go into DuckDB:

    sweep_results(sweep_id, point, seed, backend, params JSON, config JSON, workload,
                  retention, scheduling, dispatch, mean_jct_s, p50_jct_s, p99_jct_s,
                  programs_measured, preemptions, mean_ttft_s, p95_ttft_s, mean_tpot_s,
                  mean_queueing_s, mean_e2e_s, throughput_rps, kv_hit_rate, requests,
                  sim_seconds, wall_seconds, created_at, summary JSON)

(one row per point and seed; non-finite numbers are NULL), and `aggregate` averages
seeds into a summary table. Policies in a sweep are given as names, file paths or module
paths, so a worker on another machine can load them.

`evaluate(program_path)` is the OpenEvolve evaluator entry point: the candidate file
defines one policy (retention, scheduling or dispatch, detected from its hooks); it runs
on the target cell and the score is seed mean JCT / candidate mean JCT (1.0 = parity).
The cell is `EVAL_CELL` (a preset name or SimConfig overrides), or $PDLAB_EVAL_CELL (a
preset name or a JSON object); the seed policy of each axis is `EVAL_SEEDS`, or
$PDLAB_EVAL_SEED.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.profiles import HardwareProfile
from cluster.sim.simulator import SimConfig

METRICS = (
    "mean_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "programs_measured",
    "preemptions",
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_tpot_s",
    "mean_queueing_s",
    "mean_e2e_s",
    "throughput_rps",
    "kv_hit_rate",
    "requests",
    "sim_seconds",
)
_INT_METRICS = {"programs_measured", "preemptions", "requests"}
SWEEP_TABLE = "sweep_results"
_DDL = f"""CREATE TABLE IF NOT EXISTS {SWEEP_TABLE} (
  sweep_id VARCHAR NOT NULL, point INTEGER NOT NULL, seed BIGINT NOT NULL,
  backend VARCHAR NOT NULL, params JSON, config JSON, workload VARCHAR,
  retention VARCHAR, scheduling VARCHAR, dispatch VARCHAR,
  mean_jct_s DOUBLE, p50_jct_s DOUBLE, p99_jct_s DOUBLE, programs_measured BIGINT,
  preemptions BIGINT, mean_ttft_s DOUBLE, p95_ttft_s DOUBLE, mean_tpot_s DOUBLE,
  mean_queueing_s DOUBLE, mean_e2e_s DOUBLE, throughput_rps DOUBLE, kv_hit_rate DOUBLE,
  requests BIGINT, sim_seconds DOUBLE, wall_seconds DOUBLE, created_at TIMESTAMP,
  summary JSON
)"""
_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}
_DICT_FIELDS = {"workload_params", "retention_params", "scheduling_params", "dispatch_params"}


@dataclasses.dataclass(frozen=True, slots=True)
class SweepSpec:
    """What to sweep: see the module docstring. `random` maps an axis to a distribution:
    ("uniform", lo, hi), ("loguniform", lo, hi), ("int", lo, hi) inclusive, or
    ("choice", [values]); `samples` draws per grid point (0: grid only)."""

    base: dict[str, Any]
    grid: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    random: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    samples: int = 0
    seeds: tuple[int, ...] = (0,)
    seed: int = 0  # of the random draws
    name: str = "sweep"

    def validate(self) -> None:
        for axis in (*self.base, *self.grid, *self.random):
            _check_axis(axis)
            if axis == "seed":
                raise ConfigError(
                    "replicate over seeds with `seeds`, not a 'seed' axis or base value"
                )
        for axis, values in self.grid.items():
            if not isinstance(values, list | tuple) or not values:
                raise ConfigError(f"grid axis {axis!r} needs a non-empty list of values")
        if self.random and self.samples < 1:
            raise ConfigError("random axes need samples >= 1")
        if self.samples < 0:
            raise ConfigError(f"samples must be >= 0, got {self.samples}")
        for axis, dist in self.random.items():
            _check_dist(axis, dist)
        if not self.seeds:
            raise ConfigError("seeds must name at least one seed")


class SweepPoint(NamedTuple):
    point: int  # index of the parameter combination
    seed: int
    params: dict[str, Any]  # the varied values (axis -> value)
    config: dict[str, Any]  # every SimConfig field that differs from the defaults


def _check_axis(axis: str) -> None:
    head, _, key = axis.partition(".")
    if head not in _FIELDS or (key and head not in _DICT_FIELDS) or (not key and "." in axis):
        allowed = (
            ", ".join(sorted(_FIELDS))
            + "; or <dict field>.<key> for "
            + ", ".join(sorted(_DICT_FIELDS))
        )
        raise ConfigError(f"unknown sweep axis {axis!r}; allowed: {allowed}")


def _check_dist(axis: str, dist: Any) -> None:
    ok = (
        isinstance(dist, list | tuple)
        and dist
        and dist[0] in ("uniform", "loguniform", "int", "choice")
    )
    if ok and dist[0] == "choice":
        ok = len(dist) == 2 and isinstance(dist[1], list | tuple) and len(dist[1]) > 0
    elif ok:
        ok = (
            len(dist) == 3
            and all(isinstance(x, int | float) for x in dist[1:])
            and dist[1] <= dist[2]
        )
        ok = ok and (dist[0] != "loguniform" or dist[1] > 0)
    if not ok:
        raise ConfigError(
            f"random axis {axis!r}: {dist!r} is not a distribution; use ('uniform', lo, hi), "
            "('loguniform', lo, hi), ('int', lo, hi) or ('choice', [values])"
        )


def _draw(rng: np.random.Generator, dist: tuple[Any, ...]) -> Any:
    kind = dist[0]
    if kind == "uniform":
        return float(rng.uniform(dist[1], dist[2]))
    if kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(dist[1]), math.log(dist[2]))))
    if kind == "int":
        return int(rng.integers(dist[1], dist[2] + 1))
    values = list(dist[1])
    return values[int(rng.integers(len(values)))]


def expand(spec: SweepSpec) -> list[SweepPoint]:
    """The sweep's points in a deterministic order (grid product x draws x seeds)."""
    spec.validate()
    axes = list(spec.grid)
    combos = [dict(zip(axes, vals, strict=True)) for vals in itertools.product(*spec.grid.values())]
    rng = np.random.default_rng(spec.seed)
    params_list: list[dict[str, Any]] = []
    for combo in combos:
        if spec.random:
            for _ in range(spec.samples):
                params_list.append(combo | {a: _draw(rng, d) for a, d in spec.random.items()})
        else:
            params_list.append(combo)
    points = []
    for i, params in enumerate(params_list):
        for seed in spec.seeds:
            cfg = _apply(dict(spec.base), params) | {"seed": int(seed)}
            points.append(SweepPoint(i, int(seed), params, cfg))
    return points


def _apply(cfg: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    for axis, value in params.items():
        head, _, key = axis.partition(".")
        if key:
            cfg[head] = dict(cfg.get(head) or {}) | {key: value}
        else:
            cfg[head] = value
    return cfg


def run_point(point: SweepPoint) -> dict[str, Any]:
    """One simulation; the row of `sweep_results` without sweep_id/backend/created_at."""
    from cluster.core import tune_gc
    from cluster.sim.simulator import Simulator

    tune_gc()
    cfg = SimConfig(**point.config)
    t0 = time.perf_counter()
    summary = Simulator(cfg).run()
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {
        "point": point.point,
        "seed": point.seed,
        "params": point.params,
        "config": _jsonable(point.config),
        "workload": cfg.workload if isinstance(cfg.workload, str) else str(cfg.workload),
        "retention": summary["retention"],
        "scheduling": summary["scheduling"],
        "dispatch": summary["dispatch"],
    }
    for k in METRICS:
        row[k] = _finite(summary.get(k))
    row["wall_seconds"] = wall
    row["summary"] = _jsonable(
        {k: v for k, v in summary.items() if k not in ("wall_seconds", "speedup", "run_id")}
    )
    return row


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _jsonable(v: Any) -> Any:
    if isinstance(v, HardwareProfile):
        return v.name
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def run_sweep(
    spec: SweepSpec,
    backend: str = "local",
    processes: int | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """Run every point; rows sorted by (point, seed)."""
    points = expand(spec)
    rows: list[dict[str, Any]] = []
    if backend == "local":
        workers = max(1, min(processes or os.cpu_count() or 1, len(points)))
        if workers == 1:
            for p in points:
                rows.append(run_point(p))
                if on_row is not None:
                    on_row(rows[-1])
        else:
            with ProcessPoolExecutor(workers) as ex:
                for fut in as_completed([ex.submit(run_point, p) for p in points]):
                    rows.append(fut.result())
                    if on_row is not None:
                        on_row(rows[-1])
    elif backend == "ray":
        rows = _run_ray(points, processes, on_row, ray_address)
    else:
        raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    rows.sort(key=lambda r: (r["point"], r["seed"]))
    for r in rows:
        r["backend"] = backend
    return rows


def _run_ray(
    points: list[SweepPoint],
    processes: int | None,
    on_row: Callable[[dict[str, Any]], None] | None,
    address: str | None,
) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "backend 'ray' needs Ray: pip install 'pdlab[ray]' (ray[default]>=2.30)"
        ) from None
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kw["address"] = address
        elif processes:
            kw["num_cpus"] = processes
        ray.init(**kw)  # workers import pdlab from the same environment as the driver
    task = ray.remote(run_point)
    pending = [task.remote(p) for p in points]
    rows = []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        rows.append(ray.get(done[0]))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def write_results(
    db_path: str | os.PathLike[str], rows: Iterable[dict[str, Any]], sweep_id: str | None = None
) -> str:
    """Append rows to `sweep_results` in DuckDB; returns the sweep id."""
    import duckdb

    sid = sweep_id or f"sweep-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    now = datetime.now()
    records = []
    cols = ["sweep_id", "point", "seed", "backend", "params", "config", "workload", "retention",
            "scheduling", "dispatch", *[m for m in METRICS], "wall_seconds", "created_at", "summary"]  # fmt: skip
    for r in rows:
        rec = {**r, "sweep_id": sid, "created_at": now}
        for k in ("params", "config", "summary"):
            rec[k] = json.dumps(_jsonable(r[k]), sort_keys=True)
        records.append([rec.get(c) for c in cols])
    con = duckdb.connect(str(db_path))
    try:
        con.execute(_DDL)
        con.executemany(
            f"INSERT INTO {SWEEP_TABLE} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            records,
        )
    finally:
        con.close()
    return sid


def read_results(db_path: str | os.PathLike[str], sweep_id: str | None = None) -> Any:
    """The stored rows (a polars DataFrame), of one sweep or all."""
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    try:
        q = f"SELECT * FROM {SWEEP_TABLE}"
        if sweep_id is None:
            return con.sql(q + " ORDER BY sweep_id, point, seed").pl()
        return con.sql(q + " WHERE sweep_id = ? ORDER BY point, seed", params=[sweep_id]).pl()
    finally:
        con.close()


def aggregate(rows: list[dict[str, Any]], baseline: int = 0) -> list[dict[str, Any]]:
    """Mean over seeds per point, with the change in mean JCT against point `baseline`."""
    by_point: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    out = []
    for point in sorted(by_point):
        rs = by_point[point]
        agg: dict[str, Any] = {"point": point, "params": rs[0]["params"], "seeds": len(rs)}
        for m in ("mean_jct_s", "p99_jct_s", "preemptions", "mean_queueing_s", "kv_hit_rate"):
            vals = [r[m] for r in rs if r.get(m) is not None]
            agg[m] = float(np.mean(vals)) if vals else None
        jcts = [r["mean_jct_s"] for r in rs if r.get("mean_jct_s") is not None]
        agg["jct_sem_s"] = (
            float(np.std(jcts, ddof=1) / math.sqrt(len(jcts))) if len(jcts) > 1 else None
        )
        out.append(agg)
    base = next((a for a in out if a["point"] == baseline), None)
    for a in out:
        ok = base is not None and base["mean_jct_s"] and a["mean_jct_s"] is not None
        a["delta_jct"] = a["mean_jct_s"] / base["mean_jct_s"] - 1.0 if ok else None  # type: ignore[index]
        # Paired by seed: the same programs and arrivals under both policies.
        a["delta_jct_paired_sem"] = _paired_sem(by_point[a["point"]], by_point.get(baseline, []))
    return out


def _paired_sem(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> float | None:
    ref = {r["seed"]: r["mean_jct_s"] for r in base if r.get("mean_jct_s")}
    d = [
        r["mean_jct_s"] / ref[r["seed"]] - 1.0
        for r in rows
        if r["seed"] in ref and r.get("mean_jct_s")
    ]
    return float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None


# ---- presets ------------------------------------------------------------------------------
def preset(name: str, quick: bool = False) -> SweepSpec:
    """Named sweeps: `table1` (paper 003 Table 1 shape), `policies` (every shipped retention
    policy under FCFS and PLAS), `smoke` (24 tiny runs, for checks)."""
    from cluster.policies import experiments

    makers: dict[str, Callable[[bool], SweepSpec]] = {
        "table1": experiments.table1_spec,
        "policies": experiments.policies_spec,
        "smoke": experiments.smoke_spec,
    }
    if name not in makers:
        raise ConfigError(f"unknown sweep preset {name!r}; choose one of: {', '.join(makers)}")
    return makers[name](quick)


# ---- OpenEvolve evaluator --------------------------------------------------------------------
EVAL_CELL: str | dict[str, Any] = "search-cell"  # paper 003 §5.3: 30 programs at 0.1 JPS
EVAL_SEEDS: dict[str, str] = {"retention": "ttl", "scheduling": "plas", "dispatch": "least-loaded"}
_seed_jct_cache: dict[str, float] = {}


def _eval_cell() -> dict[str, Any]:
    from cluster.policies import experiments

    spec: Any = os.environ.get("PDLAB_EVAL_CELL") or EVAL_CELL
    if isinstance(spec, str) and spec.strip().startswith("{"):
        spec = json.loads(spec)
    if isinstance(spec, str):
        return experiments.cell(spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"the evaluation cell must be a preset name or a dict, got {spec!r}")
    return dict(spec)


def _axis_of(path: str) -> str:
    from cluster.policies.loader import HOOKS, load_policy

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


def _mean_jct(cell: dict[str, Any], axis: str, spec: str) -> tuple[float, dict[str, Any]]:
    from cluster.sim.simulator import Simulator

    cfg = SimConfig(**(cell | {axis: spec}))
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
        cell = _eval_cell()
        seed_spec = os.environ.get("PDLAB_EVAL_SEED") or EVAL_SEEDS[axis]
        key = json.dumps(_jsonable(cell), sort_keys=True) + f"|{axis}={seed_spec}"
        if key not in _seed_jct_cache:
            _seed_jct_cache[key] = _mean_jct(cell, axis, seed_spec)[0]
        seed_jct = _seed_jct_cache[key]
        jct, summary = _mean_jct(cell, axis, path)
    except ConfigError as err:  # PolicyError included
        return {"combined_score": 0.0, "error": str(err)}
    return {
        "combined_score": seed_jct / jct,
        "mean_jct_s": jct,
        "seed_mean_jct_s": seed_jct,
        "p99_jct_s": _finite(summary["p99_jct_s"]) or 0.0,
        "preemptions": float(summary["preemptions"]),
        "axis": axis,
    }
