"""The twin's 95% intervals: request resampling combined with the model's own error.

Four kinds of source, each a (down, up) spread of log(sim / real) per metric, combined in
quadrature (toolkit.twin_metrics.combined_interval):
- `requests`: the paired bootstrap over requests (toolkit.twin_metrics.compare);
- `profile`: the profile's held-out error (cluster.hardware.profile_error): the replay
  repeated on `profile_replays` draws of the operator grid under its measured residuals;
  +-1.96 standard deviations of log(sim) over the draws. These draws are the replay's only
  random element, so this is also its seed spread (the replay itself is deterministic);
- each ranged parameter (toolkit.replay_parameters: estimated KV capacity, the collective
  cost model, CPU time per iteration, CUDA graphs, expert-load skew): the replay at the
  parameter's low and at its high end; the spread is how far those move log(sim). A
  variant whose KV cannot hold a request (or no KV at all) makes that side unbounded
  ("not known"). KV variants are skipped, with no spread, when the baseline replay never
  used as many blocks as the low end holds (then neither end changes a step);
- exact parameters (recorded) add nothing.
The sources are kept per metric (`IntervalSource.spread`), so the output shows what each
contributes. Replays: 1 + profile_replays + 2 per ranged parameter that can move the
replay (about 7 on a TP 1 run with recorded KV, 11 with TP collectives).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profile_error import grid_residuals, perturbed
from cluster.sim.engine_model import EngineReplay, ReplayRequest, replay
from toolkit.replay_parameters import ReplayParameter, ReplaySetup, variant
from toolkit.twin_metrics import (
    Timings,
    TwinMetric,
    combined_interval,
    point_values,
    request_spread,
)

PROFILE_REPLAYS = 4
Z95 = 1.959964
Runner = Callable[[ReplaySetup], dict[str, float] | None]


class IntervalSource(NamedTuple):
    """One source of the interval and its spread per metric (module docstring)."""

    name: str
    kind: str  # resampling | held-out residuals | recorded | described | assumed | estimated
    how: str  # what was varied
    replays: int
    spread: dict[str, tuple[float, float]]  # metric -> (down, up) of log(sim / real)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "how": self.how,
            "replays": self.replays,
            "spread": {k: [_finite(d), _finite(u)] for k, (d, u) in self.spread.items()},
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def sim_timings(reqs: Sequence[ReplayRequest], engines: list[EngineReplay]) -> Timings:
    """The replayed times of `reqs`, in their order."""
    by_id = {r.request_id: r for e in engines for r in e.requests}
    sim = [by_id[q.request_id] for q in reqs]
    return Timings(
        np.array([q.arrival_s for q in reqs]),
        np.array([q.output_tokens for q in reqs], dtype=float),
        np.array([r.first_token_s for r in sim], dtype=float),
        np.array([r.done_s for r in sim], dtype=float),
    )


def _sim_values(reqs: Sequence[ReplayRequest], engines: list[EngineReplay]) -> dict[str, float]:
    return point_values(sim_timings(reqs, engines))


def _run(reqs: Sequence[ReplayRequest], s: ReplaySetup) -> dict[str, float] | None:
    """Metrics of one variant replay; None when its KV cannot hold a request."""
    try:
        engines = replay(reqs, s.engine, s.kv_blocks, s.pricer, s.overhead)
    except ConfigError:
        return None
    return _sim_values(reqs, engines)


def _log_change(variant_sim: float, base_sim: float) -> float:
    if not (base_sim > 0 and variant_sim > 0):
        return float("nan")
    return math.log(variant_sim / base_sim)


def _parameter_spread(
    p: ReplayParameter,
    run: Runner,
    setup: ReplaySetup,
    base: dict[str, float],
    peak_blocks: int,
) -> tuple[dict[str, tuple[float, float]], int]:
    assert p.low is not None and p.high is not None
    if p.name == "kv_blocks" and p.low >= peak_blocks and p.low >= 1:
        return dict.fromkeys(base, (0.0, 0.0)), 0  # never full: neither end changes a step
    ends = []
    for v in (p.low, p.high):
        if v == p.value:
            continue
        ends.append(None if p.name == "kv_blocks" and v < 1 else run(variant(setup, p.name, v)))
    out = {}
    for k, b in base.items():
        if any(e is None for e in ends):
            out[k] = (math.inf, math.inf)
            continue
        logs = [c for e in ends if e is not None and math.isfinite(c := _log_change(e[k], b))]
        out[k] = (max([0.0, *(-c for c in logs)]), max([0.0, *logs]))
    return out, len(ends)


def _profile_spread(
    run: Runner,
    setup: ReplaySetup,
    base: dict[str, float],
    draws: int,
    seed: int,
) -> dict[str, tuple[float, float]]:
    pricer = setup.pricer
    residuals = grid_residuals(pricer.tables)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(draws):
        p = IterationPricer(perturbed(pricer.tables, residuals, rng), pricer.shape, pricer.parallel)
        got = run(setup._replace(pricer=p))
        if got is not None:
            rows.append(got)
    out = {}
    for k, b in base.items():
        logs = np.array([_log_change(r[k], b) for r in rows])
        logs = logs[np.isfinite(logs)]
        half = Z95 * float(np.std(logs, ddof=1)) if logs.size >= 2 else math.inf
        out[k] = (half, half)
    return out


def interval_sources(
    reqs: Sequence[ReplayRequest],
    setup: ReplaySetup,
    engines: list[EngineReplay],
    metrics: dict[str, TwinMetric],
    parameters: Sequence[ReplayParameter],
    *,
    profile_replays: int = PROFILE_REPLAYS,
    seed: int = 0,
    runner: Runner | None = None,
) -> list[IntervalSource]:
    """Every source's spread per metric (module docstring); `engines` is the baseline.

    `runner` replays one variant setup and returns its metrics (None: it cannot run, e.g.
    KV too small for a request); the default replays `reqs` on the engine model. Another
    replay (a PD split or several instances on the cluster simulator) passes its own and
    gets the same sources."""
    run: Runner = runner or (lambda s: _run(reqs, s))
    base = _sim_values(reqs, engines)
    base = {k: v for k, v in base.items() if k in metrics}
    out = [
        IntervalSource(
            "requests", "resampling", "paired bootstrap over requests", 0,
            {k: request_spread(metrics[k]) for k in base},
        )
    ]  # fmt: skip
    if profile_replays >= 2:
        out.append(
            IntervalSource(
                "profile", "held-out residuals",
                f"{profile_replays} replays on draws of the operator grid's measurement error",
                profile_replays, _profile_spread(run, setup, base, profile_replays, seed),
            )
        )  # fmt: skip
    peak = max((b for e in engines for *_, b in e.trace), default=0)
    for p in parameters:
        if not p.ranged:
            continue
        spread, n = _parameter_spread(p, run, setup, base, peak)
        how = f"{p.name} at {_fmt(p.low)} and {_fmt(p.high)} (replayed: {_fmt(p.value)})"
        if n == 0:
            how += f"; not replayed: the replay used at most {peak} blocks"
        out.append(IntervalSource(p.name, p.source, how, n, spread))
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def with_intervals(
    metrics: dict[str, TwinMetric], sources: Sequence[IntervalSource]
) -> dict[str, TwinMetric]:
    """The metrics with `ci95` the combined interval (the bootstrap's kept apart)."""
    out = {}
    for k, m in metrics.items():
        spreads = {s.name: s.spread[k] for s in sources if k in s.spread}
        if not spreads:
            out[k] = m
            continue
        ci = combined_interval(m.error, spreads)
        out[k] = m._replace(ci95=ci, ci95_requests=m.ci95, sources=spreads)
    return out


def sim_interval(m: TwinMetric) -> tuple[float, float]:
    """The twin's 95% prediction interval of the metric itself (seconds, requests/s)."""
    if not m.sources:
        return float("nan"), float("nan")
    down = math.sqrt(sum(d * d for d, _ in m.sources.values()))
    up = math.sqrt(sum(u * u for _, u in m.sources.values()))
    return m.sim * math.exp(-down), m.sim * math.exp(up)
