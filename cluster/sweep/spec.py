"""What a sweep varies: `SweepSpec`, its validation and its expansion into points.

Axis names are SimConfig fields or `<dict field>.<key>` for the dict-valued fields
(`retention_params.tau_s`, `workload_params.run`). `expand` turns a spec into the
deterministic list of `SweepPoint`s (grid product x random draws x seeds), each carrying
the SimConfig fields of its run. A point that sets `duration_s`, or replays a trace at its
arrival times, but no `warmup_s` gets the warmup `default_warmup_s` (a sixth of the run or
of the trace's span, at most SimConfig's 600 s), so a short sweep does not trip over a
warmup longer than the run. Policies are given as names,
file paths or module paths, so a worker on another machine can load them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, NamedTuple

import numpy as np

from cluster import size_limits
from cluster.core import ConfigError
from cluster.sim.simulator import SimConfig
from cluster.workloads import trace_last_arrival_s

_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}
_DICT_FIELDS = {"workload_params", "retention_params", "scheduling_params", "dispatch_params"}


@dataclasses.dataclass(frozen=True, slots=True)
class SweepSpec:
    """What to sweep: see the module docstring. `random` maps an axis to a distribution:
    ("uniform", lo, hi), ("loguniform", lo, hi), ("int", lo, hi) inclusive, or
    ("choice", [values]); `samples` draws per grid point (0: grid only)."""

    base: dict[str, Any]
    grid: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    random: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    samples: int = 0
    seeds: tuple[int, ...] = (0,)
    seed: int = 0  # of the random draws
    name: str = "sweep"

    def validate(self) -> None:
        for axis in (*self.base, *self.grid, *self.random):
            _check_axis(axis)
            if axis == "seed":
                raise ConfigError(
                    "replicate over seeds with `seeds`, not a 'seed' axis or base value"
                )
        for axis, values in self.grid.items():
            if not isinstance(values, list | tuple) or not values:
                raise ConfigError(f"grid axis {axis!r} needs a non-empty list of values")
        if self.random and self.samples < 1:
            raise ConfigError("random axes need samples >= 1")
        if self.samples < 0:
            raise ConfigError(f"samples must be >= 0, got {self.samples}")
        for axis, dist in self.random.items():
            _check_dist(axis, dist)
        if not self.seeds:
            raise ConfigError("seeds must name at least one seed")
        self.num_runs()

    def num_runs(self) -> int:
        """Grid points x draws x seeds, checked against its ceiling (cluster.size_limits)
        before `expand` builds the list."""
        runs = math.prod(len(v) for v in self.grid.values()) * max(self.samples, 1)
        runs *= len(self.seeds)
        size_limits.SWEEP_RUNS.check("the sweep's runs (grid points x samples x seeds)", runs)
        return runs


class SweepPoint(NamedTuple):
    point: int  # index of the parameter combination
    seed: int
    params: dict[str, Any]  # the varied values (axis -> value)
    config: dict[str, Any]  # every SimConfig field that differs from the defaults


def _check_axis(axis: str) -> None:
    head, _, key = axis.partition(".")
    if head not in _FIELDS or (key and head not in _DICT_FIELDS) or (not key and "." in axis):
        allowed = (
            ", ".join(sorted(_FIELDS))
            + "; or <dict field>.<key> for "
            + ", ".join(sorted(_DICT_FIELDS))
        )
        raise ConfigError(f"unknown sweep axis {axis!r}; allowed: {allowed}")


def _check_dist(axis: str, dist: Any) -> None:
    ok = (
        isinstance(dist, list | tuple)
        and dist
        and dist[0] in ("uniform", "loguniform", "int", "choice")
    )
    if ok and dist[0] == "choice":
        ok = len(dist) == 2 and isinstance(dist[1], list | tuple) and len(dist[1]) > 0
    elif ok:
        ok = (
            len(dist) == 3
            and all(isinstance(x, int | float) for x in dist[1:])
            and dist[1] <= dist[2]
        )
        ok = ok and (dist[0] != "loguniform" or dist[1] > 0)
    if not ok:
        raise ConfigError(
            f"random axis {axis!r}: {dist!r} is not a distribution; use ('uniform', lo, hi), "
            "('loguniform', lo, hi), ('int', lo, hi) or ('choice', [values])"
        )


def _draw(rng: np.random.Generator, dist: tuple[Any, ...]) -> Any:
    kind = dist[0]
    if kind == "uniform":
        return float(rng.uniform(dist[1], dist[2]))
    if kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(dist[1]), math.log(dist[2]))))
    if kind == "int":
        return int(rng.integers(dist[1], dist[2] + 1))
    values = list(dist[1])
    return values[int(rng.integers(len(values)))]


def expand(spec: SweepSpec) -> list[SweepPoint]:
    """The sweep's points in a deterministic order (grid product x draws x seeds)."""
    spec.validate()
    axes = list(spec.grid)
    combos = [dict(zip(axes, vals, strict=True)) for vals in itertools.product(*spec.grid.values())]
    rng = np.random.default_rng(spec.seed)
    params_list: list[dict[str, Any]] = []
    for combo in combos:
        if spec.random:
            for _ in range(spec.samples):
                params_list.append(combo | {a: _draw(rng, d) for a, d in spec.random.items()})
        else:
            params_list.append(combo)
    points = []
    for i, params in enumerate(params_list):
        for seed in spec.seeds:
            cfg = _with_warmup(_apply(dict(spec.base), params)) | {"seed": int(seed)}
            points.append(SweepPoint(i, int(seed), params, cfg))
    return points


def point_of(index: int, cfg: SimConfig, params: dict[str, Any]) -> SweepPoint:
    """A point that runs `cfg` as it is (its seed included), named by `params`: for
    comparisons whose variants change different fields (notebook 05's policies)."""
    default = SimConfig()
    fields = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if getattr(cfg, f.name) != getattr(default, f.name)
    }
    return SweepPoint(index, int(cfg.seed), params, fields | {"seed": int(cfg.seed)})


def _apply(cfg: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    for axis, value in params.items():
        head, _, key = axis.partition(".")
        if key:
            cfg[head] = dict(cfg.get(head) or {}) | {key: value}
        else:
            cfg[head] = value
    return cfg


MAX_DEFAULT_WARMUP_S = SimConfig().warmup_s  # 600 s, the default for its 3,600 s run


def default_warmup_s(duration_s: float, last_arrival_s: float | None = None) -> float:
    """The warmup of a run whose warmup is not given: min(600 s, span / 6), the span being
    the duration or, for a trace replayed at its arrival times, its last arrival if earlier
    (the run ends soon after it).

    SimConfig's defaults are a 3,600 s run with a 600 s warmup; a shorter run keeps that
    proportion instead of failing on a warmup as long as the run itself."""
    span = duration_s if last_arrival_s is None else min(duration_s, last_arrival_s)
    return min(MAX_DEFAULT_WARMUP_S, span / 6.0)


def replay_end_s(cfg: dict[str, Any]) -> float | None:
    """The last arrival of the trace that the SimConfig fields `cfg` replay at its arrival
    times; None for generators, traces without times, cycled traces and unreadable ones
    (the run's own checks report those)."""
    if cfg.get("trace_cycle"):
        return None
    workload = cfg.get("workload", SimConfig().workload)
    params = cfg.get("workload_params") or {}
    if not isinstance(workload, str) or not isinstance(params, dict):
        return None
    try:
        return trace_last_arrival_s(workload, **params)
    except (ConfigError, OSError):
        return None


def _with_warmup(cfg: dict[str, Any]) -> dict[str, Any]:
    if "warmup_s" in cfg:
        return cfg
    end = replay_end_s(cfg)
    duration = cfg.get("duration_s", SimConfig().duration_s if end is not None else None)
    if isinstance(duration, int | float) and duration > 0:
        cfg["warmup_s"] = default_warmup_s(float(duration), end)
    return cfg
