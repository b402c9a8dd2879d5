"""Run metrics of a simulation (SPEC §5, §7): throughput, TTFT, E2E, KV reuse, switches, split.

Warmup is excluded: latency and KV metrics cover requests that arrived after it and
finished before the end; throughput counts requests finished in the measured period.
h is the KV hit rate (cached prefix used at prefill / input tokens), h* the ideal hit rate
with unlimited KV shared by all nodes and no switches (the prefix some earlier request
produced), and lost KV reuse is 1 - h/h*.

Program-level metrics (paper 003 §3.1): JCT = finish - arrival of every program that
arrived after warmup and finished (the admission wait of an open loop counts), its
preemptions; per call TTFT, TPOT = (t_done - t_first_token) / (t_out - 1) for calls with
more than one output token, and queueing = prefill start - arrival at the prefill node.

A trace replay adds how the trace was fed and how much of it was served (`TraceReplay`):
`trace_replay` (arrivals: each program once at its recorded time; closed: a loop of agents;
open: Poisson arrivals), `trace_requests` (calls in the trace), `trace_requests_served`
(calls completed in the whole run, warmup included), `trace_cycled` (some program started
again, with fresh private ids) and `trace_finished` (every request of the trace finished
and the run ended at the last one, before `duration_s`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from cluster.sim.config import SimConfig
from cluster.sim.entities import SimRequest


class TraceReplay(NamedTuple):
    """How a trace was replayed and how much of it was served (see module docstring)."""

    replay: Literal["arrivals", "closed", "open"]
    requests: int
    requests_served: int
    cycled: bool
    finished: bool


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What a run hands to `summarize`: its configuration, clock and counts, its calls and
    the logs of programs, switches and queueing (the simulator builds it at `finish`)."""

    config: SimConfig
    run_id: str | None
    profile: str
    kv_fetch: str
    sim_seconds: float
    wall_seconds: float
    events: int
    requests: Sequence[SimRequest]
    queue_wait: Mapping[int, Sequence[float]]  # node -> prefill queue waits of measured calls
    split: tuple[int, int]  # final (prefill, decode) nodes
    collocated: bool
    split_timeline: Sequence[tuple[float, int, int]]
    switch_log: Sequence[Mapping[str, Any]]  # completed switches: t_done
    switch_rows: Sequence[Mapping[str, Any]]  # completed switches: t_decided, t_done
    program_rows: Sequence[tuple[float, float, int, int, float]]
    finished_programs: int
    preemptions: int
    retention: str | None
    scheduling: str
    dispatch: str | None
    trace: TraceReplay | None = None  # a trace replay only
    limits: Mapping[str, Any] | None = None  # the engine limits of a run that sets them
    # "node.phase" -> the form the warmup chose (a run with fit_form other than "paper")
    forms: Mapping[str, str] | None = None


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else float("nan")


def summarize(run: RunRecord) -> dict[str, Any]:
    """The run's summary (SPEC §7 keys)."""
    cfg = run.config
    now = run.sim_seconds
    t0, t1 = cfg.warmup_s, max(now, cfg.warmup_s)
    done = [r for r in run.requests if r.t_done is not None and r.measured]
    ttft = np.array([r.t_first_token - r.t_arrival for r in done if r.t_first_token is not None])
    e2e = np.array([r.t_done - r.t_arrival for r in done])  # type: ignore[operator]
    finished_in_window = sum(
        1 for r in run.requests if r.t_done is not None and t0 <= r.t_done <= t1
    )
    started = [r for r in run.requests if r.t_prefill_start is not None and r.measured]
    t_in = float(sum(r.t_in for r in started))
    t_c = float(sum(r.t_c for r in started))
    t_ideal = float(sum(r.t_ideal_c for r in started))
    h = t_c / t_in if t_in else float("nan")
    h_star = t_ideal / t_in if t_in else float("nan")
    lost = 1.0 - h / h_star if h_star and h_star == h_star and h_star > 0 else float("nan")
    waits = {n: np.array(w) for n, w in run.queue_wait.items() if w}
    mean_wait = {n: float(w.mean()) for n, w in waits.items()}
    balance = (
        max(mean_wait.values()) / (sum(mean_wait.values()) / len(mean_wait))
        if mean_wait and sum(mean_wait.values()) > 0
        else float("nan")
    )
    p, d = run.split
    switches = [s for s in run.switch_log if s["t_done"] >= t0]
    switch_times = [
        row["t_done"] - row["t_decided"]
        for row in run.switch_rows
        if row["t_done"] is not None and row["t_done"] >= t0
    ]
    measured = t1 - t0
    progs = [row for row in run.program_rows if row[0] >= t0]
    jct = np.array([f - a for a, f, *_ in progs])
    tpot = np.array(
        [
            (r.t_done - r.t_first_token) / (r.t_out - 1)  # type: ignore[operator]
            for r in done
            if r.t_out > 1 and r.t_first_token is not None
        ]
    )
    queueing = np.array([r.t_prefill_start - r.t_routed for r in started])  # type: ignore[operator]
    summary: dict[str, Any] = {
        "run_id": run.run_id,
        "workload": cfg.workload,
        "nodes": cfg.nodes,
        "initial_split": cfg.split,
        "planner": cfg.planner,
        "router": cfg.router,
        "eviction": cfg.eviction,
        "kv_fetch": run.kv_fetch,
        "profile": run.profile,
        "seed": cfg.seed,
        "sim_seconds": float(now),
        "measured_seconds": float(measured),
        "wall_seconds": float(run.wall_seconds),
        "speedup": float(now / run.wall_seconds) if run.wall_seconds > 0 else float("nan"),
        "requests": len(done),
        "throughput_rps": float(finished_in_window / measured) if measured > 0 else float("nan"),
        "mean_ttft_s": _mean(ttft),
        "p50_ttft_s": _pct(ttft, 50),
        "p95_ttft_s": _pct(ttft, 95),
        "mean_e2e_s": _mean(e2e),
        "p50_e2e_s": _pct(e2e, 50),
        "p95_e2e_s": _pct(e2e, 95),
        "kv_hit_rate": h,
        "ideal_kv_hit_rate": h_star,
        "lost_kv_reuse": lost,
        "switches": len(switches),
        "mean_switch_time_s": float(np.mean(switch_times)) if switch_times else 0.0,
        "final_split": f"{p}P{d}D" if not run.collocated else "collocated",
        "split_timeline": [[float(t), int(a), int(b)] for t, a, b in run.split_timeline],
        "prefill_queue_wait_s": {str(n): w for n, w in sorted(mean_wait.items())},
        "prefill_queue_imbalance": balance,
        "programs_finished": int(run.finished_programs),
        "events": int(run.events),
        "retention": run.retention,
        "scheduling": run.scheduling,
        "dispatch": run.dispatch,
        "host_kv": bool(cfg.host_kv),
        "programs_measured": len(progs),
        "mean_jct_s": _mean(jct),
        "p50_jct_s": _pct(jct, 50),
        "p99_jct_s": _pct(jct, 99),
        "preemptions": int(sum(row[3] for row in progs)),  # of the measured programs
        "preemptions_total": int(run.preemptions),  # every preemption of the run
        "p99_ttft_s": _pct(ttft, 99),
        "mean_tpot_s": _mean(tpot),
        "p99_tpot_s": _pct(tpot, 99),
        "mean_queueing_s": _mean(queueing),
        "p99_queueing_s": _pct(queueing, 99),
    }
    if run.trace is not None:
        summary |= {f"trace_{k}": v for k, v in run.trace._asdict().items()}
    if run.forms is not None:
        summary["warmup_forms"] = dict(run.forms)
    if run.limits is not None:
        decode_waits = np.array([r.decode_wait for r in done])
        summary |= {
            "engine_limits": dict(run.limits),
            # KV ready (arrived or recomputed) until in the decode batch: the iteration in
            # progress, then any wait for a seat (max_num_seqs) or for KV
            "mean_decode_wait_s": _mean(decode_waits),
            "p99_decode_wait_s": _pct(decode_waits, 99),
            # measured calls a full batch or short KV kept waiting at least once
            "decode_refused": sum(1 for r in done if r.decode_refusals),
        }
    return summary
