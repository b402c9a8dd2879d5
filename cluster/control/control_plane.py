"""The control plane: directory, branch counts, router, planner and phase switches in one place.

The same object drives the simulated cluster and live clusters (paper 000 Fig. 1, Alg. E.3):
engines feed it KV events and state reports; it routes each prefill request, binds the decode
node when prefill starts, keeps the branch counts, evaluates the planner once per window and
orchestrates phase switches (queued requests move to peers of the current phase, running ones
finish in place, then the node serves the new phase; its KV stays in the shared pool). It does
no I/O of its own: telemetry rows go to a `TelemetrySink`, engine actions to an
`EngineBackend`.

Its state changes only through its methods, which keep the invariants together (an undone
placement leaves the router, the pending work and the decode binding at once; a node held out
of routing for several reasons returns when the last one ends); callers read it through the
accessors at the end of the class (`tests/cluster/control/test_api_boundary.py` checks this).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from cluster.control.bounds import check_copy_price
from cluster.control.config import ControlPlaneConfig, make_planner
from cluster.control.engines import EngineBackend
from cluster.control.lock import ContendedRLock
from cluster.control.plane_reads import ControlPlaneReads
from cluster.control.planner_driver import (
    PlannerDriver,
    PlannerSettings,
    decision_rows,
    planner_view,
)
from cluster.control.planning import Planner, PlannerDecision, PlannerView, SwitchMode, WindowStats
from cluster.control.routing import DECODE_BINDERS, ROUTERS, DecodeBinder, Router, decision_row
from cluster.control.snapshots import RouterSettings
from cluster.control.state import (
    ClusterState,
    ClusterView,
    NodeReport,
    PrefillPredictor,
    QueuedWork,
    RouteDecision,
    RouteRequest,
    form_prefill_time,
)
from cluster.control.switching import PendingSwitch, SwitchBook, SwitchError, Trigger, switch_row
from cluster.core import BlockHash, ConfigError, KVEvent, NullSink, Phase, TelemetrySink
from cluster.kv.branches import BranchKind, BranchTable
from cluster.kv.directory import KVDirectory
from models import FetchModel, NodeModel

__all__ = ["ControlPlane", "ControlPlaneConfig", "EngineBackend", "PendingSwitch", "SwitchError"]


class ControlPlane(ControlPlaneReads):
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
        self.config = cfg = config or ControlPlaneConfig()
        if set(phases) != set(models):
            raise ConfigError("phases and models must name the same nodes")
        if cfg.kv_fetch not in ("async", "sync", "none"):
            raise ConfigError(f"kv_fetch must be async, sync or none, got {cfg.kv_fetch!r}")
        check_copy_price(cfg.copy_price_s_per_token)
        self.sink: TelemetrySink = sink or NullSink()
        self.backend = backend
        self.lock = ContendedRLock()
        self.directory = KVDirectory(cfg.block_tokens)
        self.state = ClusterState(
            phases=dict(phases),
            models=dict(models),
            directory=self.directory,
            fetch=FetchModel(),
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            kv_fetch=cfg.kv_fetch,
            max_report_age_s=cfg.max_report_age_s,
            overhead_s=cfg.ttft_overhead_s,
        )
        if cfg.prefill_forms:  # the router prices prefill with each node's fitted form
            self.state.prefill_predictors.update(dict.fromkeys(phases, form_prefill_time))
        self.view = ClusterView(self.state)
        self.branches = BranchTable(self.directory, lambda n: self.state.phases[n], self.sink)
        self.router: Router = router or ROUTERS.create(cfg.router)
        self.binder: DecodeBinder = DECODE_BINDERS.create(cfg.decode_binder)
        self._plan = PlannerDriver(
            planner or make_planner(cfg), cfg.planner_mode, cfg.planner_modes
        )
        self.stats = WindowStats()
        self._book = SwitchBook(self.state.unavailable)
        self.collocated = False
        self.now = 0.0
        # Requests admitted and not finished (queued for prefill, prefilling, in transfer or
        # decoding): the planner's decode demand q (see cluster/control/planning.py).
        self.in_service = 0
        if cfg.log_branch_counts:
            self.directory.count_batch_listeners.append(self._log_counts)

    # ---- configuration ---------------------------------------------------------------
    def set_models(self, models: Mapping[int, NodeModel]) -> None:
        """Freeze fitted models (after the collocated warmup, Alg. E.3 line 1), or refits."""
        missing = set(self.state.phases) - set(models)
        if missing:
            raise ConfigError(f"no model for nodes {sorted(missing)}")
        self.state.set_models(models)

    def set_ttft_overhead(self, seconds: float) -> None:
        """A request's expected serving overheads before its first token (proxy, wake-up,
        KV hand-off, join, streaming: models.overheads): the router's T_hat adds them."""
        with self.lock:
            self.state.overhead_s = max(float(seconds), 0.0)

    def set_prefill_predictor(self, node: int, predictor: PrefillPredictor | None) -> None:
        """Price `node`'s prefill with `predictor` (e.g. form_prefill_time); None: Eq. 3."""
        with self.lock:
            self.state.set_prefill_predictor(self._node(node), predictor)

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
        if policy is not None and policy != self.router.name:
            self.router = ROUTERS.create(policy)
        if copy_price_s_per_token is not None:
            self.state.copy_price_s_per_token = copy_price_s_per_token
        return self.router_settings()

    def set_planner(
        self, mode: str | None = None, window_s: float | None = None, slices: int | None = None
    ) -> PlannerSettings:
        """Planner mode (auto | advise | off) and the gain planner's window and slices.

        A shorter window moves the next evaluation to at most one window from now. Raises
        ConfigError (changing nothing) for a bad value or a window on a windowless planner.
        """
        self._plan.configure(self.now, mode, window_s, slices)
        return self.planner_settings()

    def start_collocated(self) -> None:
        """Warmup mode: every node serves both phases (prefill routed anywhere, decode in place)."""
        self.collocated = True
        for n in self.state.phases:
            self.state.phases[n] = "prefill"

    def start_disaggregation(self, phases: Mapping[int, Phase], now: float) -> None:
        """End of warmup: serve the initial split (no switch; Alg. E.3 line 1)."""
        if set(phases) != set(self.state.phases):
            raise ConfigError("the initial split must assign every node")
        if not any(p == "prefill" for p in phases.values()) or not any(
            p == "decode" for p in phases.values()
        ):
            raise ConfigError("the initial split needs at least one prefill and one decode node")
        self.collocated = False
        for n, p in phases.items():
            old = self.state.phases[n]
            self.state.phases[n] = p
            if old != p:
                self.branches.on_phase_switch(n, old, p, now)
        self._plan.schedule_next(now)

    def split(self) -> tuple[int, int]:
        p = sum(1 for ph in self.state.phases.values() if ph == "prefill")
        return p, len(self.state.phases) - p

    # ---- data path ---------------------------------------------------------------------
    def admit(
        self,
        req: RouteRequest,
        *,
        branch_kind: BranchKind = "start",
        parent_id: str | None = None,
    ) -> RouteDecision:
        """A request arrives: update its branch (Alg. E.1/E.2), route it, count it on the node."""
        self.now = req.now
        self.branches.on_request(
            req.branch_id,
            list(req.path),
            req.now,
            program_id=req.program_id,
            kind=branch_kind,
            parent_id=parent_id,
        )
        decision = self.route(req)
        self.branches.place(req.branch_id, decision.node_id, req.now)
        self.in_service += 1
        self.stats.record_decode_load(req.now, self.in_service)
        return decision

    def route(self, req: RouteRequest) -> RouteDecision:
        """Route without touching branch state (also used to re-route queued requests)."""
        decision = self.router.route(req, self.view)
        t_c = decision.cached_tokens + decision.fetch_tokens
        self.state.record_sent(
            decision.node_id, QueuedWork(req.request_id, max(req.t_in - t_c, 1), t_c), req.now
        )
        if self.config.log_router_decisions:
            self.sink.emit("router_decisions", decision_row(req, decision))
        return decision

    def reroute(self, req: RouteRequest, from_node: int | None = None) -> RouteDecision:
        """Route a request again: a queued request of a switching node, or a retry.

        With `from_node`, the request is first released there (`release_placement`).
        """
        if from_node is not None:
            self.release_placement(req.request_id, from_node)
        decision = self.route(req)
        if req.branch_id in self.branches.branches:
            self.branches.place(req.branch_id, decision.node_id, req.now)
        return decision

    def bind_decode(self, req: RouteRequest, prefill_node: int, kv_tokens: int) -> int:
        """Prefill starts: choose the decode node and count the branch there."""
        if self.collocated:
            node = prefill_node
        else:
            node = self.binder.bind(req, kv_tokens, self.view)
            if req.branch_id in self.branches.branches:
                self.branches.place(req.branch_id, node, req.now)
        self.state.decode_load[node] = self.state.decode_load.get(node, 0) + 1
        return node

    def release_placement(
        self, request_id: str, prefill_node: int, decode_node: int | None = None
    ) -> None:
        """Undo one placement of a request that will not run there (a failed attempt, a
        request moved off a switching node): the router forgets it on `prefill_node`, it no
        longer counts as sent there, and its decode binding (if any) is released. Branch
        counts stay: the next placement moves them (Alg. E.2). Safe to call twice."""
        self.router.on_prefill_done(request_id, prefill_node)  # a router forgets its
        self.router.on_done(request_id, prefill_node)  # prefill and service entries
        self.state.release_sent(prefill_node, request_id)
        if decode_node is not None:
            self._unbind(decode_node)

    def _unbind(self, decode_node: int) -> None:
        self.state.decode_load[decode_node] = max(self.state.decode_load.get(decode_node, 0) - 1, 0)

    def on_prefill_done(self, req: RouteRequest, node: int, t: float) -> None:
        """The prefill node now holds the branch's current version."""
        self.branches.confirm(req.branch_id, node, t)
        self.router.on_prefill_done(req.request_id, node)

    def on_prefill_iteration(
        self, node: int, t: float, new_tokens: float, cached_tokens: float, restored_tokens: float
    ) -> None:
        """One prefill forward pass of `node` (t_bar_n and f_n of the planner's remeasure)."""
        self.stats.record_prefill_iteration(node, t, new_tokens, cached_tokens, restored_tokens)

    def on_transfer_done(self, branch_id: str, decode_node: int, t: float) -> None:
        """The decode node received the request's KV: it holds the current version."""
        if not self.collocated:
            self.branches.confirm(branch_id, decode_node, t)

    def on_request_done(
        self,
        request_id: str,
        prefill_node: int,
        decode_node: int,
        t: float,
        *,
        t_uc: float,
        t_c: float,
        attn_pairs: float,
        t_out: float,
        t_acc: float,
    ) -> None:
        self._unbind(decode_node)
        self.in_service = max(self.in_service - 1, 0)
        self.stats.record_decode_load(t, self.in_service)
        self.router.on_done(request_id, prefill_node)
        self.stats.record_request(t, t_uc, attn_pairs, t_c, t_out, t_acc)

    def on_request_abandoned(self, t: float) -> None:
        """An admitted request failed for good (a live engine died): it leaves service.

        Its last placement is undone separately (`release_placement`)."""
        self.in_service = max(self.in_service - 1, 0)
        self.stats.record_decode_load(t, self.in_service)

    def observe_load(
        self, t: float, in_service: int, finished: Iterable[tuple[float, ...]] = ()
    ) -> None:
        """Requests the engines served without this control plane routing them (an attached
        fleet in shadow mode, `pdlab attach`): the fleet's requests in service (the planner's
        decode demand q) and the work (t_uc, A, t_c, t_out, t_acc) of those that finished
        (the window's w-bar, Eq. 5-6)."""
        self.now = t
        self.in_service = max(int(in_service), 0)
        self.stats.record_decode_load(t, self.in_service)
        for t_uc, pairs, t_c, t_out, t_acc in finished:
            self.stats.record_request(t, t_uc, pairs, t_c, t_out, t_acc)

    def on_branch_finish(self, branch_id: str, t: float) -> None:
        self.branches.finish(branch_id, t)

    def on_kv_events(self, events: Iterable[KVEvent]) -> None:
        self.directory.apply_all(events)

    def add_zero_count_listener(self, listener: Callable[[int, list[BlockHash]], None]) -> None:
        """Call `listener(node, blocks)` whenever blocks' R_{b,n} drop to zero (a
        branch-aware cache re-ranks them: their eviction key fell)."""
        self.directory.zero_listeners.append(listener)

    def drop_node_blocks(self, node: int) -> int:
        """`node`'s engine restarted with an empty cache (it published no AllBlocksCleared):
        drop its blocks from the directory; returns how many it held."""
        held = self.directory.node_blocks(node)
        self.directory.clear_node(node)
        return held

    def on_report(self, report: NodeReport) -> None:
        self.state.report(report)

    def _log_counts(self, node: int, blocks: list[int], counts: list[int]) -> None:
        """A path's count changes as one batch of `branch_counts` rows."""
        n = len(counts)
        if not n:
            return
        self.sink.emit(
            "branch_counts",
            {"t": [self.now] * n, "node_id": [node] * n, "block_hash": blocks, "count": counts},
        )

    # ---- planner -------------------------------------------------------------------
    def planner_view(self, now: float) -> PlannerView:
        """What the planner reads at `now`."""
        return planner_view(
            self.state,
            self.stats,
            now,
            draining=bool(self._book.pending),
            last_switch_t=self._book.last_switch_t,
        )

    def evaluate_planner(self, now: float) -> PlannerDecision | None:
        """Evaluate without applying (advise mode and the notebooks)."""
        return self._plan.evaluate(self.planner_view(now))

    def tick(self, now: float) -> PlannerDecision | None:
        """Run the planner if its interval elapsed; apply its switches in auto mode."""
        self.now = now
        if not self._plan.due(now, self.collocated):
            return None
        self._plan.schedule_next(now)
        self.stats.prune(now)
        decision = self._plan.step(self.planner_view(now))
        if decision is None:
            return None
        rows = decision_rows(decision)
        if rows is not None:
            self.sink.emit("planner_windows", rows)
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

    # ---- phase switches and availability --------------------------------------------
    def request_switch(
        self,
        node: int,
        to_phase: str,
        now: float,
        *,
        trigger: Trigger = "manual",
        mode: SwitchMode = "in-place",
    ) -> PendingSwitch:
        """Start switching `node` to `to_phase`; serialized per node."""
        with self.lock:
            cur = self._book.check(node, to_phase, self.state.phases, self.collocated)
            sw = PendingSwitch(node, cur, to_phase, now, trigger, mode)  # type: ignore[arg-type]
            self._book.begin(sw)
            if self.backend is not None:
                self.backend.begin_switch(node, to_phase, mode, now)  # type: ignore[arg-type]
            return sw

    def complete_switch(
        self, node: int, now: float, drained: int = 0, lost_kv_blocks: int | None = None
    ) -> None:
        """The backend reports that `node` serves its new phase.

        `lost_kv_blocks`: blocks the switch made unreachable; by default 0 for an in-place
        switch (the KV stays in the pool) and every block the node held for a relaunch or a
        stranded switch.
        """
        with self.lock:
            sw = self._book.finish(node, now, drained)
            self.state.phases[node] = sw.to_phase
            self.state.reports.pop(node, None)
            self.branches.on_phase_switch(node, sw.from_phase, sw.to_phase, now)
            if lost_kv_blocks is None:
                lost_kv_blocks = (
                    self.directory.node_blocks(node) if sw.mode in ("relaunch", "strand") else 0
                )
            if sw.mode in ("relaunch", "strand"):
                # The relaunched or stranded node's KV is unreachable: drop it from the directory.
                self.directory.clear_node(node)
            self.sink.emit("phase_switches", switch_row(sw, now, lost_kv_blocks))

    def cancel_switch(self, node: int) -> PendingSwitch:
        """Roll back the pending switch of `node` (the backend could not do it): the node
        keeps its phase and returns to routing unless held for another reason. No
        `phase_switches` row: only completed switches are rows."""
        with self.lock:
            return self._book.cancel(node)

    def set_switch_mode(self, node: int, mode: SwitchMode) -> PendingSwitch:
        """The backend carries out the pending switch of `node` another way (e.g. a relaunch
        where the engine cannot switch in place): completion then drops the node's KV."""
        with self.lock:
            return self._book.set_mode(node, mode)

    def mark_unavailable(self, node: int, reason: str) -> None:
        """Take `node` out of routing and planning for `reason` (an engine down, a relaunch);
        it returns when every reason it was marked for ends (`mark_available`)."""
        with self.lock:
            self._book.hold(self._node(node), reason)

    def mark_available(self, node: int, reason: str) -> None:
        with self.lock:
            self._book.release(self._node(node), reason)

    def _node(self, node: int) -> int:
        if node not in self.state.phases:
            raise ConfigError(f"unknown node {node}; nodes are {sorted(self.state.phases)}")
        return node
