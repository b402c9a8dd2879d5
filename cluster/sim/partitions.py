"""Hierarchical serving at scale (paper 000 App. D.2): partitions simulated in parallel.

A global router binds each user (program) to one of P partitions; each partition has its own
router, planner and KV directory and serves its own agents, so partitions simulate
independently. Each runs in its own process (or as a Ray task, `ray_runtime`) and writes its telemetry
to the same DuckDB file as run `<run_id>-p<k>` (the telemetry writer holds the file only for
short transactions, so concurrent writers of different runs coexist). Node ids are global:
partition k owns nodes [k*n, (k+1)*n).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import numpy as np

from cluster.core import ConfigError, parse_split, tune_gc
from cluster.sim.ray_runtime import run_tasks
from cluster.sim.simulator import SimConfig, Simulator
from cluster.workloads import trace_last_arrival_s

BACKENDS = ("local", "ray")


def partition_configs(cfg: SimConfig, partitions: int) -> list[SimConfig]:
    """Split nodes, split and agents evenly; each partition gets its own seed."""
    if partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}")
    if cfg.nodes % partitions:
        raise ConfigError(f"--nodes {cfg.nodes} is not divisible into {partitions} partitions")
    n = cfg.nodes // partitions
    if partitions > 1 and not cfg.trace_cycle:
        end = trace_last_arrival_s(cfg.workload, **cfg.workload_params)
        if end is not None:
            raise ConfigError(
                "a trace replayed at its arrival times is not split across partitions (each "
                "would replay all of it); use --partitions 1, or --cycle to have the agents "
                "cycle the trace"
            )
    split = parse_split(cfg.split, cfg.nodes)
    if split is None:
        part_split = "collocated"
    else:
        p = max(1, min(n - 1, round(split[0] / partitions)))
        part_split = f"{p}P{n - p}D"
    out = []
    for k in range(partitions):
        agents = None
        if cfg.agents is not None:
            # The global router binds users round-robin: partition k gets every P-th agent.
            agents = cfg.agents // partitions + (1 if k < cfg.agents % partitions else 0)
            if agents == 0:
                raise ConfigError(f"--agents {cfg.agents} is fewer than {partitions} partitions")
        rate = cfg.arrival_rate_per_min / partitions if cfg.arrival_rate_per_min else None
        max_active = max(1, cfg.max_active // partitions)
        out.append(
            dataclasses.replace(
                cfg,
                nodes=n,
                split=part_split,
                agents=agents,
                arrival_rate_per_min=rate,
                max_active=max_active,
                seed=cfg.seed * 1000 + k,
            )
        )
    return out


def _run_partition(args: tuple[SimConfig, int, str | None, str | None]) -> dict[str, Any]:
    cfg, k, db_path, run_id = args
    tune_gc()
    offset = k * cfg.nodes
    if db_path is None:
        sim = Simulator(cfg, node_offset=offset)
        summary = sim.run()
    else:
        from cluster.sim.runner import config_dict, register_nodes
        from telemetry import TelemetryWriter

        conf = config_dict(cfg) | {"partition": k, "parent_run": run_id}
        with TelemetryWriter(db_path, run_id=f"{run_id}-p{k}", source="sim", config=conf) as writer:
            sim = Simulator(cfg, sink=writer, node_offset=offset)
            sim.run_id = writer.run_id
            register_nodes(writer, sim)
            summary = sim.run()
        summary["run_id"] = writer.run_id
    done = [r for r in sim.requests if r.t_done is not None and r.measured]
    summary["_ttft"] = [r.t_first_token - r.t_arrival for r in done if r.t_first_token is not None]
    summary["_e2e"] = [r.t_done - r.t_arrival for r in done if r.t_done is not None]
    summary["_jct"] = [f - a for a, f, *_ in sim.program_rows if a >= cfg.warmup_s]
    started = [r for r in sim.requests if r.t_prefill_start is not None and r.measured]
    summary["_kv"] = (
        sum(r.t_in for r in started),
        sum(r.t_c for r in started),
        sum(r.t_ideal_c for r in started),
    )
    summary["partition"] = k
    return summary


def simulate_partitioned(
    cfg: SimConfig,
    partitions: int,
    db_path: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    processes: int | None = None,
    backend: str = "local",
    on_done: Callable[[dict[str, Any]], None] | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Simulate `cfg` as `partitions` independent partitions; returns a cluster-wide summary.

    `backend` "local" runs them on `processes` local processes (default: one per partition,
    at most the CPU count); "ray" runs them as Ray tasks on the cluster at `ray_address`, or
    on a local Ray runtime of `processes` CPUs started for the run. Both give the same
    results and telemetry rows."""
    from telemetry.writer import new_run_id

    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    configs = partition_configs(cfg, partitions)
    rid = (run_id or new_run_id()) if db_path is not None else None
    jobs = [(c, k, None if db_path is None else str(db_path), rid) for k, c in enumerate(configs)]
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    workers = processes or min(len(jobs), os.cpu_count() or 1)
    if backend == "ray":
        results = run_tasks(_run_partition, jobs, ray_address, workers, on_done)
    elif workers <= 1:
        for j in jobs:
            results.append(_run_partition(j))
            if on_done is not None:
                on_done(results[-1])
    else:
        with ProcessPoolExecutor(workers) as ex:
            for fut in as_completed([ex.submit(_run_partition, j) for j in jobs]):
                results.append(fut.result())
                if on_done is not None:
                    on_done(results[-1])
    results.sort(key=lambda r: r["partition"])
    return merge_summaries(results, cfg, rid, time.perf_counter() - start)


def merge_summaries(
    parts: list[dict[str, Any]], cfg: SimConfig, run_id: str | None, elapsed_s: float
) -> dict[str, Any]:
    """One cluster-wide summary. `speedup` is simulated over elapsed wall time of the whole
    run (partitions share the cores); `speedup_per_partition` is what one core per
    partition would give (simulated time over the slowest partition's wall time)."""
    ttft = np.array([x for p in parts for x in p.pop("_ttft")])
    e2e = np.array([x for p in parts for x in p.pop("_e2e")])
    jct = np.array([x for p in parts for x in p.pop("_jct")])

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    kv = np.array([p.pop("_kv") for p in parts], dtype=float).sum(axis=0)
    h = float(kv[1] / kv[0]) if kv[0] else float("nan")
    h_star = float(kv[2] / kv[0]) if kv[0] else float("nan")
    slowest = max(p["wall_seconds"] for p in parts)
    sim_s = float(parts[0]["sim_seconds"])
    return {
        "run_id": run_id,
        "partitions": len(parts),
        "partition_runs": [p.get("run_id") for p in parts],
        "workload": cfg.workload,
        "nodes": cfg.nodes,
        "sim_seconds": sim_s,
        "wall_seconds": float(elapsed_s),
        "cpu_seconds": float(sum(p["wall_seconds"] for p in parts)),
        "speedup": sim_s / elapsed_s if elapsed_s > 0 else float("nan"),
        "speedup_per_partition": sim_s / slowest if slowest > 0 else float("nan"),
        "requests": int(sum(p["requests"] for p in parts)),
        "throughput_rps": float(sum(p["throughput_rps"] for p in parts)),
        "mean_ttft_s": float(ttft.mean()) if ttft.size else float("nan"),
        "p50_ttft_s": pct(ttft, 50),
        "p95_ttft_s": pct(ttft, 95),
        "mean_e2e_s": float(e2e.mean()) if e2e.size else float("nan"),
        "p50_e2e_s": pct(e2e, 50),
        "p95_e2e_s": pct(e2e, 95),
        "mean_jct_s": float(jct.mean()) if jct.size else float("nan"),
        "p99_jct_s": pct(jct, 99),
        "kv_hit_rate": h,
        "ideal_kv_hit_rate": h_star,
        "lost_kv_reuse": 1.0 - h / h_star if h_star > 0 else float("nan"),
        "switches": int(sum(p["switches"] for p in parts)),
        "final_split": [p["final_split"] for p in parts],
        "split_timeline": [p["split_timeline"] for p in parts],
    }
