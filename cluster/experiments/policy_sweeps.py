"""Policy experiments on the simulator (paper 003 §5.2 Table 1, §5.3 target cell).

The memory-pressure cell follows paper 003's RTX PRO 6000 configuration in shape: one
engine whose KV pool (114,768 tokens there and here) is a small fraction of the agents'
working set, SWE-bench programs arriving as a Poisson process until a fixed number have
arrived, every program run to completion. Here the programs are the real SWE-agent turns
of the ThunderAgent trace (the bs32 run's programs in their recorded order; each
program's token counts and tool gaps are replayed, its turns released causally), served
by the profile fitted to that trace's H200 timings (`validation.fit_sweagent_profile`),
on one collocated node without a host tier (`host_kv=False`): retained KV competes for
GPU memory with running calls, and calls that cannot get memory wait or are preempted.

- `table1_spec`: {LRU, fixed TTL (tau = 2 s), pressure-scaled TTL} x {FCFS, PLAS}, 50
  programs at 0.02 programs/s, several arrival seeds; report mean JCT changes against
  LRU + FCFS (`table1_rows`).
- `policies_spec`: every shipped retention policy under FCFS and PLAS on the same cell.
- `smoke_spec`: 24 tiny runs (two generators, four retention x three scheduling
  policies), for checking that sweep backends agree.
- `preset(name)`: these sweeps by the names `pdlab sweep --preset` takes.
- `cell(name)`: named single configurations (`table1-cell`; `search-cell`, paper
  003 §5.3's target cell: 30 programs at 0.1 programs/s) for the OpenEvolve evaluator
  (`openevolve_evaluator`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.core import ConfigError
from cluster.sweep import SweepSpec

POOL_TOKENS = 114_768  # paper 003 §5.1: the RTX PRO 6000 KV pool of Llama-3.1-70B at TP2


def pressure_cell(programs: int = 50, rate_per_s: float = 0.02) -> dict[str, Any]:
    """SimConfig fields of the memory-pressure cell (see module docstring)."""
    from cluster.experiments.sweagent_replay import fit_sweagent_profile, trace_path

    return {
        "workload": str(trace_path()),
        "workload_params": {"run": "bs32"},
        "nodes": 1,
        "split": "collocated",
        "agents": None,
        "arrival_rate_per_min": rate_per_s * 60.0,
        "max_active": 100_000,  # no admission limit: the engine's queue holds every call
        "max_programs": programs,
        "duration_s": 200_000.0,  # long enough for every program to finish
        "warmup_s": 0.0,
        "planner": "static",
        "profile": fit_sweagent_profile().profile,
        "host_kv": False,
        "l1_tokens": POOL_TOKENS,
        "telemetry": "compact",
    }


def table1_spec(quick: bool = False) -> SweepSpec:
    return SweepSpec(
        base=pressure_cell(),
        grid={"retention": ["lru", "ttl", "pressure-ttl"], "scheduling": ["fcfs", "plas"]},
        seeds=(0, 1) if quick else (0, 1, 2, 3, 4, 5, 6, 7),
        name="table1",
    )


def policies_spec(quick: bool = False) -> SweepSpec:
    return SweepSpec(
        base=pressure_cell(),
        grid={
            "retention": [
                "lru",
                "evict-always",
                "ttl",
                "per-tool-ttl",
                "pressure-ttl",
                "min-waste",
                "branch-count",
            ],
            "scheduling": ["fcfs", "plas"],
        },
        seeds=(0,) if quick else (0, 1, 2),
        name="policies",
    )


def smoke_spec(quick: bool = True) -> SweepSpec:
    return SweepSpec(
        base={
            "nodes": 1,
            "split": "collocated",
            "agents": 4,
            "duration_s": 300.0,
            "warmup_s": 0.0,
            "planner": "static",
            "host_kv": False,
            "l1_tokens": 150_000,
            "telemetry": "compact",
            "profile": "h200",
        },
        grid={
            "workload": ["cc", "putnam"],
            "retention": ["lru", "ttl", "evict-always", "pressure-ttl"],
            "scheduling": ["fcfs", "plas", "program-fcfs"],
        },
        seeds=(0,),
        name="smoke",
    )


PRESETS: dict[str, Callable[[bool], SweepSpec]] = {
    "table1": table1_spec,
    "policies": policies_spec,
    "smoke": smoke_spec,
}


def preset(name: str, quick: bool = False) -> SweepSpec:
    """Named sweeps: `table1` (paper 003 Table 1 shape), `policies` (every shipped retention
    policy under FCFS and PLAS), `smoke` (24 tiny runs, for checks); `quick`: fewer seeds."""
    if name not in PRESETS:
        raise ConfigError(f"unknown sweep preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name](quick)


def cell(name: str) -> dict[str, Any]:
    """A named single configuration (SimConfig fields)."""
    if name == "table1-cell":
        return pressure_cell() | {"retention": "ttl", "scheduling": "plas"}
    if name == "search-cell":
        return pressure_cell(programs=30, rate_per_s=0.1) | {
            "retention": "ttl",
            "scheduling": "plas",
        }
    raise ConfigError(f"unknown cell {name!r}; choose one of: table1-cell, search-cell")


def table1_rows(aggregated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Paper 003 Table 1 layout: one row per retention policy, mean JCT change against
    LRU + FCFS per scheduling policy (aggregated sweep rows of `table1_spec`)."""
    by = {(a["params"]["retention"], a["params"]["scheduling"]): a for a in aggregated}
    base = by.get(("lru", "fcfs"))
    if base is None or not base["mean_jct_s"]:
        raise ConfigError("table 1 needs the LRU + FCFS point")
    rows = []
    for ret in ("lru", "ttl", "pressure-ttl"):
        row: dict[str, Any] = {"retention": ret}
        for sch in ("fcfs", "plas"):
            a = by.get((ret, sch))
            if a is None:
                continue
            row[f"{sch}_mean_jct_s"] = a["mean_jct_s"]
            row[f"{sch}_delta"] = a["mean_jct_s"] / base["mean_jct_s"] - 1.0
            row[f"{sch}_delta_sem"] = a.get("delta_jct_paired_sem")
        rows.append(row)
    return rows
