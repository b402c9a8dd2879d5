"""A simulated cluster paced to wall-clock time, the engine side of `pdlab serve` (SPEC §6).

The simulator of SPEC §5 advances in a background thread to `speed` x the wall time elapsed
(`Simulator.step_until`), so a notebook watches a cluster that behaves like a live one:
requests arrive, queues build, the planner of paper 000 Alg. E.3 evaluates its windows and
the control plane (paper 000 §4.3) answers REST calls *at the current simulated time*.
One lock (`ControlPlane.lock`) serializes the pacing thread and every REST handler, so a
handler sees a consistent cluster and two switch requests for one node are decided one
after the other (the second is told the node is already switching). The telemetry writer
is touched only under that lock; it is flushed every `flush_every_s` wall seconds so other
processes read the run while it is written (`telemetry.open_reader`).

Errors a client can cause are `ApiError`s (errors.py) with an HTTP status and a message that
says what was wrong and what is allowed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.control_plane import SwitchError
from cluster.core import ConfigError
from cluster.routing import ROUTERS
from cluster.server.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from cluster.server.latency import LatencyTracker, decision_json, num
from cluster.sim.runner import config_dict, register_nodes
from cluster.sim.simulator import SimConfig, Simulator

log = logging.getLogger(__name__)

PLANNER_MODES = ("auto", "advise", "off")


def switch_state(sw: Any) -> dict[str, Any] | None:
    """A pending phase switch as the REST API shows it (None when the node is not switching)."""
    if sw is None:
        return None
    return {
        "from_phase": sw.from_phase,
        "to_phase": sw.to_phase,
        "t_decided": sw.t_decided,
        "trigger": sw.trigger,
        "mode": sw.mode,
    }


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """Pacing of the live simulation. Times in wall seconds unless the name says sim."""

    speed: float = 10.0  # simulated seconds per wall second
    tick_s: float = 0.05  # wall time between pacing steps
    max_step_wall_s: float = 0.25  # simulated work per step: at most this many wall-s of pacing
    flush_every_s: float = 2.0  # telemetry segments become visible to readers this often
    sample_every_s: float = 1.0  # timeline samples for the dashboard plots
    latency_window_sim_s: float = 120.0  # rolling window of the TTFT/E2E figures
    timeline_samples: int = 7200
    planner_mode: str = "advise"

    def validate(self) -> None:
        if not (math.isfinite(self.speed) and 0 < self.speed <= 100_000):
            raise ConfigError(f"--speed must be in (0, 100000] sim-s per wall-s, got {self.speed}")
        if min(self.tick_s, self.max_step_wall_s, self.flush_every_s, self.sample_every_s) <= 0:
            raise ConfigError(
                "tick_s, max_step_wall_s, flush_every_s and sample_every_s must be > 0"
            )
        if self.latency_window_sim_s <= 0:
            raise ConfigError(f"latency window must be > 0, got {self.latency_window_sim_s}")
        if self.planner_mode not in PLANNER_MODES:
            raise ConfigError(
                f"planner mode must be one of {', '.join(PLANNER_MODES)}, got {self.planner_mode!r}"
            )


class LiveCluster:
    """See module docstring. `start()` launches the pacing thread; `stop()` ends the run."""

    def __init__(
        self,
        sim_config: SimConfig,
        db_path: str | Path | None = None,
        live: LiveConfig | None = None,
        run_id: str | None = None,
    ) -> None:
        sim_config.validate()
        self.live = live or LiveConfig()
        self.live.validate()
        self.sim_config = sim_config
        self.db_path = Path(db_path) if db_path is not None else None
        self.requested_run_id = run_id
        self.run_id: str | None = None
        self.writer: Any = None
        self.sim: Simulator | None = None
        self.latency = LatencyTracker(self.live.latency_window_sim_s)
        self.timeline: deque[tuple[float, ...]] = deque(maxlen=self.live.timeline_samples)
        self.error: str | None = None
        self.summary: dict[str, Any] | None = None
        self.wall_started: float | None = None
        self.lag_s = 0.0  # simulated seconds behind the wall-clock pace (a slow simulator)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # replaced by the control plane's lock at start

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def start(self) -> None:
        """Open the telemetry run, build the simulator and start pacing it."""
        if self._thread is not None:
            return
        cfg = self.sim_config
        if self.db_path is not None:
            from telemetry import TelemetryWriter

            self.writer = TelemetryWriter(
                self.db_path,
                run_id=self.requested_run_id,
                source="live-sim",
                config={**config_dict(cfg), "speed": self.live.speed},
            )
            self.run_id = self.writer.run_id
        try:
            sim = Simulator(cfg, sink=self.writer)
            sim.run_id = self.run_id
            if self.writer is not None:
                register_nodes(self.writer, sim)
            sim.cp.set_planner_mode(self.live.planner_mode)
            sim.start()
        except BaseException:
            if self.writer is not None:
                self.writer.close()
            raise
        self.sim = sim
        self._lock = sim.cp.lock
        self.wall_started = time.monotonic()
        self._thread = threading.Thread(target=self._pace, name="pdlab-live-sim", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        """Stop pacing, flush the simulator and consolidate the run into the database."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.sim is None or self.summary is not None:
            return self.summary
        with self.lock:
            self.summary = self.sim.finish()
            self.summary["run_id"] = self.run_id
            if self.writer is not None:
                self.writer.close()
        return self.summary

    @property
    def finished(self) -> bool:
        return self.sim is not None and self.sim.now >= self.sim_config.duration_s

    def _pace(self) -> None:
        sim = self.sim
        assert sim is not None and self.wall_started is not None
        cfg = self.live
        wall0, sim0 = self.wall_started, sim.now
        next_flush = next_sample = wall0
        flushed_at_end = False
        try:
            while not self._stop.wait(cfg.tick_s):
                wall = time.monotonic()
                with self.lock:
                    target = sim0 + cfg.speed * (wall - wall0)
                    if not self.finished:
                        # At most `max_step_wall_s` of simulated work per lock hold, so REST
                        # calls wait little even when the simulator falls behind the clock.
                        sim.step_until(min(target, sim.now + cfg.speed * cfg.max_step_wall_s))
                    self.lag_s = max(0.0, min(target, self.sim_config.duration_s) - sim.now)
                    self.latency.update(sim.requests, sim.now)
                    if wall >= next_sample:
                        self._sample()
                        next_sample = wall + cfg.sample_every_s
                    if wall >= next_flush and not flushed_at_end:
                        self._flush()
                        next_flush = wall + cfg.flush_every_s
                        flushed_at_end = self.finished
        except Exception as exc:  # surfaced through /v1/health; the server keeps answering
            log.exception("live simulation failed")
            self.error = f"{type(exc).__name__}: {exc}"

    def _flush(self) -> None:
        assert self.sim is not None
        self.sim.out.flush()
        if self.writer is not None:
            self.writer.flush()

    def _sample(self) -> None:
        sim = self.sim
        assert sim is not None
        lat = self.latency.stats(sim.now)
        p, d = sim.cp.split()
        self.timeline.append(
            (
                sim.now,
                p,
                d,
                lat["ttft_p50_s"] if lat["ttft_p50_s"] is not None else math.nan,
                lat["ttft_p95_s"] if lat["ttft_p95_s"] is not None else math.nan,
                lat["e2e_p50_s"] if lat["e2e_p50_s"] is not None else math.nan,
                lat["throughput_rps"] if lat["throughput_rps"] is not None else math.nan,
                sum(len(n.queue) for n in sim.nodes.values()),
            )
        )

    def _sim(self) -> Simulator:
        if self.sim is None:
            raise UnavailableError("the live cluster has not started yet")
        return self.sim

    # ---- reads (all under the lock) ----------------------------------------------------------
    def health(self) -> dict[str, Any]:
        with self.lock:
            sim = self.sim
            return {
                "status": "error" if self.error else ("ok" if sim is not None else "starting"),
                "error": self.error,
                "run_id": self.run_id,
                "db": str(self.db_path.resolve()) if self.db_path is not None else None,
                "time": sim.now if sim is not None else 0.0,
                "duration_s": self.sim_config.duration_s,
                "speed": self.live.speed,
                "lag_s": self.lag_s,
                "finished": self.finished,
            }

    def node_state(self, node_id: int) -> dict[str, Any]:
        sim = self._sim()
        node = sim.nodes[node_id]
        cp = sim.cp
        sw = cp.switches.get(node_id)
        return {
            "id": node_id,
            "phase": cp.state.phases[node_id],
            "switching": switch_state(sw),
            "out_of_service": node.out_of_service,
            "queue": len(node.queue),
            "running": len(node.prefilling) + len(node.decode_batch),
            "waiting_kv": len(node.join_queue) + node.inbound,
            "kv_gpu_used": node.l1.used_tokens + node.decode_kv_tokens,
            "kv_gpu_capacity": node.l1.capacity_tokens,
            "kv_host_used": node.l2.used_tokens,
            "kv_host_capacity": node.l2.capacity_tokens,
            "prefill_iterations": node.prefill_iter,
            "decode_iterations": node.decode_iter,
        }

    def cluster(self) -> dict[str, Any]:
        with self.lock:
            sim = self._sim()
            cp = sim.cp
            p, d = cp.split()
            return {
                "time": sim.now,
                "run_id": self.run_id,
                "speed": self.live.speed,
                "finished": self.finished,
                "collocated": cp.collocated,
                "split": {"prefill": p, "decode": d},
                "nodes": [self.node_state(n) for n in sim.node_ids],
                "latency": self.latency.stats(sim.now),
                "requests_completed": self.latency.completed,
                "switches": cp.num_switches,
                "planner": {"name": cp.planner.name, "mode": cp.planner_mode},
                "router": self._router_json(),
            }

    def timeline_json(self, since: float = 0.0) -> dict[str, Any]:
        with self.lock:
            sim = self._sim()
            cols = ("t", "prefill", "decode", "ttft_p50_s", "ttft_p95_s", "e2e_p50_s",
                    "throughput_rps", "queued")  # fmt: skip
            rows = [r for r in self.timeline if r[0] >= since]
            return {
                "time": sim.now,
                "samples": {c: [num(r[i]) for r in rows] for i, c in enumerate(cols)},
                "split": [
                    {"t": t, "prefill": a, "decode": b}
                    for t, a, b in sim.split_timeline
                    if t >= since
                ],
            }

    def _router_json(self) -> dict[str, Any]:
        cp = self._sim().cp
        return {
            "policy": cp.router.name,
            "copy_price": cp.state.copy_price_s_per_token,
            "copy_price_unit": "s/token",
            "kv_fetch": cp.config.kv_fetch,
            "policies": ROUTERS.names(),
        }

    def router(self) -> dict[str, Any]:
        with self.lock:
            return self._router_json()

    def planner(self) -> dict[str, Any]:
        with self.lock:
            cp = self._sim().cp
            pl = cp.planner
            d = cp.last_decision
            return {
                "name": pl.name,
                "mode": cp.planner_mode,
                "modes": list(PLANNER_MODES),
                "window_s": getattr(pl, "window_s", None),
                "slices": getattr(pl, "slices", None),
                "interval_s": num(pl.interval_s),
                "next_evaluation_t": num(cp.next_plan_t) if not cp.collocated else None,
                "collocated": cp.collocated,
                "last_decision": None if d is None else decision_json(d),
            }

    def branch(self, branch_id: str) -> dict[str, Any]:
        with self.lock:
            cp = self._sim().cp
            st = cp.branches.branches.get(branch_id)
            if st is None:
                raise NotFoundError(
                    f"unknown branch {branch_id!r}: not active (finished branches are released); "
                    f"GET /v1/branches lists the active ones"
                )
            return {
                "branch_id": st.branch_id,
                "program_id": st.program_id,
                "version": st.version,
                "path_blocks": len(st.path),
                "counted": {str(n): length for n, (_, length) in sorted(st.counted.items())},
                "nodes": cp.branches.nodes_of(branch_id),
            }

    def branches(self, limit: int = 100) -> dict[str, Any]:
        with self.lock:
            ids = list(self._sim().cp.branches.branches)
            return {"active": len(ids), "branch_ids": ids[-limit:] if limit > 0 else []}

    def directory_stats(self) -> dict[str, Any]:
        with self.lock:
            cp = self._sim().cp
            stats = {k: int(v) for k, v in cp.directory.stats().items()}
            stats["block_tokens"] = cp.directory.block_tokens
            return stats

    # ---- mutations -----------------------------------------------------------------------
    def _check_running(self, action: str) -> Simulator:
        sim = self._sim()
        if self.finished:
            raise ConflictError(
                f"the simulated run ended at t={sim.now:.1f} s (--duration); cannot {action}"
            )
        return sim

    def switch(self, node_id: int, phase: str) -> dict[str, Any]:
        """Manual phase switch at the current simulated time (trigger 'manual')."""
        if phase not in ("prefill", "decode"):
            raise InvalidRequestError(f"phase must be 'prefill' or 'decode', got {phase!r}")
        with self.lock:
            sim = self._sim()
            if node_id not in sim.nodes:
                raise NotFoundError(f"unknown node {node_id}; nodes are {sim.node_ids}")
            sim = self._check_running(f"switch node {node_id}")
            cp = sim.cp
            try:
                sw = cp.request_switch(node_id, phase, sim.now, trigger="manual")
            except SwitchError as err:
                raise ConflictError(str(err)) from None
            done = node_id not in cp.switches
            return {
                "node": node_id,
                "from_phase": sw.from_phase,
                "to_phase": sw.to_phase,
                "t_decided": sw.t_decided,
                "trigger": sw.trigger,
                "status": "done" if done else "switching",
                "node_state": self.node_state(node_id),
            }

    def set_planner(
        self, mode: str | None = None, window_s: float | None = None, slices: int | None = None
    ) -> dict[str, Any]:
        if mode is not None and mode not in PLANNER_MODES:
            raise InvalidRequestError(
                f"planner mode must be one of {', '.join(PLANNER_MODES)}, got {mode!r}"
            )
        if window_s is not None and not (math.isfinite(window_s) and window_s > 0):
            raise InvalidRequestError(f"window_s must be > 0 simulated seconds, got {window_s}")
        if slices is not None and slices < 2:
            raise InvalidRequestError(
                f"slices must be >= 2 (the gain test needs m >= 2), got {slices}"
            )
        with self.lock:
            cp = self._sim().cp
            pl = cp.planner
            if (window_s is not None or slices is not None) and not hasattr(pl, "window_s"):
                raise InvalidRequestError(
                    f"planner {pl.name!r} has no window; window_s and slices apply to the "
                    f"'gain' planner (start pdlab serve with --planner gain)"
                )
            if window_s is not None:
                pl.window_s = window_s  # type: ignore[attr-defined]
                cp.next_plan_t = min(cp.next_plan_t, cp.now + window_s)
            if slices is not None:
                pl.slices = slices  # type: ignore[attr-defined]
            if mode is not None:
                cp.set_planner_mode(mode)
        return self.planner()

    def apply_planner(self) -> dict[str, Any]:
        """Evaluate the planner now and start the switches of its recommended split."""
        with self.lock:
            sim = self._check_running("apply a split")
            cp = sim.cp
            if cp.collocated:
                raise ConflictError("the cluster runs collocated (warmup); no split to apply yet")
            if cp.switches:
                busy = ", ".join(
                    f"node {n} ({s.from_phase} -> {s.to_phase})" for n, s in cp.switches.items()
                )
                raise ConflictError(f"a switch is in progress ({busy}); apply after it completes")
            decision = cp.evaluate_planner(sim.now)
            if decision is None:
                raise ConflictError(
                    f"planner {cp.planner.name!r} has no evaluation at t={sim.now:.1f} s "
                    "(not enough completed requests in the window, or a planner that never "
                    "recommends a split, such as 'static')"
                )
            if decision.chosen_prefill is None or not decision.switches:
                raise ConflictError(
                    f"no candidate split qualified at t={sim.now:.1f} s "
                    f"(gain test, {decision.reason or 'no gain'}); the current split stays"
                )
            try:
                started = cp.apply(decision, sim.now, trigger="manual")
            except SwitchError as err:
                raise ConflictError(str(err)) from None
            return {"started": started, "decision": decision_json(decision)}

    def set_router(
        self, policy: str | None = None, copy_price: float | None = None
    ) -> dict[str, Any]:
        if policy is not None and policy not in ROUTERS:
            raise InvalidRequestError(
                f"unknown router policy {policy!r}; choose one of: {', '.join(ROUTERS.names())}"
            )
        if copy_price is not None and not (math.isfinite(copy_price) and copy_price >= 0):
            raise InvalidRequestError(f"copy_price must be >= 0 s/token, got {copy_price}")
        with self.lock:
            cp = self._sim().cp
            if policy is not None and policy != cp.router.name:
                cp.set_router(policy, copy_price)
            elif copy_price is not None:
                cp.state.copy_price_s_per_token = copy_price
            return self._router_json()

    # ---- metrics ---------------------------------------------------------------------------
    def metrics_snapshot(self) -> dict[str, Any] | None:
        with self.lock:
            if self.sim is None:
                return None
            snap = self.cluster()
            snap["directory"] = self.directory_stats()
            return snap
