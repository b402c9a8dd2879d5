"""`pdlab advise`: rank the PD splits of N nodes for a recorded run's workload (SPEC §9).

The recorded requests (toolkit.advise.workload: arrivals, input and output lengths, prefix
structure where the run has it) are replayed open-loop on the cluster simulator once per
split pP(N-p)D and seed, with the static planner (the split never changes) and no warmup.
Per split: mean and P90 TTFT, mean TPOT, mean and P90 E2E (toolkit.twin.metrics'
definitions), each the mean over seeds with an interval:

- the seed spread: mean +- t(0.975, K-1) * sd / sqrt(K) over K seeds (the simulator's
  iteration-time noise; a single seed gives a point);
- widened by the twin's error where a twin of the run is used (toolkit.advise.workload:
  `--twin RUN`, or the one made with the same profile; never a forced one): with [e_lo,
  e_hi] the twin's 95% interval of sim / real - 1 on that metric (its measured error
  included both ways), the real value of an estimate lies in [lo / (1 + e_hi), hi /
  (1 + e_lo)]. A twin whose interval reaches -100% (an error of 100% or more) leaves the
  upper end not known (infinite): the table says so instead of an interval from 0.
  `interval` in the result says which. The twin measures the engine model's error on the
  recorded settings, not this simulator's on other splits: an indication of how far the
  replay may be off, not a bound.

The switch cost of moving from the run's split to each candidate is the planner's own
switch model run on the same workload: the run starts on the run's split and, at the end
of the first window, the control plane switches the nodes the gain planner would move
(cluster.control.planning.candidate_split) in the run's planner's mode (in-place for the
gain planner, relaunch for dynamo, strand for arrow); the simulator drains them
(cluster/sim/drain.py). Reported: nodes moved, the requests they were still serving
(`phase_switches.drained`: they finish in place first), KV blocks lost, switch time
(decision to the last moved node serving), and the whole run's metrics with that switch
included. toolkit.advise.windows finds the best split per window, flags
back-and-forth winners and recommends the split that is best over the run with the
switch included.

"Should I disaggregate at all?": beside the splits, the same N nodes as N collocated
engines (DP ranks: each serves prefill and decode, vLLM V1's mixed iterations where the
profile has engine limits) are replayed the same way and
ranked with the same intervals (`collocated=False` leaves them out). A run that served on
N collocated engines (no PD split) has that candidate as its own; a PD run's move to
collocated engines is a relaunch of every engine whose cost is not modelled (none is
counted, and the recommendation says so). Requests go to the engines round-robin: vLLM's
DP front end balances by load (4 * waiting + running), but the simulator's nodes report
their load only when an iteration starts, so an idle engine's last report still counts its
finished batch and load-based routing (least-loaded) piles requests onto the lowest id;
round-robin spreads them as evenly as a balancer of equal engines does on average.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
from scipy import stats

from cluster.control import SwitchMode, candidate_split
from cluster.core import ConfigError
from cluster.hardware.profiles import HardwareProfile, load_profile
from cluster.sim.simulator import SimConfig, Simulator
from cluster.size_limits import SIM_SECONDS
from toolkit.advise.windows import Recommendation, WindowAdvice, order, recommend, window_best
from toolkit.advise.workload import PLANNER_MODES, TRACE_BLOCK_TOKENS, RecordedRun, write_trace
from toolkit.twin.metrics import Timings, metric_values

METRICS = ("ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "e2e_mean_s", "e2e_p90_s")
SWITCH_MODES = ("in-place", "relaunch", "strand")
Progress = Callable[[int, int, str], None]  # (done, total, what just ran)


class Estimate(NamedTuple):
    """One metric of one split: mean over seeds and its interval (module docstring)."""

    mean: float
    ci95: tuple[float, float]
    seeds: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": list(self.ci95), "seeds": list(self.seeds)}


class SwitchCost(NamedTuple):
    """Moving from the run's split to a candidate at `t_switch_s` (seed means)."""

    from_split: str
    mode: SwitchMode
    nodes_moved: int
    t_switch_s: float
    switch_time_s: float  # decision to the last moved node serving (lower bound: unfinished)
    finished: bool  # every seed's switch finished before the run ended (a relaunch may not)
    drained: float
    lost_kv_blocks: float
    metrics: dict[str, Estimate]  # the whole run, switch included

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_split,
            "mode": self.mode,
            "nodes_moved": self.nodes_moved,
            "t_switch_s": self.t_switch_s,
            "switch_time_s": self.switch_time_s,
            "switch_finished": self.finished,
            "drained_requests": self.drained,
            "lost_kv_blocks": self.lost_kv_blocks,
            "metrics": {k: v.to_json() for k, v in self.metrics.items()},
        }


class SplitAdvice(NamedTuple):
    split: str
    prefill: int
    decode: int
    metrics: dict[str, Estimate]
    unfinished: int  # requests not finished by the end of the replay (most over seeds)
    switch: SwitchCost | None  # None for the run's own split, or when it has none


class Advice(NamedTuple):
    run_id: str
    nodes: int
    requests: int
    seeds: int
    rank_by: str
    current: str | None
    interval: str  # "seeds" or "seeds+twin"
    twin_run_id: str | None
    twin_error: dict[str, float]
    twin_interval: dict[str, tuple[float, float]]  # the twin's 95% interval of its error
    twin_note: str | None  # twins of the run that were not used, and why
    recorded: dict[str, float]  # the real run's metrics (its own split only)
    splits: list[SplitAdvice]  # ranked, best first
    windows: WindowAdvice
    recommendation: Recommendation

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "nodes": self.nodes,
            "requests": self.requests,
            "seeds": self.seeds,
            "rank_by": self.rank_by,
            "current_split": self.current,
            "interval": self.interval,
            "twin_run_id": self.twin_run_id,
            "twin_error": {k: self.twin_error[k] for k in METRICS if k in self.twin_error},
            "twin_interval": {
                k: list(self.twin_interval[k]) for k in METRICS if k in self.twin_interval
            },
            "twin_note": self.twin_note,
            "recorded": self.recorded,
            "splits": [
                {
                    "rank": i + 1,
                    "split": s.split,
                    "prefill": s.prefill,
                    "decode": s.decode,
                    "collocated": s.prefill == 0,
                    "metrics": {k: v.to_json() for k, v in s.metrics.items()},
                    "unfinished_requests": s.unfinished,
                    "switch": None if s.switch is None else s.switch.to_json(),
                }
                for i, s in enumerate(self.splits)
            ],
            "windows": self.windows.to_json(),
            "recommendation": self.recommendation._asdict(),
        }


def split_name(prefill: int, decode: int) -> str:
    return f"{prefill}P{decode}D"


def collocated_name(nodes: int) -> str:
    """The candidate of `nodes` collocated engines (prefill = decode = 0 in SplitAdvice)."""
    return f"{nodes} collocated"


def advise(
    rec: RecordedRun,
    *,
    nodes: int | None = None,
    profile: str | None = None,
    seeds: int = 3,
    rank_by: str = "e2e_mean_s",
    window_s: float | None = None,
    switch_mode: str | None = None,
    progress: Progress | None = None,
    collocated: bool = True,
) -> Advice:
    """Replay `rec` on every split and assemble the advice (module docstring)."""
    n = rec.num_nodes if nodes is None else nodes
    if n < 2:
        where = (
            f"--nodes {n}"
            if nodes is not None
            else f"run {rec.run_id!r} has {n} node{'s' * (n != 1)}; pass --nodes N >= 2"
        )
        raise ConfigError(f"a PD split needs at least 2 nodes (1 prefill + 1 decode): {where}")
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if rank_by not in METRICS:
        raise ConfigError(f"cannot rank by {rank_by!r}; choose one of: {', '.join(METRICS)}")
    wanted = switch_mode or PLANNER_MODES.get(rec.planner or "gain", "in-place")
    if wanted not in SWITCH_MODES:
        raise ConfigError(f"switch mode must be one of {', '.join(SWITCH_MODES)}, got {wanted!r}")
    mode = cast(SwitchMode, wanted)
    spec = profile or rec.profile
    if spec is None:
        raise ConfigError(
            f"run {rec.run_id!r} does not name a simulator profile: pass --profile (a preset "
            "such as h200, a `pdlab fit --json` file or a `pdlab profile import` file)"
        )
    prof = load_profile(spec)
    current = rec.split if rec.split is not None and sum(rec.split) == n else None
    candidates = [(p, n - p) for p in range(1, n)]
    col = collocated_name(n) if collocated else None
    # a run on these nodes without a PD split ran them as collocated engines
    col_current = col is not None and rec.split is None and rec.num_nodes == n
    t0, t_last = float(rec.arrival_s.min()), float(rec.arrival_s.max())
    window = _window(window_s, float(rec.settings.get("window_s", 600.0)), t_last - t0)
    t_switch = t0 + window
    steps = len(candidates) * seeds * (2 if current is not None else 1) - (
        seeds if current is not None else 0
    )
    steps += seeds if col is not None else 0
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, steps, label)

    static: dict[str, list[Timings]] = {}
    switched: dict[str, list[tuple[Timings, int, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="pdlab-advise-") as tmp:
        trace = write_trace(rec, Path(tmp) / "requests.jsonl")
        horizon = min(max(3600.0, 20.0 * (t_last + 1.0)), SIM_SECONDS.hi)
        for p, d in candidates:
            name = split_name(p, d)
            for k in range(seeds):
                cfg = _config(trace, rec, prof, n, name, k, horizon)
                static.setdefault(name, []).append(_replay(cfg, None)[0])
                tick(f"{name} seed {k}")
                if current is None or (p, d) == current:
                    continue
                base = _config(trace, rec, prof, n, split_name(*current), k, horizon)
                timings, moved, cost = _replay(base, (t_switch, p, mode))
                switched.setdefault(name, []).append((timings, moved, cost))
                tick(f"{split_name(*current)} -> {name} seed {k}")
        for k in range(seeds if col is not None else 0):
            # spread evenly over the engines (module docstring: why not by reported load)
            cfg = _config(trace, rec, prof, n, "collocated", k, horizon)
            cfg = replace(cfg, router="round-robin")
            static.setdefault(str(col), []).append(_replay(cfg, None)[0])
            tick(f"{col} seed {k}")
    num = len(rec.arrival_s)
    bounds = twin_bounds(rec)
    splits = [
        SplitAdvice(
            split_name(p, d),
            p,
            d,
            _estimates([_values(t) for t in static[split_name(p, d)]], bounds),
            max(num - len(t.t_done) for t in static[split_name(p, d)]),
            _switch_cost(switched.get(split_name(p, d)), current, mode, t_switch, bounds),
        )
        for p, d in candidates
    ]
    if col is not None:
        runs = static[col]
        values = _estimates([_values(t) for t in runs], bounds)
        unfinished = max(num - len(t.t_done) for t in runs)
        splits.append(SplitAdvice(col, 0, 0, values, unfinished, None))
    splits.sort(key=lambda s: (s.unfinished > 0, order(s.metrics[rank_by].mean), s.prefill))
    windows = window_best(static, rank_by, t0, t_last, window)
    cur = col if col_current else (None if current is None else split_name(*current))
    return Advice(
        rec.run_id,
        n,
        num,
        seeds,
        rank_by,
        cur,
        "seeds+twin" if rec.twin_error else "seeds",
        rec.twin_run_id,
        rec.twin_error,
        bounds if rec.twin_run_id else {},
        rec.twin_note,
        _recorded(rec) if cur is not None and not rec.switched else {},
        splits,
        windows,
        recommend(splits, cur, rank_by, windows),
    )


def _window(window_s: float | None, planner_window_s: float, span_s: float) -> float:
    """The window: as given, else the planner's when the run spans two, else a quarter."""
    if window_s is not None:
        if not window_s > 0:
            raise ConfigError(f"--window must be > 0 seconds, got {window_s}")
        return window_s
    if span_s >= 2 * planner_window_s:
        return planner_window_s
    return max(span_s / 4.0, 1e-3)


def _config(
    trace: Path,
    rec: RecordedRun,
    profile: HardwareProfile,
    nodes: int,
    split: str,
    seed: int,
    horizon_s: float,
) -> SimConfig:
    return SimConfig(
        workload=str(trace),
        workload_params={"block_tokens": TRACE_BLOCK_TOKENS},
        nodes=nodes,
        split=split,
        agents=1,  # a trace with arrival times replays them; the closed loop does not apply
        planner="static",
        warmup_s=0.0,
        duration_s=horizon_s,
        profile=profile,
        seed=seed,
        telemetry="compact",
        prefill_forms=True,  # the router prices prefill as the profile's fitted forms do
        **rec.settings,
    )


def _replay(
    cfg: SimConfig, switch: tuple[float, int, SwitchMode] | None
) -> tuple[Timings, int, dict[str, float]]:
    """One replay: the finished requests' times; with `switch` (time, prefill count, mode),
    the nodes moved and the switch's cost."""
    switches = _SwitchRows()
    sim = Simulator(cfg, sink=switches)
    held: dict[int, int] = {}  # moved node -> KV blocks it held when the switch was decided
    cost: dict[str, float] = {}
    if switch is not None:
        t_switch, p, mode = switch
        sim.step_until(t_switch)
        if not sim.trace_finished:
            view = sim.cp.planner_view(sim.now)
            prefill, decode = view.split()
            for m in candidate_split(prefill, decode, p, view)[2]:
                held[m.node_id] = sim.cp.node_blocks(m.node_id)
                sim.cp.request_switch(m.node_id, m.to_phase, sim.now, trigger="planner", mode=mode)
    sim.step_until(cfg.duration_s)
    if switch is not None:
        sim.out.flush()
        rows = {r["node_id"]: r for r in switches.rows}
        pending = [n for n in held if n not in rows]  # still switching when the run ended
        drops_kv = switch[2] in ("relaunch", "strand")
        cost = {
            # a lower bound when a switch was still under way at the end of the run
            "switch_time_s": max(
                [r["t_done"] - r["t_decided"] for r in rows.values()]
                + [sim.now - switch[0] for _ in pending],
                default=0.0,
            ),
            "finished": float(not pending),
            "drained": float(sum(r["drained"] for r in rows.values())),
            "lost_kv_blocks": float(
                sum(r["lost_kv_blocks"] or 0 for r in rows.values())
                + sum(held[n] for n in pending if drops_kv)
            ),
        }
    fin = [r for r in sim.requests if r.t_done is not None and r.t_first_token is not None]
    timings = Timings(
        np.array([r.t_arrival for r in fin], dtype=float),
        np.array([r.t_out for r in fin], dtype=float),
        np.array([r.t_first_token for r in fin], dtype=float),
        np.array([r.t_done for r in fin], dtype=float),
    )
    return timings, len(held), cost


class _SwitchRows:
    """A telemetry sink keeping only the `phase_switches` rows (the switch's cost)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        if table == "phase_switches":
            keys = list(columns)
            self.rows += [
                dict(zip(keys, v, strict=True)) for v in zip(*columns.values(), strict=True)
            ]


def _values(t: Timings) -> dict[str, float]:
    """The metrics of one replay (toolkit.twin.metrics definitions)."""
    if len(t.t_done) == 0:
        return {k: float("nan") for k in METRICS}
    vals = metric_values(t, np.arange(len(t.t_done))[None, :])
    return {k: vals[k][0] for k in METRICS}


def _estimates(
    runs: list[dict[str, float]], twin: Mapping[str, tuple[float, float]]
) -> dict[str, Estimate]:
    out = {}
    for k in METRICS:
        v = np.array([r[k] for r in runs], dtype=float)
        mean = float(np.mean(v))
        if len(v) > 1:
            half = float(stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / np.sqrt(len(v)))
        else:
            half = 0.0
        lo, hi = max(mean - half, 0.0), mean + half
        if k in twin:
            e_lo, e_hi = twin[k]
            lo = lo / (1.0 + e_hi) if np.isfinite(e_hi) else 0.0
            hi = hi / (1.0 + e_lo) if e_lo > -1.0 else float("inf")
        out[k] = Estimate(mean, (lo, hi), tuple(float(x) for x in v))
    return out


def twin_bounds(rec: RecordedRun) -> dict[str, tuple[float, float]]:
    """Per metric the twin's interval of sim / real - 1 (module docstring); {} if none."""
    if rec.twin_interval:
        return dict(rec.twin_interval)
    return {k: (-abs(e), abs(e)) for k, e in rec.twin_error.items() if np.isfinite(e)}


def _switch_cost(
    runs: list[tuple[Timings, int, dict[str, float]]] | None,
    current: tuple[int, int] | None,
    mode: SwitchMode,
    t_switch: float,
    twin: Mapping[str, tuple[float, float]],
) -> SwitchCost | None:
    if not runs or current is None:
        return None
    return SwitchCost(
        split_name(*current),
        mode,
        max(m for _, m, _ in runs),
        t_switch,
        float(np.mean([c.get("switch_time_s", 0.0) for _, _, c in runs])),
        all(c.get("finished", 1.0) for _, _, c in runs),
        float(np.mean([c.get("drained", 0.0) for _, _, c in runs])),
        float(np.mean([c.get("lost_kv_blocks", 0.0) for _, _, c in runs])),
        _estimates([_values(t) for t, _, _ in runs], twin),
    )


def _recorded(rec: RecordedRun) -> dict[str, float]:
    """The real run's metrics (its finished requests)."""
    return {} if rec.real is None else _values(rec.real)
