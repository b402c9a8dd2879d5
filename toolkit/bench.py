"""`pdlab bench`: benchmark figures as one JSON object (SPEC §8).

Each package contributes a `run(quick: bool) -> dict[str, float]` function; this module
only collects them. Figures are ratios or per-operation numbers; no test asserts on them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

# Suite name -> "module:function". Each suite returns a flat dict of figures.
SUITES: dict[str, str] = {}
SUITES["telemetry"] = "telemetry.bench:run"
SUITES["fit"] = "toolkit.fit.bench:run"
SUITES["control_plane"] = "cluster.control.bench:run"
SUITES["simulator"] = "cluster.sim.bench:run"
SUITES["plots"] = "toolkit.plots.bench:run"
SUITES["engine"] = "cluster.engines.torch.bench:run"


def register_suite(name: str, target: str) -> None:
    if name in SUITES:
        raise ValueError(f"bench suite {name!r} is already registered")
    SUITES[name] = target


def _load(target: str) -> Callable[[bool], dict[str, Any]]:
    module, _, func = target.partition(":")
    fn: Callable[[bool], dict[str, Any]] = getattr(importlib.import_module(module), func)
    return fn


def run_benchmarks(suites: Iterable[str] | None = None, quick: bool = False) -> dict[str, Any]:
    names = list(SUITES) if suites is None else list(suites)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"unknown bench suite(s) {unknown}; choose from: {', '.join(SUITES)}")
    out: dict[str, Any] = {}
    for name in names:
        out.update(_load(SUITES[name])(quick))
    return out
