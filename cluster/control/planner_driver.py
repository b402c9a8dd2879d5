"""When the planner evaluates and what it last said (paper 000 Alg. E.3 outer loop; SPEC §4).

`PlannerDriver` holds the planner in use, its mode (auto: apply its switches; advise:
evaluate and show; off), the time of the next evaluation and the last decision. Changing
the window keeps the next evaluation at most one new window away. `planner_view` builds what
a planner may read from the control plane's state; `decision_rows` is the `planner_windows`
telemetry of one evaluation (every candidate with its mean gain, std and qualified flag).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from cluster.control.bounds import check_window
from cluster.control.planning import Planner, PlannerDecision, PlannerView, WindowStats
from cluster.control.state import ClusterState
from cluster.core import ConfigError

PlannerMode = Literal["auto", "advise", "off"]
PLANNER_MODES: tuple[PlannerMode, ...] = ("auto", "advise", "off")


class PlannerSettings(NamedTuple):
    """What the planner is and when it runs (the REST API's GET /v1/planner)."""

    name: str
    mode: PlannerMode
    window_s: float | None  # None: the planner has no window (not 'gain')
    slices: int | None
    interval_s: float
    next_evaluation_t: float | None  # None while the cluster runs collocated
    collocated: bool
    last_decision: PlannerDecision | None
    modes: tuple[str, ...] = PLANNER_MODES  # the modes it may be set to


def check_mode(mode: str, allowed: tuple[str, ...] = PLANNER_MODES) -> PlannerMode:
    if mode not in allowed:
        why = "" if allowed == PLANNER_MODES else " here (the planner runs in shadow mode)"
        raise ConfigError(f"planner mode must be one of {', '.join(allowed)}{why}, got {mode!r}")
    return mode  # type: ignore[return-value]


class PlannerDriver:
    """See module docstring. Mutated only by the `ControlPlane` that owns it."""

    def __init__(
        self, planner: Planner, mode: str, allowed: tuple[str, ...] = PLANNER_MODES
    ) -> None:
        self.planner = planner
        self.allowed = allowed
        self.mode: PlannerMode = check_mode(mode, allowed)
        self.next_t = 0.0
        self.last_decision: PlannerDecision | None = None

    def due(self, now: float, collocated: bool) -> bool:
        return self.mode != "off" and not collocated and now >= self.next_t

    def schedule_next(self, now: float) -> None:
        self.next_t = now + self.planner.interval_s

    def configure(
        self,
        now: float,
        mode: str | None = None,
        window_s: float | None = None,
        slices: int | None = None,
    ) -> None:
        """Validate every change first, then apply them all (nothing changes on an error)."""
        pl = self.planner
        new_mode = check_mode(mode, self.allowed) if mode is not None else None
        if (window_s is not None or slices is not None) and not hasattr(pl, "window_s"):
            raise ConfigError(
                f"planner {pl.name!r} has no window; window_s and slices apply to the 'gain' planner"
            )
        if window_s is not None or slices is not None:
            check_window(
                pl.window_s if window_s is None else window_s,  # type: ignore[attr-defined]
                pl.slices if slices is None else slices,  # type: ignore[attr-defined]
            )
        if window_s is not None:
            pl.window_s = window_s  # type: ignore[attr-defined]
            # A shorter window takes effect now: the next evaluation is at most one window away.
            self.next_t = min(self.next_t, now + window_s)
        if slices is not None:
            pl.slices = slices  # type: ignore[attr-defined]
        if new_mode is not None:
            self.mode = new_mode

    def evaluate(self, view: PlannerView) -> PlannerDecision | None:
        """Evaluate without applying (advise mode, POST /v1/planner/apply, notebooks)."""
        evaluate = getattr(self.planner, "evaluate", None)
        decision = evaluate(view) if evaluate is not None else self.planner.step(view)
        if decision is not None:
            self.last_decision = decision
        return decision

    def step(self, view: PlannerView) -> PlannerDecision | None:
        decision = self.planner.step(view)
        if decision is not None:
            self.last_decision = decision
        return decision

    def settings(self, collocated: bool) -> PlannerSettings:
        pl = self.planner
        return PlannerSettings(
            name=pl.name,
            mode=self.mode,
            window_s=getattr(pl, "window_s", None),
            slices=getattr(pl, "slices", None),
            interval_s=pl.interval_s,
            next_evaluation_t=None if collocated else self.next_t,
            collocated=collocated,
            last_decision=self.last_decision,
            modes=self.allowed,
        )


def planner_view(
    state: ClusterState,
    stats: WindowStats,
    now: float,
    *,
    draining: bool,
    last_switch_t: float | None,
) -> PlannerView:
    """What a planner may read at `now` (queues and KV use from the nodes' last reports)."""
    queue: dict[int, int] = {}
    running: dict[int, int] = {}
    kv: dict[int, float] = {}
    for n, r in state.reports.items():
        queue[n] = len(r.queued)
        running[n] = state.decode_load.get(n, 0)
        kv[n] = r.kv_gpu_used / r.kv_gpu_capacity if r.kv_gpu_capacity else 0.0
    full = {n: [q.t_uc + q.t_c for q in r.queued] for n, r in state.reports.items()}
    return PlannerView(
        now=now,
        phases=dict(state.phases),
        models=dict(state.models),
        stats=stats,
        draining=draining,
        last_switch_t=last_switch_t,
        unavailable=frozenset(state.unavailable),
        prefill_queue=queue,
        decode_running=running,
        kv_utilization=kv,
        queued_full_input=full,
    )


def decision_rows(d: PlannerDecision) -> Mapping[str, list[Any]] | None:
    """The `planner_windows` rows of one evaluation (None when it has no candidates)."""
    if not d.candidates:
        return None
    n = len(d.candidates)
    return {
        "t": [d.t] * n,
        "current_prefill": [d.current_prefill] * n,
        "candidate_prefill": [c.prefill_count for c in d.candidates],
        "mean_gain": [c.mean_gain for c in d.candidates],
        "std_gain": [c.std_gain for c in d.candidates],
        "slices": [c.slices for c in d.candidates],
        "qualified": [c.qualified for c in d.candidates],
        "chosen": [c.prefill_count == d.chosen_prefill for c in d.candidates],
    }
