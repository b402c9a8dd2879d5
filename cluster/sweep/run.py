"""Running a sweep's points on local processes or Ray (paper 003 §5.2).

`check_points` builds the simulator of every distinct point (seeds aside) before anything
runs, so a bad value fails at once with the point named, not after workers started.
`run_point` is one simulation and one row; `run_points` runs them on a local
`ProcessPoolExecutor` or as Ray tasks (the same function), `run_sweep` expands, checks and
runs a spec. Rows come back sorted by (point, seed) whatever order the workers finish in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from cluster.core import ConfigError, tune_gc
from cluster.sim.ray_runtime import run_tasks
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sweep.results import METRICS, finite, jsonable
from cluster.sweep.spec import SweepPoint, SweepSpec, expand

BACKENDS = ("local", "ray")


def run_point(point: SweepPoint) -> dict[str, Any]:
    """One simulation; the row of `sweep_results` without sweep_id/backend/created_at."""
    tune_gc()
    cfg = SimConfig(**point.config)
    t0 = time.perf_counter()
    summary = Simulator(cfg).run()
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {
        "point": point.point,
        "seed": point.seed,
        "params": point.params,
        "config": jsonable(point.config),
        "workload": cfg.workload if isinstance(cfg.workload, str) else str(cfg.workload),
        "retention": summary["retention"],
        "scheduling": summary["scheduling"],
        "dispatch": summary["dispatch"],
    }
    for k in METRICS:
        row[k] = finite(summary.get(k))
    row["wall_seconds"] = wall
    row["summary"] = jsonable(
        {k: v for k, v in summary.items() if k not in ("wall_seconds", "speedup", "run_id")}
    )
    return row


def check_points(points: Sequence[SweepPoint]) -> None:
    """Build the simulator of every distinct point (its first seed) without running it.

    Raises ConfigError naming the point and its parameters for the first bad one: an
    unknown policy, profile or workload, a split that does not fit the nodes, a warmup
    longer than the run, a value of the wrong type."""
    checked: set[int] = set()
    for p in points:
        if p.point in checked:
            continue
        checked.add(p.point)
        try:
            Simulator(SimConfig(**p.config))
        except (ConfigError, ValueError, TypeError) as err:
            where = ", ".join(f"{k}={v!r}" for k, v in p.params.items())
            raise ConfigError(
                f"sweep point {p.point}" + (f" ({where})" if where else "") + f": {err}"
            ) from None


def run_points(
    points: Sequence[SweepPoint],
    backend: str = "local",
    processes: int | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """Run checked points (`check_points`); rows sorted by (point, seed)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    rows: list[dict[str, Any]] = []
    workers = max(1, min(processes or os.cpu_count() or 1, len(points)))
    if backend == "ray":
        rows = run_tasks(run_point, list(points), ray_address, processes, on_row)
    elif workers == 1:
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
    rows.sort(key=lambda r: (r["point"], r["seed"]))
    for r in rows:
        r["backend"] = backend
    return rows


def run_sweep(
    spec: SweepSpec,
    backend: str = "local",
    processes: int | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    ray_address: str | None = None,
) -> list[dict[str, Any]]:
    """Expand, check and run every point; rows sorted by (point, seed)."""
    points = expand(spec)
    check_points(points)
    return run_points(points, backend, processes, on_row, ray_address)
