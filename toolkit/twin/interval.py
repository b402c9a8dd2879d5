"""The twin's 95% intervals: request resampling combined with the model's own error.

Sources, each a (down, up) spread of log(sim / real) per metric, combined in quadrature
(toolkit.twin.metrics.combined_interval):
- `requests`: the paired bootstrap over requests (toolkit.twin.metrics.compare);
- `profile`: the profile's held-out error (cluster.hardware.profile_error): the replay
  repeated on `profile_replays` draws of the operator grid under its measured residuals;
  +-1.96 standard deviations of log(sim) over the draws. Instances priced by one profile
  share each draw (one measurement, one error). These draws are the replay's only random
  element, so this is also its seed spread (the replay itself is deterministic);
- each ranged parameter (toolkit.twin.parameters: estimated KV capacity, the link or the
  collective cost, expert-load skew, CPU time per iteration, CUDA graphs): the replay at
  the parameter's low and at its high end; the spread is how far those move log(sim). A
  variant whose KV cannot hold a request (or no KV at all) makes that side unbounded
  ("not known"). KV variants are skipped, with no spread, when the baseline replay never
  used as many blocks as the low end holds (then neither end changes a step);
- exact parameters (recorded, described, given) add nothing of their own; a parameter with
  an unbounded end (an MoE block composed from operators timed apart, `moe_block`) makes
  every metric's interval "not known" on both sides, with no replay.
A replay of several instances (a cluster: toolkit.twin.lss) lists each instance's
parameters; one that every instance has alike is varied on all of them together, one that
differs is varied per instance (`kv_blocks[1]`).

Metrics a runner returns as arrays (per-tick series) get per-element spreads in their own
units instead (`IntervalSource.bands`): how far each tick of the twin's series moves, the
profile draws' 1.96 standard deviations and each parameter end's change; combined in
quadrature they give the twin's per-tick 95% band (toolkit.validate.cluster).
Replays: 1 + profile_replays + 2 per ranged parameter that can move the replay (about 7 on
a TP 1 run with recorded KV, 11 with TP collectives).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profile_error import GridResiduals, grid_residuals, perturbed
from cluster.sim.engine_model import EngineReplay, ReplayRequest, replay
from toolkit.twin.metrics import Timings, TwinMetric, combined_interval, point_values
from toolkit.twin.parameters import ReplayParameter, ReplaySetup, vary

PROFILE_REPLAYS = 4
Z95 = 1.959964
Value = float | np.ndarray
# A variant: (instance index, its baseline setup) -> the setup to replay instead.
Transform = Callable[[int, ReplaySetup], ReplaySetup]
Runner = Callable[[Transform], dict[str, Value] | None]
Band = tuple[np.ndarray, np.ndarray]


class IntervalSource(NamedTuple):
    """One source of the interval and its spread per metric (module docstring)."""

    name: str
    kind: str  # resampling | held-out residuals | recorded | assumed | estimated | ...
    how: str  # what was varied
    replays: int
    spread: dict[str, tuple[float, float]]  # metric -> (down, up) of log(sim / real)
    bands: dict[str, Band] | None = None  # series -> per-tick (down, up), its units

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


def engine_runner(
    reqs: Sequence[ReplayRequest],
    setup: ReplaySetup,
    values: Callable[[Timings], dict[str, Value]] = point_values,  # type: ignore[assignment]
) -> Runner:
    """The runner of one run's replay on the engine model: `values` of the replayed times;
    None when a variant's KV cannot hold a request."""

    def run(change: Transform) -> dict[str, Value] | None:
        s = change(0, setup)
        try:
            engines = replay(reqs, s.engine, s.kv_blocks, s.pricer, s.overhead)
        except ConfigError:
            return None
        return values(sim_timings(reqs, engines))

    return run


def _log_change(variant_sim: float, base_sim: float) -> float:
    if not (base_sim > 0 and variant_sim > 0):
        return float("nan")
    return math.log(variant_sim / base_sim)


def _aligned(x: np.ndarray, n: int) -> np.ndarray:
    return np.pad(x, (0, max(0, n - len(x))))[:n]


def _spreads(
    base: dict[str, Value], ends: list[dict[str, Value] | None]
) -> tuple[dict[str, tuple[float, float]], dict[str, Band]]:
    """(down, up) per scalar metric (log) and per series (per tick) over variant `ends`."""
    spread: dict[str, tuple[float, float]] = {}
    bands: dict[str, Band] = {}
    for k, b in base.items():
        if isinstance(b, np.ndarray):
            if any(e is None for e in ends):
                inf = np.full(len(b), np.inf)
                bands[k] = (inf, inf)
                continue
            d = [_aligned(np.asarray(e[k]), len(b)) - b for e in ends if e is not None]
            z = np.zeros(len(b))
            bands[k] = (np.maximum.reduce([z, *(-x for x in d)]), np.maximum.reduce([z, *d]))
            continue
        if any(e is None for e in ends):
            spread[k] = (math.inf, math.inf)
            continue
        logs = [
            c for e in ends if e is not None and math.isfinite(c := _log_change(float(e[k]), b))
        ]
        spread[k] = (max([0.0, *(-c for c in logs)]), max([0.0, *logs]))
    return spread, bands


def _profile_source(run: Runner, base: dict[str, Value], draws: int, seed: int) -> IntervalSource:
    rng = np.random.default_rng(seed)
    residuals: dict[int, GridResiduals] = {}
    rows = []
    for _ in range(draws):
        drawn: dict[int, OperatorTables] = {}  # one draw per measured grid, shared

        def draw(_i: int, s: ReplaySetup, drawn: dict[int, OperatorTables] = drawn) -> ReplaySetup:
            t = s.pricer.tables
            if id(t) not in drawn:
                if id(t) not in residuals:
                    residuals[id(t)] = grid_residuals(t)
                drawn[id(t)] = perturbed(t, residuals[id(t)], rng)
            p = s.pricer
            return s._replace(
                pricer=IterationPricer(drawn[id(t)], p.shape, p.parallel, p.memory_gbps)
            )

        got = run(draw)
        if got is not None:
            rows.append(got)
    spread: dict[str, tuple[float, float]] = {}
    bands: dict[str, Band] = {}
    for k, b in base.items():
        if isinstance(b, np.ndarray):
            m = np.array([_aligned(np.asarray(r[k]), len(b)) for r in rows])
            half = Z95 * m.std(axis=0, ddof=1) if len(rows) >= 2 else np.full(len(b), np.inf)
            bands[k] = (half, half)
            continue
        logs = np.array([_log_change(float(r[k]), b) for r in rows])
        logs = logs[np.isfinite(logs)]
        h = Z95 * float(np.std(logs, ddof=1)) if logs.size >= 2 else math.inf
        spread[k] = (h, h)
    how = f"{draws} replays on draws of the operator grid's measurement error"
    return IntervalSource("profile", "held-out residuals", how, draws, spread, bands)


def _merged(
    parameters: Sequence[Sequence[ReplayParameter]],
) -> list[tuple[str, ReplayParameter, tuple[int, ...]]]:
    """(source name, parameter, instances it applies to): alike on every instance -> once."""
    out = []
    names = dict.fromkeys(p.name for ps in parameters for p in ps if p.ranged)
    for name in names:
        per = [(i, p) for i, ps in enumerate(parameters) for p in ps if p.name == name]
        if len(per) == len(parameters) and len({p for _, p in per}) == 1:
            out.append((name, per[0][1], tuple(i for i, _ in per)))
        else:
            out += [(f"{name}[{i}]", p, (i,)) for i, p in per if p.ranged]
    return out


def interval_sources(
    base: dict[str, Value],
    parameters: Sequence[ReplayParameter] | Sequence[Sequence[ReplayParameter]],
    runner: Runner,
    *,
    requests: dict[str, tuple[float, float]] | None = None,
    peak_blocks: Sequence[int] = (),
    profile_replays: int = PROFILE_REPLAYS,
    seed: int = 0,
) -> list[IntervalSource]:
    """Every source's spread per metric of `base` (the baseline replay's values, the keys
    `runner` returns; module docstring). `parameters`: the replay's, or one list per
    instance of a cluster; `requests`: the bootstrap's (down, up) per metric, if any;
    `peak_blocks`: the most KV blocks each instance's baseline used."""
    per = (
        [list(parameters)]  # type: ignore[list-item]
        if not parameters or isinstance(parameters[0], ReplayParameter)
        else [list(ps) for ps in parameters]  # type: ignore[union-attr]
    )
    out = []
    if requests:
        out.append(
            IntervalSource(
                "requests", "resampling", "paired bootstrap over requests", 0, dict(requests)
            )
        )
    if profile_replays >= 2:
        out.append(_profile_source(runner, base, profile_replays, seed))
    peaks = list(peak_blocks) or [math.inf] * len(per)  # unknown: never skip
    for name, p, where in _merged(per):
        assert p.low is not None and p.high is not None
        how = f"{p.name} at {_fmt(p.low)} and {_fmt(p.high)} (replayed: {_fmt(p.value)})"
        if p.name == "kv_blocks" and p.low >= 1 and all(p.low >= peaks[i] for i in where):
            # never full: neither end changes a step
            zero = _spreads(base, [])
            how += f"; not replayed: the replay used at most {max(peaks[i] for i in where)} blocks"
            out.append(IntervalSource(name, p.source, how, 0, *zero))
            continue
        if not (math.isfinite(p.low) and math.isfinite(p.high)):
            # an end nothing bounds: the interval does not know how far the metric may go
            how += "; not replayed: no measured bound"
            out.append(IntervalSource(name, p.source, how, 0, *_spreads(base, [None])))
            continue
        ends: list[dict[str, Value] | None] = []
        for v in (p.low, p.high):
            if v == p.value:
                continue
            if p.name == "kv_blocks" and v < 1:
                ends.append(None)
                continue

            def change(
                i: int,
                s: ReplaySetup,
                v: float = v,
                p: ReplayParameter = p,
                at: tuple[int, ...] = where,
            ) -> ReplaySetup:
                return vary(s, p, v) if i in at else s

            ends.append(runner(change))
        out.append(IntervalSource(name, p.source, how, len(ends), *_spreads(base, ends)))
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


def band(
    base: np.ndarray, sources: Sequence[IntervalSource], key: str, extra: Sequence[Band] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """The twin's per-tick 95% band of series `key`: every source's per-tick spread (and
    `extra` ones) in quadrature around `base`."""
    parts = [s.bands[key] for s in sources if s.bands and key in s.bands] + list(extra)
    down = np.sqrt(sum((_aligned(d, len(base)) ** 2 for d, _ in parts), np.zeros(len(base))))
    up = np.sqrt(sum((_aligned(u, len(base)) ** 2 for _, u in parts), np.zeros(len(base))))
    return base - down, base + up


def sim_interval(m: TwinMetric) -> tuple[float, float]:
    """The twin's 95% prediction interval of the metric itself (seconds, requests/s)."""
    if not m.sources:
        return float("nan"), float("nan")
    down = math.sqrt(sum(d * d for d, _ in m.sources.values()))
    up = math.sqrt(sum(u * u for _, u in m.sources.values()))
    return m.sim * math.exp(-down), m.sim * math.exp(up)
