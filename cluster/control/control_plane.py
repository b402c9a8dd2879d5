"""The control plane: directory, branch counts, router, planner and phase switches in one place.

The same object drives the simulated cluster and live clusters (paper 000 Fig. 1, Alg. E.3):
engines feed it KV events and state reports; it routes each prefill request, binds the decode
node when prefill starts, keeps the branch counts, evaluates the planner once per window and
orchestrates phase switches (queued requests move to peers of the current phase, running ones
finish in place, then the node serves the new phase; its KV stays in the shared pool). It does
no I/O of its own: telemetry rows go to a `TelemetrySink`, engine actions to an
`EngineBackend`.

`ControlPlane` is a facade over the control plane's concerns, one module each: admission
and placement (`placement.py`), the engines' events and reports (`intake.py`), phase switches
and availability (`availability.py`) and the read accessors (`plane_reads.py`); this module
builds its parts (all private: `parts.py`) and holds its configuration and the planner. Its
state changes only through its methods, which keep the invariants together (an undone
placement leaves the router, the pending work and the decode binding at once; a node held out
of routing for several reasons returns when the last one ends); callers read it through the
accessors (`tests/cluster/control/test_api_boundary.py` checks this). Outside code imports
it, and everything else it needs of the control plane, from `cluster.control`.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.control.availability import Availability
from cluster.control.bounds import check_copy_price
from cluster.control.config import ControlPlaneConfig, make_planner
from cluster.control.engines import EngineBackend
from cluster.control.intake import EventIntake
from cluster.control.lock import ContendedRLock
from cluster.control.placement import Placement
from cluster.control.plane_reads import ControlPlaneReads
from cluster.control.planner_driver import (
    PlannerDriver,
    PlannerSettings,
    decision_rows,
    planner_view,
)
from cluster.control.planning import Planner, PlannerDecision, PlannerView, WindowStats
from cluster.control.routing import DECODE_BINDERS, ROUTERS, Router
from cluster.control.snapshots import RouterSettings
from cluster.control.state import ClusterState, ClusterView, PrefillPredictor, form_prefill_time
from cluster.control.switching import PendingSwitch, SwitchBook, SwitchError, Trigger
from cluster.core import ConfigError, NullSink, Phase, TelemetrySink
from cluster.kv.branches import BranchTable
from cluster.kv.directory import KVDirectory
from models import FetchModel, NodeModel

__all__ = ["ControlPlane", "ControlPlaneConfig", "EngineBackend", "PendingSwitch", "SwitchError"]


class ControlPlane(Placement, EventIntake, Availability, ControlPlaneReads):
    """See module docstring. Thread-safe for a live server through `lock`."""

    def __init__(
        self,
        phases: Mapping[int, Phase],
        models: Mapping[int, NodeModel],
        config: ControlPlaneConfig | None = None,
        sink: TelemetrySink | None = None,
        backend: EngineBackend | None = None,
        router: Router | None = None,
        planner: Planner | None = None,
    ) -> None:
        self._config = cfg = config or ControlPlaneConfig()
        if set(phases) != set(models):
            raise ConfigError("phases and models must name the same nodes")
        if cfg.kv_fetch not in ("async", "sync", "none"):
            raise ConfigError(f"kv_fetch must be async, sync or none, got {cfg.kv_fetch!r}")
        check_copy_price(cfg.copy_price_s_per_token)
        self._sink = sink or NullSink()
        self._backend = backend
        self._lock = ContendedRLock()
        self._directory = KVDirectory(cfg.block_tokens)
        self._state = ClusterState(
            phases=dict(phases),
            models=dict(models),
            directory=self._directory,
            fetch=FetchModel(),
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            kv_fetch=cfg.kv_fetch,
            max_report_age_s=cfg.max_report_age_s,
            overhead_s=cfg.ttft_overhead_s,
        )
        if cfg.prefill_forms:  # the router prices prefill with each node's fitted form
            self._state.prefill_predictors.update(dict.fromkeys(phases, form_prefill_time))
        self._view = ClusterView(self._state)
        self._branches = BranchTable(self._directory, lambda n: self._state.phases[n], self._sink)
        self._router = router or ROUTERS.create(cfg.router)
        self._binder = DECODE_BINDERS.create(cfg.decode_binder)
        self._plan = PlannerDriver(
            planner or make_planner(cfg), cfg.planner_mode, cfg.planner_modes
        )
        self._stats = WindowStats()
        self._book = SwitchBook(self._state.unavailable)
        self._collocated = False
        self._now = 0.0
        # Requests admitted and not finished (queued for prefill, prefilling, in transfer or
        # decoding): the planner's decode demand q (see cluster/control/planning.py).
        self._in_service = 0
        if cfg.log_branch_counts:
            self._directory.count_batch_listeners.append(self._log_counts)

    # ---- configuration ---------------------------------------------------------------
    def set_models(self, models: Mapping[int, NodeModel]) -> None:
        """Freeze fitted models (after the collocated warmup, Alg. E.3 line 1), or refits."""
        missing = set(self._state.phases) - set(models)
        if missing:
            raise ConfigError(f"no model for nodes {sorted(missing)}")
        self._state.set_models(models)

    def set_ttft_overhead(self, seconds: float) -> None:
        """A request's expected serving overheads before its first token (proxy, wake-up,
        KV hand-off, join, streaming: models.overheads): the router's T_hat adds them."""
        with self._lock:
            self._state.overhead_s = max(float(seconds), 0.0)

    def set_prefill_predictor(self, node: int, predictor: PrefillPredictor | None) -> None:
        """Price `node`'s prefill with `predictor` (e.g. form_prefill_time); None: Eq. 3."""
        with self._lock:
            self._state.set_prefill_predictor(self._node(node), predictor)

    def set_router(
        self, policy: str | None = None, copy_price_s_per_token: float | None = None
    ) -> RouterSettings:
        """Change the routing policy (a new router, only if the name differs) and/or kappa."""
        if policy is not None and policy not in ROUTERS:
            raise ConfigError(
                f"unknown router policy {policy!r}; choose one of: {', '.join(ROUTERS.names())}"
            )
        if copy_price_s_per_token is not None:
            check_copy_price(copy_price_s_per_token)
        if policy is not None and policy != self._router.name:
            self._router = ROUTERS.create(policy)
        if copy_price_s_per_token is not None:
            self._state.copy_price_s_per_token = copy_price_s_per_token
        return self.router_settings()

    def set_planner(
        self, mode: str | None = None, window_s: float | None = None, slices: int | None = None
    ) -> PlannerSettings:
        """Planner mode (auto | advise | off) and the gain planner's window and slices.

        A shorter window moves the next evaluation to at most one window from now. Raises
        ConfigError (changing nothing) for a bad value or a window on a windowless planner.
        """
        self._plan.configure(self._now, mode, window_s, slices)
        return self.planner_settings()

    def start_collocated(self) -> None:
        """Warmup mode: every node serves both phases (prefill routed anywhere, decode in place)."""
        self._collocated = True
        for n in self._state.phases:
            self._state.phases[n] = "prefill"

    def start_disaggregation(self, phases: Mapping[int, Phase], now: float) -> None:
        """End of warmup: serve the initial split (no switch; Alg. E.3 line 1)."""
        if set(phases) != set(self._state.phases):
            raise ConfigError("the initial split must assign every node")
        if not any(p == "prefill" for p in phases.values()) or not any(
            p == "decode" for p in phases.values()
        ):
            raise ConfigError("the initial split needs at least one prefill and one decode node")
        self._collocated = False
        for n, p in phases.items():
            old = self._state.phases[n]
            self._state.phases[n] = p
            if old != p:
                self._branches.on_phase_switch(n, old, p, now)
        self._plan.schedule_next(now)

    def split(self) -> tuple[int, int]:
        p = sum(1 for ph in self._state.phases.values() if ph == "prefill")
        return p, len(self._state.phases) - p

    # ---- planner -------------------------------------------------------------------
    def planner_view(self, now: float) -> PlannerView:
        """What the planner reads at `now`."""
        return planner_view(
            self._state,
            self._stats,
            now,
            draining=bool(self._book.pending),
            last_switch_t=self._book.last_switch_t,
        )

    def evaluate_planner(self, now: float) -> PlannerDecision | None:
        """Evaluate without applying (advise mode and the notebooks)."""
        return self._plan.evaluate(self.planner_view(now))

    def tick(self, now: float) -> PlannerDecision | None:
        """Run the planner if its interval elapsed; apply its switches in auto mode."""
        self._now = now
        if not self._plan.due(now, self._collocated):
            return None
        self._plan.schedule_next(now)
        self._stats.prune(now)
        decision = self._plan.step(self.planner_view(now))
        if decision is None:
            return None
        rows = decision_rows(decision)
        if rows is not None:
            self._sink.emit("planner_windows", rows)
        if self._plan.mode == "auto":
            self.apply(decision, now, trigger="planner")
        return decision

    def apply(
        self, decision: PlannerDecision, now: float, trigger: Trigger = "planner"
    ) -> list[int]:
        started = []
        for sw in decision.switches:
            self.request_switch(sw.node_id, sw.to_phase, now, trigger=trigger, mode=decision.mode)
            started.append(sw.node_id)
        return started
