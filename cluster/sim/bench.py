"""Simulator benchmarks for `pdlab bench` (SPEC §8): simulated seconds per wall second.

The headline figures are of `pdlab simulate` as users run it: the command below as a whole
process (interpreter, imports, the run, its DuckDB written and consolidated), timed from
outside, the speedup being simulated seconds over that process's wall time.

- `sim_speedup_cc_9nodes_compact` / `_full`: `pdlab simulate --workload cc --nodes 9 --split
  4P5D --agents 126 --duration 7200 --warmup 0 --planner gain --router ttft --eviction branch
  --seed 3 --db run.duckdb`, with `--telemetry compact` and with the default (full)
  telemetry. Quick: 15 simulated minutes, not two hours. `sim_speedup_cc_9nodes_nullsink` is
  the in-process figure with every row discarded (`NullSink`, no DuckDB; one simulated
  hour, quick 15 minutes): what the simulation alone costs, not what a user gets.
- `sim_speedup_3072gpu`: 768 nodes of 4 GPUs, 30,720 agents, 10 simulated minutes, as 8
  partitions of 96 nodes (App. D.2) on the local processes. The speedup is over the elapsed
  time; `_per_partition` is over the slowest partition's time, i.e. with a core per
  partition. Quick mode runs no 3,072-GPU configuration (the figure is None).
- `sim_azure_conv_requests_per_wall_s`: Vidur's own workload, the Azure 2023 conversation
  trace replayed open-loop at its arrival times: `pdlab simulate --workload
  azure2023_splitwise_conv_via_vidur.csv --nodes 8 --split collocated --duration 3600
  --warmup 0 --planner static --router least-loaded --telemetry compact --db run.duckdb`,
  finished requests over the whole process's wall time. Quick: the trace's first 15
  minutes. `_nullsink` beside it: the same in a bench child with every row discarded.
- `sim_peak_rss_96node_partition_mb`: peak resident memory of a process simulating one
  96-node partition of the 3,072-GPU configuration (3,840 agents, 10 simulated minutes; its
  speed alone is `sim_speedup_96node_partition`). Quick: the same partition with the static
  planner for 2 simulated minutes (`sim_speedup_96node_partition_2min`).

The NullSink figures and the partition go through a fresh process each (`python -m
cluster.sim.bench cc|azure|partition [--quick]`, one JSON object: the run's summary figures
and the process's peak RSS), so no figure inherits the memory of another.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster.core import NullSink, leave_garbage_to_os, tune_gc
from cluster.sim.simulator import SimConfig, Simulator

AZURE_TRACE = "traces/azure2023_splitwise_conv_via_vidur.csv"  # under the data directory
CHILD_TIMEOUT_S = 3600.0


def config_3072gpu() -> SimConfig:
    """768 nodes of 4 GPUs (the 3,072-GPU configuration), to run as 8 partitions."""
    return SimConfig(
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


def config_partition(quick: bool) -> SimConfig:
    """One 96-node partition: of the 3,072-GPU configuration, or the quick 2-minute one."""
    if not quick:
        from cluster.sim.partitions import partition_configs

        return partition_configs(config_3072gpu(), 8)[0]
    return SimConfig(
        workload="cc",
        nodes=96,
        split="40P56D",
        agents=3840,
        duration_s=120.0,
        warmup_s=30.0,
        planner="static",
        telemetry="compact",
    )


def config_azure(quick: bool) -> SimConfig:
    """The Azure conversation trace on 8 collocated nodes; every finished request counts."""
    from cluster.workloads.traces import resolve_trace_path

    return SimConfig(
        workload=str(resolve_trace_path(AZURE_TRACE)),
        nodes=8,
        split="collocated",
        planner="static",
        telemetry="compact",
        duration_s=900.0 if quick else 3600.0,
        warmup_s=0.0,
    )


def config_cc(quick: bool) -> SimConfig:
    """cc on 9 nodes with the full control plane: 126 agents, gain planner, TTFT router."""
    return SimConfig(
        workload="cc",
        nodes=9,
        split="4P5D",
        agents=126,
        duration_s=900.0 if quick else 3600.0,
        warmup_s=300.0,
        planner="gain",
        router="ttft",
        eviction="branch",
        telemetry="compact",
    )


CHILDREN = {"cc": config_cc, "azure": config_azure, "partition": config_partition}

# The users' commands whose whole-process figures the bench reports (see module docstring).
CC_ARGS = [
    "--workload",
    "cc",
    "--nodes",
    "9",
    "--split",
    "4P5D",
    "--agents",
    "126",
    "--warmup",
    "0",
    "--planner",
    "gain",
    "--router",
    "ttft",
    "--eviction",
    "branch",
    "--seed",
    "3",
]
AZURE_ARGS = [
    "--nodes",
    "8",
    "--split",
    "collocated",
    "--warmup",
    "0",
    "--planner",
    "static",
    "--router",
    "least-loaded",
    "--telemetry",
    "compact",
]


def simulate_cli(args: list[str]) -> tuple[dict[str, Any], float]:
    """`pdlab simulate ARGS --db <tmp>/run.duckdb --json` as a fresh process: its summary
    and the process's wall time from start to exit (the DuckDB file written and closed)."""
    with tempfile.TemporaryDirectory(prefix="pdlab-bench-") as tmp:
        db = Path(tmp) / "run.duckdb"
        code = "import sys; from toolkit.cli import app; sys.argv[0] = 'pdlab'; app()"
        cmd = [sys.executable, "-c", code, "simulate", *args, "--db", str(db), "--json"]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        wall_s = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"pdlab simulate {' '.join(args)} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout[res.stdout.index("{") :]), wall_s


def run_user_path(quick: bool) -> dict[str, Any]:
    """The cc and Azure figures of `pdlab simulate` as users run it (module docstring)."""
    from cluster.workloads.traces import resolve_trace_path

    out: dict[str, Any] = {}
    cc_s = 900.0 if quick else 7200.0
    for telemetry in ("compact", "full"):
        args = [*CC_ARGS, "--duration", str(cc_s), "--telemetry", telemetry]
        summary, wall_s = simulate_cli(args)
        out[f"sim_speedup_cc_9nodes_{telemetry}"] = round(cc_s / wall_s, 1)
        out[f"sim_cc_9nodes_{telemetry}_requests"] = summary["requests"]
        out[f"sim_cc_9nodes_{telemetry}_process_wall_s"] = round(wall_s, 2)
    trace = str(resolve_trace_path(AZURE_TRACE))
    az_s = 900.0 if quick else 3600.0
    summary, wall_s = simulate_cli(["--workload", trace, "--duration", str(az_s), *AZURE_ARGS])
    out["sim_azure_conv_requests_per_wall_s"] = round(summary["requests"] / wall_s, 1)
    out["sim_azure_conv_requests"] = summary["requests"]
    out["sim_azure_conv_process_wall_s"] = round(wall_s, 2)
    return out


def run(quick: bool) -> dict[str, Any]:
    out = run_user_path(quick)
    cc, _ = run_child("cc", quick)
    out["sim_speedup_cc_9nodes_nullsink"] = round(cc["speedup"], 1)
    if quick:
        out["sim_speedup_3072gpu"] = None
    else:
        from cluster.sim.partitions import simulate_partitioned

        tune_gc()
        b = simulate_partitioned(config_3072gpu(), 8)
        out["sim_speedup_3072gpu"] = round(b["speedup"], 3)  # elapsed: partitions share cores
        out["sim_speedup_3072gpu_per_partition"] = round(b["speedup_per_partition"], 3)
        out["sim_3072gpu_requests"] = b["requests"]
        out["sim_3072gpu_cpu_seconds"] = round(b["cpu_seconds"], 1)
    azure, wall_s = run_child("azure", quick)
    out["sim_azure_conv_requests_per_wall_s_nullsink"] = round(azure["requests"] / wall_s, 1)
    part, _ = run_child("partition", quick)
    out["sim_peak_rss_96node_partition_mb"] = round(part["peak_rss_mb"])
    speed = "sim_speedup_96node_partition" + ("_2min" if quick else "")
    out[speed] = round(part["speedup"], 2)
    return out


def run_child(name: str, quick: bool) -> tuple[dict[str, Any], float]:
    """Run `name` in a fresh Python process; its JSON figures and the process's wall time
    from start to exit."""
    cmd = [sys.executable, "-m", "cluster.sim.bench", name, *(["--quick"] if quick else [])]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    wall_s = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"bench child {name!r} failed ({res.returncode}): {res.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return figures, wall_s


def child_main(argv: list[str]) -> dict[str, Any]:
    """The figures of one child run (a name in CHILDREN; `--quick` for the small one)."""
    name, quick = argv[0], "--quick" in argv[1:]
    if name not in CHILDREN:
        raise SystemExit(f"unknown bench child {name!r}; choose from: {', '.join(CHILDREN)}")
    tune_gc()
    s = Simulator(CHILDREN[name](quick), sink=NullSink()).run()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "requests": s["requests"],
        "sim_seconds": s["sim_seconds"],
        "wall_seconds": s["wall_seconds"],
        "speedup": s["speedup"],
        "peak_rss_mb": peak_kib / 1024,
    }


if __name__ == "__main__":
    print(json.dumps(child_main(sys.argv[1:])), flush=True)
    leave_garbage_to_os()  # its sink kept nothing and it holds no open file
