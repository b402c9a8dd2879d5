"""The control server's logic over any cluster of engines (SPEC §6; paper 000 §4.3, App. E).

`ControlService` answers the REST API for a `ClusterEngines` implementation — the simulator
paced to wall-clock time, live SGLang engines, or any other — at the cluster's current time:
reads (health, cluster, timeline, planner, router, branches, directory) and mutations (phase
switches, planner and router settings, applying the planner's split) go through the control
plane's methods and read-only accessors. It owns what every cluster shares: the rolling
latency of completed requests, the Prometheus histograms and counters counted from the
engines' telemetry rows (`RowMetrics`, tapped into the engines), the timeline the dashboard
plots, and a housekeeping thread that samples that timeline and flushes the engines'
telemetry so other processes read the run while it is written (`telemetry.open_reader`).

One lock (`ControlPlane.lock`, once the engines started) serializes the engines' threads and
every handler, so a handler sees a consistent cluster and two switch requests for one node
are decided one after the other. Errors a client can cause are `ApiError`s (errors.py) with
an HTTP status and a message that says what was wrong and what is allowed.

A background failure stops the run: when a thread of the engines fails (`engines.error`) or
housekeeping itself raises, the service stops the engines at once (they flush what can be
stored and close the telemetry run), health reports `finished: true` with the error, every
mutating call answers 503 naming it, and reads keep answering from the stopped cluster.
A node whose engine is down (`NodeStatus.extras["healthy"]` false: a live engine that died
or fails its health checks) makes health `degraded` and lists it in `nodes_down`; switching
it answers 409.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from cluster.control.control_plane import ControlPlane, SwitchError
from cluster.control.engines import ClusterEngines
from cluster.control.lock import ContendedRLock
from cluster.core import ConfigError
from cluster.server.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
    clip,
)
from cluster.server.latency import RollingLatency, Timeline
from cluster.server.payloads import (
    branch_json,
    decision_json,
    node_json,
    planner_json,
    router_json,
)
from cluster.server.row_metrics import RowMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Wall seconds unless the name says otherwise."""

    sample_every_s: float = 1.0  # timeline samples for the dashboard plots
    flush_every_s: float = 2.0  # telemetry segments become visible to readers this often
    latency_window_s: float = 120.0  # rolling window of the TTFT/E2E figures (cluster clock)
    timeline_samples: int = 7200
    tick_s: float = 0.05  # housekeeping thread's wake-up period

    def validate(self) -> None:
        if min(self.sample_every_s, self.flush_every_s, self.tick_s) <= 0:
            raise ConfigError("sample_every_s, flush_every_s and tick_s must be > 0")
        if not self.latency_window_s > 0:
            raise ConfigError(f"latency window must be > 0, got {self.latency_window_s}")
        if self.timeline_samples < 1:
            raise ConfigError(f"timeline_samples must be >= 1, got {self.timeline_samples}")


class ControlService:
    """See module docstring. `start()` starts the engines and housekeeping; `stop()` ends."""

    def __init__(self, engines: ClusterEngines, config: ServiceConfig | None = None) -> None:
        self.config = cfg = config or ServiceConfig()
        cfg.validate()
        self.engines = engines
        self.latency = RollingLatency(cfg.latency_window_s)
        self.timeline = Timeline(cfg.timeline_samples)
        engines.set_request_listener(self.latency.add)
        self.row_metrics = RowMetrics()  # /metrics' histograms and counters
        engines.set_telemetry_tap(self.row_metrics)
        self.summary: dict[str, Any] | None = None
        self.failure: str | None = None  # the background failure that stopped the run
        self._lock = ContendedRLock()  # until the engines' control plane exists
        self._stop = threading.Event()
        self._stopping = threading.Lock()  # one stop of the engines, from whichever thread
        self._engines_stopped = False
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def lock(self) -> ContendedRLock:
        cp = self.engines.control_plane
        return cp.lock if cp is not None else self._lock

    def start(self) -> None:
        if self._thread is not None:
            return
        self.engines.start()
        self.row_metrics.add_nodes(self.engines.node_ids())
        self._thread = threading.Thread(target=self._housekeep, name="pdlab-service", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        """Stop housekeeping and the engines (flushing and closing their telemetry run)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        try:
            return self._stop_engines()
        except Exception as exc:  # e.g. the run's telemetry could not be stored whole
            log.error("stopping the run failed: %s: %s", type(exc).__name__, exc)
            if self.failure is None:
                self.failure = f"stopping the run failed: {type(exc).__name__}: {exc}"
            return self.summary

    def _stop_engines(self) -> dict[str, Any] | None:
        with self._stopping:
            if not self._engines_stopped:
                self._engines_stopped = True
                self.summary = self.engines.stop()
        return self.summary

    def _housekeep(self) -> None:
        cfg = self.config
        next_sample = next_flush = time.monotonic()
        while not self._stop.wait(cfg.tick_s):
            why = self.engines.error  # a thread of the engines failed
            if why is None:
                wall = time.monotonic()
                try:
                    with self.lock:
                        if wall >= next_sample:
                            self._sample()
                            next_sample = wall + cfg.sample_every_s
                        if wall >= next_flush:
                            self.engines.flush_telemetry()
                            next_flush = wall + cfg.flush_every_s
                except Exception as exc:
                    log.exception("live cluster housekeeping failed")
                    why = f"housekeeping: {type(exc).__name__}: {exc}"
            if why is not None:
                self._fail(why)
                return

    def _fail(self, why: str) -> None:
        """Stop the run after a background failure; mutations are refused from now on."""
        log.error("stopping the run after a failure: %s", why)
        self.failure = why
        try:
            self._stop_engines()
        except Exception as exc:
            log.exception("stopping the engines after a failure failed too")
            self.failure = f"{why}; stopping the engines failed too: {type(exc).__name__}: {exc}"

    def _sample(self) -> None:
        e = self.engines
        cp = e.control_plane
        if cp is None:
            return
        now = e.now()
        queued = sum(e.node_status(n).queue for n in e.node_ids())
        self.timeline.sample(now, cp.split(), self.latency.stats(now, e.in_flight()), queued)

    def _cp(self) -> ControlPlane:
        cp = self.engines.control_plane
        if cp is None:
            raise UnavailableError("the live cluster has not started yet")
        return cp

    def _failed(self) -> str | None:
        return self.failure or self.engines.error

    def _finished(self) -> bool:
        return self._failed() is not None or self.engines.ended() is not None

    def _check_running(self, action: str) -> ControlPlane:
        """The control plane, unless the run failed (503) or ended (409)."""
        cp = self._cp()
        failed = self._failed()
        if failed is not None:
            raise UnavailableError(
                f"the run was stopped after a failure ({clip(failed, 300)}); cannot {action}"
            )
        why = self.engines.ended()
        if why is not None:
            raise ConflictError(f"{why}; cannot {action}")
        return cp

    # ---- reads (all under the lock) ----------------------------------------------------------
    def health(self) -> dict[str, Any]:
        with self.lock:
            e = self.engines
            started = e.control_plane is not None
            error = self._failed()
            down = self._nodes_down() if started else []
            status = "degraded" if down else "ok"
            return {
                "status": "error" if error else (status if started else "starting"),
                "error": error,
                "nodes_down": down,
                "run_id": e.run_id,
                "db": str(e.db_path.resolve()) if e.db_path is not None else None,
                "time": e.now() if started else 0.0,
                "finished": started and self._finished(),
                **e.health_details(),
            }

    def _nodes_down(self) -> list[dict[str, Any]]:
        """Nodes whose engine reports itself unhealthy (a live engine that died or stopped
        answering its health checks), with the engine's last error."""
        e = self.engines
        out = []
        for n in e.node_ids():
            extras = e.node_status(n).extras
            if extras.get("healthy") is False:
                out.append({"node": n, "error": extras.get("last_error")})
        return out

    def cluster(self) -> dict[str, Any]:
        with self.lock:
            cp = self._cp()
            e = self.engines
            p, d = cp.split()
            now = e.now()
            planner = cp.planner_settings()
            return {
                "time": now,
                "run_id": e.run_id,
                "speed": e.speed,
                "finished": self._finished(),
                "collocated": cp.collocated,
                "split": {"prefill": p, "decode": d},
                "nodes": [node_json(cp, n, e.node_status(n)) for n in e.node_ids()],
                "latency": self.latency.stats(now, e.in_flight()),
                "requests_completed": self.latency.completed,
                "switches": cp.num_switches,
                "planner": {"name": planner.name, "mode": planner.mode},
                "router": router_json(cp),
                **e.cluster_details(),
            }

    def timeline_json(self, since: float = 0.0) -> dict[str, Any]:
        with self.lock:
            self._cp()
            e = self.engines
            return {
                "time": e.now(),
                "samples": self.timeline.columns(since),
                "split": [
                    {"t": t, "prefill": a, "decode": b}
                    for t, a, b in e.split_timeline()
                    if t >= since
                ],
            }

    def router(self) -> dict[str, Any]:
        with self.lock:
            return router_json(self._cp())

    def planner(self) -> dict[str, Any]:
        with self.lock:
            return planner_json(self._cp())

    def branch(self, branch_id: str) -> dict[str, Any]:
        with self.lock:
            b = self._cp().branch(branch_id)
            if b is None:
                raise NotFoundError(
                    f"unknown branch {clip(repr(branch_id))}: not active (finished branches are "
                    "released); GET /v1/branches lists the active ones"
                )
            return branch_json(b)

    def branches(self, limit: int = 100) -> dict[str, Any]:
        with self.lock:
            ids = self._cp().active_branches()
            return {"active": len(ids), "branch_ids": ids[-limit:] if limit > 0 else []}

    def directory_stats(self) -> dict[str, Any]:
        with self.lock:
            return dict(self._cp().directory_stats())

    def metrics_snapshot(self) -> dict[str, Any] | None:
        """One consistent view for a Prometheus scrape (None before the engines start)."""
        with self.lock:
            if self.engines.control_plane is None:
                return None
            cp = self._cp()
            snap = self.cluster()
            snap["directory"] = self.directory_stats()
            snap["branches_active"] = len(cp.active_branches())
            decision = cp.planner_settings().last_decision
            snap["planner_decision"] = None if decision is None else decision_json(decision)
            snap["nodes"] = [
                {**n, "directory_blocks": cp.node_blocks(n["id"])} for n in snap["nodes"]
            ]
            return snap

    # ---- mutations -----------------------------------------------------------------------
    def switch(self, node_id: int, phase: str) -> dict[str, Any]:
        """Manual phase switch at the cluster's current time (trigger 'manual')."""
        if phase not in ("prefill", "decode"):
            raise InvalidRequestError(f"phase must be 'prefill' or 'decode', got {phase!r}")
        with self.lock:
            cp = self._cp()
            nodes = list(self.engines.node_ids())
            if node_id not in nodes:
                raise NotFoundError(f"unknown node {node_id}; nodes are {clip(str(nodes), 200)}")
            cp = self._check_running(f"switch node {node_id}")
            extras = self.engines.node_status(node_id).extras
            if extras.get("healthy") is False:
                why = clip(str(extras.get("last_error") or "health checks fail"), 300)
                raise ConflictError(
                    f"node {node_id}'s engine is down ({why}); a switch needs a running engine"
                )
            try:
                sw = cp.request_switch(node_id, phase, self.engines.now(), trigger="manual")
            except SwitchError as err:
                raise ConflictError(str(err)) from None
            return {
                "node": node_id,
                "from_phase": sw.from_phase,
                "to_phase": sw.to_phase,
                "t_decided": sw.t_decided,
                "trigger": sw.trigger,
                "status": "switching" if cp.pending_switch(node_id) is not None else "done",
                "node_state": node_json(cp, node_id, self.engines.node_status(node_id)),
            }

    def set_planner(
        self, mode: str | None = None, window_s: float | None = None, slices: int | None = None
    ) -> dict[str, Any]:
        with self.lock:
            cp = self._check_running("change the planner")
            try:
                cp.set_planner(mode, window_s, slices)
            except ConfigError as err:
                hint = ""
                if "has no window" in str(err):
                    hint = " (start pdlab serve with --planner gain)"
                raise InvalidRequestError(f"{err}{hint}") from None
            return planner_json(cp)

    def apply_planner(self) -> dict[str, Any]:
        """Evaluate the planner now and start the switches of its recommended split."""
        with self.lock:
            cp = self._check_running("apply a split")
            now = self.engines.now()
            if cp.collocated:
                raise ConflictError("the cluster runs collocated (warmup); no split to apply yet")
            if cp.switches:
                busy = ", ".join(
                    f"node {n} ({s.from_phase} -> {s.to_phase})" for n, s in cp.switches.items()
                )
                raise ConflictError(f"a switch is in progress ({busy}); apply after it completes")
            decision = cp.evaluate_planner(now)
            name = cp.planner_settings().name
            if decision is None:
                raise ConflictError(
                    f"planner {name!r} has no evaluation at t={now:.1f} s "
                    "(not enough completed requests in the window, or a planner that never "
                    "recommends a split, such as 'static')"
                )
            if decision.chosen_prefill is None or not decision.switches:
                raise ConflictError(
                    f"no candidate split qualified at t={now:.1f} s "
                    f"(gain test, {decision.reason or 'no gain'}); the current split stays"
                )
            try:
                started = cp.apply(decision, now, trigger="manual")
            except SwitchError as err:
                raise ConflictError(str(err)) from None
            return {"started": started, "decision": decision_json(decision)}

    def set_router(
        self, policy: str | None = None, copy_price: float | None = None
    ) -> dict[str, Any]:
        with self.lock:
            cp = self._check_running("change the router")
            try:
                cp.set_router(policy, copy_price)
            except ConfigError as err:
                raise InvalidRequestError(str(err)) from None
            return router_json(cp)
