"""Simulator benchmarks for `pdlab bench` (SPEC §8): simulated seconds per wall second.

- `sim_speedup_cc_9nodes`: `cc`, 9 nodes (4P5D), 126 agents, full control plane (gain planner
  with collocated warmup, TTFT router, branch-aware eviction), one process, compact telemetry
  kept in memory (no DuckDB I/O in the timed loop).
- `sim_speedup_3072gpu`: 768 nodes of 4 GPUs, 30,720 agents, 10 simulated minutes, as 8
  partitions of 96 nodes (App. D.2) on the local processes. The speedup is over the elapsed
  time; `_per_partition` is over the slowest partition's time, i.e. with a core per
  partition. Quick mode runs 1 partition of 96 nodes with 3,840 agents for 2 minutes and
  extrapolates nothing (it reports that run).
"""

from __future__ import annotations

from typing import Any

from cluster.core import NullSink, tune_gc
from cluster.sim.partitions import simulate_partitioned
from cluster.sim.simulator import SimConfig, Simulator


def run(quick: bool) -> dict[str, Any]:
    tune_gc()
    dur = 900.0 if quick else 3600.0
    cfg = SimConfig(
        workload="cc",
        nodes=9,
        split="4P5D",
        agents=126,
        duration_s=dur,
        warmup_s=300.0,
        planner="gain",
        router="ttft",
        eviction="branch",
        telemetry="compact",
    )
    sim = Simulator(cfg, sink=NullSink())
    s = sim.run()
    out: dict[str, Any] = {
        "sim_speedup_cc_9nodes": round(s["speedup"], 1),
        "sim_cc_9nodes_requests_per_wall_s": round(s["requests"] / max(s["wall_seconds"], 1e-9), 1),
    }
    if quick:
        big = SimConfig(
            workload="cc",
            nodes=96,
            split="40P56D",
            agents=3840,
            duration_s=120.0,
            warmup_s=30.0,
            planner="static",
            telemetry="compact",
        )
        b = simulate_partitioned(big, 1)
        out["sim_speedup_3072gpu"] = None
        out["sim_speedup_96node_partition_2min"] = round(b["speedup"], 2)
    else:
        big = SimConfig(
            workload="cc",
            nodes=768,
            split="320P448D",
            agents=30720,
            duration_s=600.0,
            warmup_s=60.0,
            planner="gain",
            telemetry="compact",
            window_s=180.0,
        )
        b = simulate_partitioned(big, 8)
        out["sim_speedup_3072gpu"] = round(b["speedup"], 3)  # elapsed: partitions share cores
        out["sim_speedup_3072gpu_per_partition"] = round(b["speedup_per_partition"], 3)
        out["sim_3072gpu_requests"] = b["requests"]
        out["sim_3072gpu_cpu_seconds"] = round(b["cpu_seconds"], 1)
    return out
