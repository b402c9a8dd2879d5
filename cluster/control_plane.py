"""The control plane: directory, branch counts, router, planner and phase switches in one place.

The same object drives the simulated cluster and live clusters (paper 000 Fig. 1, Alg. E.3):
engines feed it KV events and state reports; it routes each prefill request, binds the decode
node when prefill starts, keeps the branch counts, evaluates the planner once per window and
orchestrates phase switches (queued requests move to peers of the current phase, running ones
finish in place, then the node serves the new phase; its KV stays in the shared pool). It does
no I/O of its own: telemetry rows go to a `TelemetrySink`, engine actions to an
`EngineBackend`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from cluster.branches import BranchKind, BranchTable
from cluster.core import ConfigError, KVEvent, NullSink, Phase, TelemetrySink
from cluster.directory import KVDirectory
from cluster.planning import (
    PLANNERS,
    Planner,
    PlannerDecision,
    PlannerView,
    SwitchMode,
    WindowStats,
)
from cluster.routing import DECODE_BINDERS, ROUTERS, DecodeBinder, Router
from cluster.state import (
    ClusterState,
    ClusterView,
    NodeReport,
    QueuedWork,
    RouteDecision,
    RouteRequest,
)
from models import FetchModel, NodeModel

PlannerMode = Literal["auto", "advise", "off"]
Trigger = Literal["planner", "manual"]


class SwitchError(RuntimeError):
    """A phase switch request that cannot be honored (busy node, empty phase, bad phase)."""


class EngineBackend(Protocol):
    """What the control plane asks of the engines (simulated or live)."""

    def begin_switch(self, node: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """Stop the node taking work of its old phase, hand its queued requests back through
        `ControlPlane.reroute` (or equivalent), let running ones finish, and call
        `ControlPlane.complete_switch` when the node serves `to_phase`."""
        ...


@dataclass(slots=True)
class PendingSwitch:
    node_id: int
    from_phase: Phase
    to_phase: Phase
    t_decided: float
    trigger: Trigger
    mode: SwitchMode
    drained: int = 0


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    block_tokens: int = 256
    router: str = "ttft"
    decode_binder: str = "fewest"
    planner: str = "gain"
    planner_mode: PlannerMode = "auto"
    window_s: float = 600.0
    slices: int = 10
    cooldown_s: float = 120.0
    kv_fetch: str = "async"
    copy_price_s_per_token: float = 0.0
    max_report_age_s: float = 5.0
    log_branch_counts: bool = True
    log_router_decisions: bool = True


class ControlPlane:
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
        self.sink: TelemetrySink = sink or NullSink()
        self.backend = backend
        self.lock = threading.RLock()
        self.directory = KVDirectory(cfg.block_tokens)
        self.state = ClusterState(
            phases=dict(phases),
            models=dict(models),
            directory=self.directory,
            fetch=FetchModel(),
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            kv_fetch=cfg.kv_fetch,
            max_report_age_s=cfg.max_report_age_s,
        )
        self.view = ClusterView(self.state)
        self.branches = BranchTable(self.directory, lambda n: self.state.phases[n], self.sink)
        self.router: Router = router or ROUTERS.create(cfg.router)
        self.binder: DecodeBinder = DECODE_BINDERS.create(cfg.decode_binder)
        if planner is not None:
            self.planner: Planner = planner
        elif cfg.planner == "gain":
            self.planner = PLANNERS.create(
                "gain", window_s=cfg.window_s, slices=cfg.slices, cooldown_s=cfg.cooldown_s
            )
        else:
            self.planner = PLANNERS.create(cfg.planner)
        self.planner_mode: PlannerMode = cfg.planner_mode
        self.stats = WindowStats()
        self.switches: dict[int, PendingSwitch] = {}
        self.last_switch_t: float | None = None
        self.last_decision: PlannerDecision | None = None
        self.next_plan_t = 0.0
        self.num_switches = 0
        self.collocated = False
        self.now = 0.0
        # Requests admitted and not finished (queued for prefill, prefilling, in transfer or
        # decoding): the planner's decode demand q (see cluster/planning.py).
        self.in_service = 0
        if cfg.log_branch_counts:
            self.directory.count_listeners.append(self._log_count)

    # ---- configuration ---------------------------------------------------------------
    def set_models(self, models: Mapping[int, NodeModel]) -> None:
        """Freeze fitted models (after the collocated warmup, Alg. E.3 line 1)."""
        missing = set(self.state.phases) - set(models)
        if missing:
            raise ConfigError(f"no model for nodes {sorted(missing)}")
        self.state.models.update(models)

    def set_router(self, name: str, copy_price_s_per_token: float | None = None) -> None:
        self.router = ROUTERS.create(name)
        if copy_price_s_per_token is not None:
            if copy_price_s_per_token < 0:
                raise ConfigError(f"copy_price must be >= 0, got {copy_price_s_per_token}")
            self.state.copy_price_s_per_token = copy_price_s_per_token

    def set_planner_mode(self, mode: str) -> None:
        if mode not in ("auto", "advise", "off"):
            raise ConfigError(f"planner mode must be auto, advise or off, got {mode!r}")
        self.planner_mode = mode  # type: ignore[assignment]

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
        self.next_plan_t = now + self.planner.interval_s

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
            self.sink.emit(
                "router_decisions",
                {
                    "t": [req.now],
                    "request_id": [req.request_id],
                    "node_id": [decision.node_id],
                    "policy": [decision.policy],
                    "predicted_ttft_s": [decision.predicted_ttft_s],
                    "cached_tokens": [decision.cached_tokens],
                    "fetch_tokens": [decision.fetch_tokens],
                },
            )
        return decision

    def reroute(self, req: RouteRequest) -> RouteDecision:
        """Move a queued request of a switching node to a peer of its phase."""
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

    def on_prefill_done(self, req: RouteRequest, node: int, t: float) -> None:
        """The prefill node now holds the branch's current version."""
        self.branches.confirm(req.branch_id, node, t)
        self.router.on_prefill_done(req.request_id, node)

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
        self.state.decode_load[decode_node] = max(self.state.decode_load.get(decode_node, 0) - 1, 0)
        self.in_service = max(self.in_service - 1, 0)
        self.stats.record_decode_load(t, self.in_service)
        self.router.on_done(request_id, prefill_node)
        self.stats.record_request(t, t_uc, attn_pairs, t_c, t_out, t_acc)

    def on_request_abandoned(self, t: float) -> None:
        """An admitted request failed for good (a live engine died): it leaves service."""
        self.in_service = max(self.in_service - 1, 0)
        self.stats.record_decode_load(t, self.in_service)

    def on_branch_finish(self, branch_id: str, t: float) -> None:
        self.branches.finish(branch_id, t)

    def on_kv_events(self, events: Iterable[KVEvent]) -> None:
        self.directory.apply_all(events)

    def on_report(self, report: NodeReport) -> None:
        self.state.report(report)

    def _log_count(self, node: int, block: int, count: int) -> None:
        self.sink.emit(
            "branch_counts",
            {"t": [self.now], "node_id": [node], "block_hash": [block], "count": [count]},
        )

    # ---- planner -------------------------------------------------------------------
    def planner_view(self, now: float) -> PlannerView:
        s = self.state
        queue: dict[int, int] = {}
        running: dict[int, int] = {}
        kv: dict[int, float] = {}
        for n, r in s.reports.items():
            queue[n] = len(r.queued)
            running[n] = s.decode_load.get(n, 0)
            kv[n] = r.kv_gpu_used / r.kv_gpu_capacity if r.kv_gpu_capacity else 0.0
        full = {n: [q.t_uc + q.t_c for q in r.queued] for n, r in s.reports.items()}
        return PlannerView(
            now=now,
            phases=dict(s.phases),
            models=dict(s.models),
            stats=self.stats,
            draining=bool(self.switches),
            last_switch_t=self.last_switch_t,
            unavailable=frozenset(s.unavailable),
            prefill_queue=queue,
            decode_running=running,
            kv_utilization=kv,
            queued_full_input=full,
        )

    def evaluate_planner(self, now: float) -> PlannerDecision | None:
        """Evaluate without applying (advise mode and the notebooks)."""
        view = self.planner_view(now)
        evaluate = getattr(self.planner, "evaluate", None)
        decision = evaluate(view) if evaluate is not None else self.planner.step(view)
        if decision is not None:
            self.last_decision = decision
        return decision

    def tick(self, now: float) -> PlannerDecision | None:
        """Run the planner if its interval elapsed; apply its switches in auto mode."""
        self.now = now
        if self.planner_mode == "off" or self.collocated or now < self.next_plan_t:
            return None
        self.next_plan_t = now + self.planner.interval_s
        self.stats.prune(now)
        decision = self.planner.step(self.planner_view(now))
        if decision is None:
            return None
        self.last_decision = decision
        self._log_decision(decision)
        if self.planner_mode == "auto":
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

    def _log_decision(self, d: PlannerDecision) -> None:
        if not d.candidates:
            return
        self.sink.emit(
            "planner_windows",
            {
                "t": [d.t] * len(d.candidates),
                "current_prefill": [d.current_prefill] * len(d.candidates),
                "candidate_prefill": [c.prefill_count for c in d.candidates],
                "mean_gain": [c.mean_gain for c in d.candidates],
                "std_gain": [c.std_gain for c in d.candidates],
                "slices": [c.slices for c in d.candidates],
                "qualified": [c.qualified for c in d.candidates],
                "chosen": [c.prefill_count == d.chosen_prefill for c in d.candidates],
            },
        )

    # ---- phase switches --------------------------------------------------------------
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
            if node not in self.state.phases:
                raise SwitchError(f"unknown node {node}; nodes are {sorted(self.state.phases)}")
            if to_phase not in ("prefill", "decode"):
                raise SwitchError(f"phase must be 'prefill' or 'decode', got {to_phase!r}")
            if self.collocated:
                raise SwitchError(
                    "the cluster runs collocated (warmup); phase switches start after it"
                )
            busy = self.switches.get(node)
            if busy is not None:
                raise SwitchError(
                    f"node {node} is already switching {busy.from_phase} -> {busy.to_phase} "
                    f"(decided at t={busy.t_decided:.1f} s by {busy.trigger})"
                )
            cur = self.state.phases[node]
            if cur == to_phase:
                raise SwitchError(f"node {node} already serves {to_phase}")
            remaining = [
                n
                for n, p in self.state.phases.items()
                if p == cur and n != node and n not in self.state.unavailable
            ]
            if not remaining:
                raise SwitchError(
                    f"node {node} is the last available {cur} node; a switch would leave no {cur} node"
                )
            sw = PendingSwitch(node, cur, to_phase, now, trigger, mode)  # type: ignore[arg-type]
            self.switches[node] = sw
            self.state.unavailable.add(node)
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
            sw = self.switches.pop(node, None)
            if sw is None:
                raise SwitchError(f"node {node} has no switch in progress")
            sw.drained = drained
            self.state.phases[node] = sw.to_phase
            self.state.unavailable.discard(node)
            self.state.reports.pop(node, None)
            self.branches.on_phase_switch(node, sw.from_phase, sw.to_phase, now)
            if lost_kv_blocks is None:
                lost_kv_blocks = (
                    self.directory.node_blocks(node) if sw.mode in ("relaunch", "strand") else 0
                )
            if sw.mode in ("relaunch", "strand"):
                # The relaunched or stranded node's KV is unreachable: drop it from the directory.
                self.directory.clear_node(node)
            self.last_switch_t = now
            self.num_switches += 1
            self.sink.emit(
                "phase_switches",
                {
                    "node_id": [node],
                    "t_decided": [sw.t_decided],
                    "t_done": [now],
                    "from_phase": [sw.from_phase],
                    "to_phase": [sw.to_phase],
                    "trigger": [sw.trigger],
                    "drained": [drained],
                    "lost_kv_blocks": [lost_kv_blocks],
                },
            )
