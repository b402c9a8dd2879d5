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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cluster.sim.simulator import Simulator


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else float("nan")


def summarize(sim: Simulator) -> dict[str, Any]:
    cfg = sim.cfg
    t0, t1 = cfg.warmup_s, max(sim.now, cfg.warmup_s)
    done = [r for r in sim.requests if r.t_done is not None and r.measured]
    ttft = np.array([r.t_first_token - r.t_arrival for r in done if r.t_first_token is not None])
    e2e = np.array([r.t_done - r.t_arrival for r in done])  # type: ignore[operator]
    finished_in_window = sum(
        1 for r in sim.requests if r.t_done is not None and t0 <= r.t_done <= t1
    )
    started = [r for r in sim.requests if r.t_prefill_start is not None and r.measured]
    t_in = float(sum(r.t_in for r in started))
    t_c = float(sum(r.t_c for r in started))
    t_ideal = float(sum(r.t_ideal_c for r in started))
    h = t_c / t_in if t_in else float("nan")
    h_star = t_ideal / t_in if t_in else float("nan")
    lost = 1.0 - h / h_star if h_star and h_star == h_star and h_star > 0 else float("nan")
    waits = {n: np.array(w) for n, w in sim.queue_wait.items() if w}
    mean_wait = {n: float(w.mean()) for n, w in waits.items()}
    balance = (
        max(mean_wait.values()) / (sum(mean_wait.values()) / len(mean_wait))
        if mean_wait and sum(mean_wait.values()) > 0
        else float("nan")
    )
    p, d = sim.cp.split()
    switches = [s for s in sim.switch_log if s["t_done"] >= t0]
    switch_times = [
        row["t_done"] - row["t_decided"]
        for row in sim.switch_rows()
        if row["t_done"] is not None and row["t_done"] >= t0
    ]
    measured = t1 - t0
    progs = [row for row in sim.program_rows if row[0] >= t0]
    jct = np.array([f - a for a, f, *_ in progs])
    tpot = np.array(
        [
            (r.t_done - r.t_first_token) / (r.t_out - 1)  # type: ignore[operator]
            for r in done
            if r.t_out > 1 and r.t_first_token is not None
        ]
    )
    queueing = np.array([r.t_prefill_start - r.t_routed for r in started])  # type: ignore[operator]
    return {
        "run_id": sim.run_id,
        "workload": cfg.workload,
        "nodes": cfg.nodes,
        "initial_split": cfg.split,
        "planner": cfg.planner,
        "router": cfg.router,
        "eviction": cfg.eviction,
        "kv_fetch": sim.cp.config.kv_fetch,
        "profile": sim.profile.name,
        "seed": cfg.seed,
        "sim_seconds": float(sim.now),
        "measured_seconds": float(measured),
        "wall_seconds": float(sim.wall_s),
        "speedup": float(sim.now / sim.wall_s) if sim.wall_s > 0 else float("nan"),
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
        "final_split": f"{p}P{d}D" if not sim.cp.collocated else "collocated",
        "split_timeline": [[float(t), int(a), int(b)] for t, a, b in sim.split_timeline],
        "prefill_queue_wait_s": {str(n): w for n, w in sorted(mean_wait.items())},
        "prefill_queue_imbalance": balance,
        "programs_finished": int(sim.finished_programs),
        "events": int(sim.events_processed),
        "retention": sim.retention.name if sim.retention is not None else None,
        "scheduling": sim.scheduling.name,
        "dispatch": sim.dispatch.name if sim.dispatch is not None else None,
        "host_kv": bool(cfg.host_kv),
        "programs_measured": len(progs),
        "mean_jct_s": _mean(jct),
        "p50_jct_s": _pct(jct, 50),
        "p99_jct_s": _pct(jct, 99),
        "preemptions": int(sum(row[3] for row in progs)),  # of the measured programs
        "preemptions_total": int(sim.preemptions),  # every preemption of the run
        "p99_ttft_s": _pct(ttft, 99),
        "mean_tpot_s": _mean(tpot),
        "p99_tpot_s": _pct(tpot, 99),
        "mean_queueing_s": _mean(queueing),
        "p99_queueing_s": _pct(queueing, 99),
    }
