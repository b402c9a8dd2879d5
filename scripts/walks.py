"""Count the file visits of two walks through pdlab (issue 25): how often a reader follows
the code from one file into another and back.

- `request`: one simulated request from its release (`ProgramOrchestrator._release`) to its
  completion (`ProgramOrchestrator.complete` returning), on a small PD cluster with a
  retention policy (ttl) so every PCB event of a call happens. The request is the first one
  (turn >= 1) whose whole life overlaps no other call's, so every event in between is its.
- `fit`: `pdlab fit DB --form auto --node 0` on a short simulated run, from the CLI
  function to `models/` and back.

A `sys.setprofile` hook follows the innermost frame of our packages (models, telemetry,
cluster, toolkit; other code is transparent): each time that frame's file changes, the walk
enters a file. Printed per walk: entries (file changes), re-entries (entries into a file
already visited), the files by entries, and the crossings of the pairs named with --pair
(planes.py <-> pcb.py for `request`, toolkit <-> models for `fit`); for `fit` also the
distinct (toolkit function -> models function) call edges.

    python scripts/walks.py request
    python scripts/walks.py fit --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "telemetry", "cluster", "toolkit")
sys.path.insert(0, str(ROOT))


def _ours(path: str) -> str | None:
    """The path relative to the repository root when the file is one of our packages."""
    try:
        rel = Path(path).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in PACKAGES else None


class Walk:
    """The sequence of our files the innermost frame of ours passes through, and the calls
    that cross from one of our files into another (caller function -> callee function)."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self.calls: list[tuple[str, str, str, str]] = []  # caller file, fn, callee file, fn
        self.on = False
        self._cache: dict[str, str | None] = {}

    def _file(self, frame: FrameType | None) -> tuple[str | None, FrameType | None]:
        while frame is not None:
            name = frame.f_code.co_filename
            rel = self._cache.get(name, "?")
            if rel == "?":
                rel = self._cache[name] = _ours(name)
            if rel is not None:
                return rel, frame
            frame = frame.f_back
        return None, None

    def _visit(self, rel: str | None) -> None:
        if rel is not None and (not self.files or self.files[-1] != rel):
            self.files.append(rel)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on:
            return
        if event == "call":
            rel, _ = self._file(frame)
            if rel is not None and rel == _ours(frame.f_code.co_filename):
                caller, cframe = self._file(frame.f_back)
                if caller is not None and cframe is not None and caller != rel:
                    self.calls.append(
                        (caller, cframe.f_code.co_name, rel, frame.f_code.co_qualname)
                    )
            self._visit(rel)
        elif event == "return":
            self._visit(self._file(frame.f_back)[0])

    def summary(self, pairs: list[tuple[str, str]], scope: tuple[str, ...] = ()) -> dict[str, Any]:
        """Counts over the walk; with `scope`, files outside those folders are transparent."""
        files = [f for f in self.files if not scope or f.startswith(scope)]
        files = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
        seen: set[str] = set()
        reentries = 0
        for f in files:
            reentries += f in seen
            seen.add(f)
        crossings = {}
        for a, b in pairs:
            crossings[f"{a} <-> {b}"] = sum(
                1
                for x, y in itertools.pairwise(files)
                if (x.startswith(a) and y.startswith(b)) or (x.startswith(b) and y.startswith(a))
            )
        return {
            "entries": max(len(files) - 1, 0),
            "reentries": reentries,
            "files": len(seen),
            "by_file": dict(Counter(files).most_common()),
            "crossings": crossings,
            "sequence": files,
        }


def _traced(walk: Walk, fn: Callable[[], Any]) -> Any:
    sys.setprofile(walk.hook)
    try:
        return fn()
    finally:
        sys.setprofile(None)


def request_walk() -> dict[str, Any]:
    """The walk of one simulated request from release to completion (module docstring)."""
    from cluster.sim.config import SimConfig
    from cluster.sim.orchestrator import ProgramOrchestrator
    from cluster.sim.simulator import Simulator

    cfg = SimConfig(
        workload="cc",
        nodes=2,
        split="1P1D",
        agents=1,
        duration_s=900.0,
        warmup_s=0.0,
        planner="static",
        planner_tick_s=0.0,
        retention="ttl",
        seed=0,
    )
    probe = Simulator(cfg)
    probe.run()
    spans = sorted(
        (r.t_release, r.t_done, r.request_id, r.turn_index)
        for r in probe.requests
        if r.t_done is not None and r.t_release is not None
    )
    target = None
    for k, (t0, t1, rid, turn) in enumerate(spans):
        others = spans[:k] + spans[k + 1 :]
        if turn >= 1 and all(b < t0 or a > t1 for a, b, _, _ in others):
            target = rid
            break
    if target is None:
        raise SystemExit("no request runs alone in this configuration")

    walk = Walk()
    release, complete = ProgramOrchestrator._release, ProgramOrchestrator.complete

    def traced_release(self: Any, run: Any, i: int, arrival: float | None) -> None:
        mine = f"{run.program.program_id}/{i}" == target
        walk.on = walk.on or mine
        release(self, run, i, arrival)

    def traced_complete(self: Any, req: Any) -> None:
        complete(self, req)
        if req.request_id == target:
            walk.on = False

    ProgramOrchestrator._release = traced_release  # type: ignore[method-assign]
    ProgramOrchestrator.complete = traced_complete  # type: ignore[method-assign]
    try:
        sim = Simulator(cfg)  # after the patch: the engine binds `complete` when built
        sim.start()
        _traced(walk, lambda: sim.step_until(cfg.duration_s))
    finally:
        ProgramOrchestrator._release = release  # type: ignore[method-assign]
        ProgramOrchestrator.complete = complete  # type: ignore[method-assign]
    walk.files = [f for f in walk.files if f != "scripts/walks.py"]
    pair = [("cluster/sim/planes.py", "cluster/policies/pcb.py")]
    out = walk.summary(pair, ("cluster/sim/", "cluster/policies/"))
    every = walk.summary(pair)
    out["all_files"] = {k: every[k] for k in ("entries", "reentries", "files", "crossings")}
    out["request"] = target
    return out


def fit_walk() -> dict[str, Any]:
    """The walk of `pdlab fit DB --form auto --node 0` from the CLI (module docstring)."""
    import contextlib
    import io

    from cluster.sim.config import SimConfig
    from cluster.sim.runner import simulate
    from toolkit.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fit.duckdb"
        cfg = SimConfig(
            workload="cc", nodes=2, split="1P1D", agents=8, duration_s=300.0, warmup_s=0.0
        )
        simulate(cfg, db, run_id="walk")
        args = ["fit", str(db), "--run", "walk", "--node", "0", "--form", "auto"]
        args += ["--bootstrap", "50", "--json", "--no-write"]
        walk = Walk()
        walk.on = True
        with contextlib.redirect_stdout(io.StringIO()):
            _traced(walk, lambda: app(args, standalone_mode=False))
    out = walk.summary([("toolkit/", "models/")])
    crossing = [(a, fa, b, fb) for a, fa, b, fb in walk.calls if a[:6] != b[:6]]
    edges = sorted(
        {
            f"{a}:{fa} -> {b}:{fb}"
            for a, fa, b, fb in crossing
            if {a[:6], b[:6]} == {"toolki", "models"}
        }
    )
    out["toolkit_to_models_edges"] = edges
    out["toolkit_to_models_calls"] = sum(
        1 for a, _, b, _ in crossing if a.startswith("toolkit/") and b.startswith("models/")
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("walk", choices=("request", "fit"))
    ap.add_argument("--json", action="store_true", help="print the whole walk as JSON")
    args = ap.parse_args()
    out = request_walk() if args.walk == "request" else fit_walk()
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for key, value in out.items():
        if key != "sequence":
            print(f"{key}: {value}")
    print("sequence:", " > ".join(Path(f).name for f in out["sequence"]))


if __name__ == "__main__":
    main()
