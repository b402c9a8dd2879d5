"""Agent workloads: programs, generators (putnam, cc, osworld, shift) and trace replay.

Paper 003 §3 (programs, causal release) and paper 000 §2.1, §6.1 (the three agent workloads
and the shifting composition). `make_workload(spec)` is the single entry point:

    src = make_workload("cc", seed=1)                        # a generator
    src = make_workload("shift", duration_s=3 * 3600)        # putnam -> mixed -> osworld
    src = make_workload("traces/mooncake_fast25_conversation_trace.jsonl")  # trace replay
    prog = src.next_program(now)                             # closed / open loop
    progs = src.trace_programs()                             # open-loop trace replay, or None
    trace_last_arrival_s("traces/...jsonl")                  # when its last program arrives
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from cluster.core import ConfigError, Registry
from cluster.workloads.cc import CCParams, CCSource
from cluster.workloads.loops import AdmissionQueue, ClosedLoop, OpenLoop
from cluster.workloads.osworld import OSWorldParams, OSWorldSource
from cluster.workloads.program import (
    SHARED_SEGMENT_LIMIT,
    TURN_KINDS,
    Program,
    Segment,
    SegmentIds,
    Turn,
)
from cluster.workloads.putnam import PutnamParams, PutnamSource
from cluster.workloads.shift import ShiftParams, ShiftSource
from cluster.workloads.source import WorkloadSource, params_from
from cluster.workloads.tools import TokenDist, ToolMix, ToolProfile
from cluster.workloads.traces import TraceParams, TraceReport, TraceSource, resolve_trace_path

WORKLOADS: Registry[WorkloadSource] = Registry("workload")
WORKLOAD_PARAMS: dict[str, type] = {
    "putnam": PutnamParams,
    "cc": CCParams,
    "osworld": OSWorldParams,
    "shift": ShiftParams,
}


@WORKLOADS.register("putnam")
def _putnam(seed: int = 0, duration_s: float | None = None, **params: Any) -> WorkloadSource:
    return PutnamSource(
        params_from(PutnamParams, "putnam", params), seed=seed, duration_s=duration_s
    )


@WORKLOADS.register("cc")
def _cc(seed: int = 0, duration_s: float | None = None, **params: Any) -> WorkloadSource:
    return CCSource(params_from(CCParams, "cc", params), seed=seed, duration_s=duration_s)


@WORKLOADS.register("osworld")
def _osworld(seed: int = 0, duration_s: float | None = None, **params: Any) -> WorkloadSource:
    return OSWorldSource(
        params_from(OSWorldParams, "osworld", params), seed=seed, duration_s=duration_s
    )


@WORKLOADS.register("shift")
def _shift(seed: int = 0, duration_s: float | None = None, **params: Any) -> WorkloadSource:
    return ShiftSource(params_from(ShiftParams, "shift", params), seed=seed, duration_s=duration_s)


def make_workload(
    spec: str | os.PathLike[str], *, seed: int = 0, duration_s: float | None = None, **params: Any
) -> WorkloadSource:
    """A workload source by name ("putnam", "cc", "osworld", "shift") or trace file path.

    Unknown names and bad parameters raise ConfigError saying what is allowed. A path is
    resolved against the working directory, then the real data (a full copy in
    $PDLAB_DATA_DIR or <project root>/../shared/data, then the copy bundled with pdlab,
    cluster.data) and its traces/ folder; its format is sniffed.
    """
    if duration_s is not None and not duration_s > 0:
        raise ConfigError(f"duration_s must be > 0, got {duration_s}")
    name = os.fspath(spec)
    if name in WORKLOADS:
        return WORKLOADS.create(name, seed=seed, duration_s=duration_s, **params)
    if _looks_like_path(name):
        path = resolve_trace_path(name)
        return TraceSource(path, params_from(TraceParams, "trace", params), seed=seed)
    raise ConfigError(
        f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS.names())}, "
        "or a trace file path (.jsonl SWE-agent turns or Mooncake requests, .csv Azure)"
    )


def trace_last_arrival_s(spec: str | os.PathLike[str], **params: Any) -> float | None:
    """The last arrival time (s) of a trace with arrival times, else None (generators,
    traces without times). Reads the trace once per file version and parameters."""
    name = os.fspath(spec)
    if name in WORKLOADS or not _looks_like_path(name):
        return None
    path = resolve_trace_path(name)
    return _last_arrival(path, path.stat().st_mtime_ns, params_from(TraceParams, "trace", params))


@functools.lru_cache(maxsize=16)
def _last_arrival(path: Path, mtime_ns: int, params: TraceParams) -> float | None:
    times = [p.arrival_s for p in TraceSource(path, params).programs if p.arrival_s is not None]
    return max(times) if times else None


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or Path(name).suffix != "" or Path(name).exists()


__all__ = [
    "SHARED_SEGMENT_LIMIT",
    "TURN_KINDS",
    "WORKLOADS",
    "WORKLOAD_PARAMS",
    "AdmissionQueue",
    "CCParams",
    "ClosedLoop",
    "OSWorldParams",
    "OpenLoop",
    "Program",
    "PutnamParams",
    "Segment",
    "SegmentIds",
    "ShiftParams",
    "TokenDist",
    "ToolMix",
    "ToolProfile",
    "TraceParams",
    "TraceReport",
    "TraceSource",
    "Turn",
    "WorkloadSource",
    "make_workload",
    "trace_last_arrival_s",
]
