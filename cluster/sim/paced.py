"""The simulated cluster paced to wall-clock time: the default engines of `pdlab serve` (SPEC §6).

`PacedSimulation` implements `cluster.control.engines.ClusterEngines` over the simulator of
SPEC §5: a background thread advances it to `speed` x the wall time elapsed
(`Simulator.step_until`), so a notebook watches a cluster that behaves like a live one —
requests arrive, queues build, the planner of paper 000 Alg. E.3 evaluates its windows and
the control plane (paper 000 §4.3) answers at the current simulated time. Each pacing step
holds the control plane's lock for about `max_step_wall_s` of wall time, or one event when an
event takes longer (it advances in sub-steps and stops when that time has passed, never by
more than `speed x max_step_wall_s`, and after the sub-step in which another thread began to
wait for the lock), so REST calls wait little even when the simulator
falls behind the clock (`lag_s`, simulated seconds) at a speed it cannot keep. Completed
requests reach the server's rolling latency through the request listener, in completion
order per step. The run ends at `duration_s`, or earlier when a trace replayed at its
arrival times has finished every request (`Simulator.trace_finished`). Only the
simulator's public face is used.

If a pacing step raises (a policy, a telemetry row the writer rejects), pacing stops and
`error` says why; the server then calls `stop()`, which stores every buffered table the
writer accepts, closes the run and summarizes it with the error.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.control.control_plane import ControlPlane
from cluster.control.engines import CompletedRequest, NodeStatus, RequestListener
from cluster.control.planner_driver import PLANNER_MODES
from cluster.core import ConfigError, TelemetrySink, tee
from cluster.sim.config import SimConfig
from cluster.sim.runner import config_dict, register_nodes
from cluster.sim.simulator import Simulator

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PaceConfig:
    """Pacing of the live simulation. Times in wall seconds unless the name says sim."""

    speed: float = 10.0  # simulated seconds per wall second
    tick_s: float = 0.05  # wall time between pacing steps
    max_step_wall_s: float = 0.25  # wall time one pacing step may hold the lock (about)
    planner_mode: str = "advise"  # the control plane's planner mode when the run starts

    def validate(self) -> None:
        if not (math.isfinite(self.speed) and 0 < self.speed <= 100_000):
            raise ConfigError(f"--speed must be in (0, 100000] sim-s per wall-s, got {self.speed}")
        if min(self.tick_s, self.max_step_wall_s) <= 0:
            raise ConfigError("tick_s and max_step_wall_s must be > 0")
        if self.planner_mode not in PLANNER_MODES:
            raise ConfigError(
                f"planner mode must be one of {', '.join(PLANNER_MODES)}, got {self.planner_mode!r}"
            )


class PacedSimulation:
    """See module docstring. `start()` opens the telemetry run and starts pacing."""

    source = "live-sim"

    def __init__(
        self,
        sim_config: SimConfig,
        db_path: str | Path | None = None,
        pace: PaceConfig | None = None,
        run_id: str | None = None,
    ) -> None:
        sim_config.validate()
        self.pace = pace or PaceConfig()
        self.pace.validate()
        self.sim_config = sim_config
        self.speed = self.pace.speed
        self._db_path = Path(db_path) if db_path is not None else None
        self._requested_run_id = run_id
        self._run_id: str | None = None
        self._writer: Any = None
        self.sim: Simulator | None = None
        self.lag_s = 0.0  # simulated seconds behind the wall-clock pace (a slow simulator)
        self._error: str | None = None
        self._failed_at: float | None = None  # simulated time of the failure
        self._sub_step = 0.1  # simulated seconds per step_until call while pacing (adapted)
        self._listener: RequestListener | None = None
        self._tap: TelemetrySink | None = None
        self._cursor = 0  # requests of `sim.requests` seen so far (the list only grows)
        self._open: list[Any] = []  # seen, not yet done
        self._flushed_at_end = False
        self._summary: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        return self._run_id

    @property
    def db_path(self) -> Path | None:
        return self._db_path

    @property
    def control_plane(self) -> ControlPlane | None:
        return None if self.sim is None else self.sim.cp

    @property
    def error(self) -> str | None:
        return self._error

    def set_request_listener(self, listener: RequestListener) -> None:
        self._listener = listener

    def set_telemetry_tap(self, tap: TelemetrySink) -> None:
        self._tap = tap

    def start(self) -> None:
        """Open the telemetry run, build the simulator and start pacing it."""
        if self._thread is not None:
            return
        cfg = self.sim_config
        if self._db_path is not None:
            from telemetry import TelemetryWriter

            self._writer = TelemetryWriter(
                self._db_path,
                run_id=self._requested_run_id,
                source=self.source,
                config={**config_dict(cfg), "speed": self.pace.speed},
            )
            self._run_id = self._writer.run_id
        try:
            sim = Simulator(cfg, sink=tee(self._writer, self._tap))
            sim.run_id = self._run_id
            if self._writer is not None:
                register_nodes(self._writer, sim)
            sim.cp.set_planner(mode=self.pace.planner_mode)
            sim.start()
        except BaseException:
            if self._writer is not None:
                self._writer.close()
            raise
        self.sim = sim
        self._thread = threading.Thread(target=self._run, name="pdlab-live-sim", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        """Stop pacing, flush the simulator and consolidate the run into the database.

        After a failure, tables whose buffered rows the writer rejects are dropped (logged)
        and the rest stored; the summary carries the failure as `error`.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.sim is None or self._summary is not None:
            return self._summary
        sim = self.sim
        with sim.cp.lock:
            try:
                self._flush_storable(sim)
                summary = sim.finish()
            except Exception as exc:  # a simulator left broken by the failure
                if self._error is None:
                    raise
                log.exception("summary of the failed simulation")
                summary = {"sim_seconds": sim.now, "summary_error": f"{type(exc).__name__}: {exc}"}
            finally:
                if self._writer is not None:
                    self._writer.close()
            summary["run_id"] = self._run_id
            if self._error is not None:
                summary["error"] = self._error
            self._summary = summary
        return self._summary

    def _flush_storable(self, sim: Simulator) -> None:
        """Flush the simulator's buffers; after a failure, one table at a time, dropping
        those the writer rejects (each failed flush consumes the table it stopped at)."""
        for _ in range(64):
            try:
                sim.out.flush()
                return
            except Exception as exc:
                if self._error is None:
                    raise
                log.error("rows not stored after the failure: %s: %s", type(exc).__name__, exc)
        raise RuntimeError("the simulator's buffers kept failing to flush")

    def _run(self) -> None:
        sim = self.sim
        assert sim is not None
        pace = self.pace
        wall0, sim0 = time.monotonic(), sim.now
        max_step = pace.speed * pace.max_step_wall_s  # simulated seconds
        try:
            while not self._stop.wait(pace.tick_s):
                with sim.cp.lock:
                    target = sim0 + pace.speed * (time.monotonic() - wall0)
                    if self.ended() is None:
                        self._advance(sim, min(target, sim.now + max_step))
                    end = sim.now if sim.trace_finished else self.sim_config.duration_s
                    self.lag_s = max(0.0, min(target, end) - sim.now)
                    self._report_completed(sim)
        except Exception as exc:  # the server stops the run when it sees `error`
            log.exception("live simulation failed")
            self._failed_at = sim.now
            self._error = (
                f"the paced simulation failed at t={sim.now:.1f} s: {type(exc).__name__}: {exc}"
            )

    def _advance(self, sim: Simulator, limit: float) -> None:
        """Step toward `limit` in sub-steps until it is reached, `max_step_wall_s` of wall
        time has passed, or another thread waits for the lock (held here): a REST call waits
        one sub-step at most. A sub-step is what the simulator managed in a tenth of that time
        at its last measured pace, so a burst of events overruns by little."""
        budget = self.pace.max_step_wall_s
        lock = sim.cp.lock
        w0, t0 = time.perf_counter(), sim.now
        while sim.now < limit:
            sim.step_until(min(limit, sim.now + self._sub_step))
            if lock.contended or time.perf_counter() - w0 >= budget:
                break
        wall = time.perf_counter() - w0
        if wall > 0 and sim.now > t0:
            pace_sim_per_wall = (sim.now - t0) / wall
            # grows at most 2x per step: a step cut short after one quiet sub-step (a thread
            # waited) measures a pace the next burst of events does not keep
            self._sub_step = min(
                max(pace_sim_per_wall * budget / 10, 0.01),
                self.pace.speed * budget,
                2.0 * self._sub_step,
            )

    def _report_completed(self, sim: Simulator) -> None:
        """Hand the requests finished since the last step to the listener (by t_done)."""
        reqs = sim.requests
        if self._cursor < len(reqs):
            self._open.extend(reqs[self._cursor :])
            self._cursor = len(reqs)
        still, done = [], []
        for r in self._open:
            if r.t_done is None:
                still.append(r)
            else:
                done.append(CompletedRequest(r.t_arrival, r.t_first_token, r.t_done))
        self._open = still
        if self._listener is not None:
            for c in sorted(done, key=lambda c: c.t_done):
                self._listener(c)

    # ---- reads (control-plane lock held) ---------------------------------------------------
    def now(self) -> float:
        return 0.0 if self.sim is None else self.sim.now

    def ended(self) -> str | None:
        sim = self.sim
        if sim is None:
            return None
        if self._failed_at is not None:
            return f"the simulated run stopped at t={self._failed_at:.1f} s after a failure"
        if sim.trace_finished:
            return f"the simulated run ended at t={sim.now:.1f} s: every trace request finished"
        if sim.now < self.sim_config.duration_s:
            return None
        return f"the simulated run ended at t={sim.now:.1f} s (--duration)"

    def node_ids(self) -> list[int]:
        return [] if self.sim is None else list(self.sim.node_ids)

    def node_status(self, node: int) -> NodeStatus:
        assert self.sim is not None
        return NodeStatus(**self.sim.node_status(node))

    def in_flight(self) -> int:
        return len(self._open)

    def split_timeline(self) -> list[tuple[float, int, int]]:
        return [] if self.sim is None else self.sim.split_timeline

    def health_details(self) -> dict[str, Any]:
        return {
            "duration_s": self.sim_config.duration_s,
            "speed": self.pace.speed,
            "lag_s": self.lag_s,
        }

    def cluster_details(self) -> dict[str, Any]:
        return {}

    def flush_telemetry(self) -> None:
        """Buffered rows to the writer, and the writer's segment to readers; once the run
        ended, a last time only (nothing more arrives)."""
        sim = self.sim
        if sim is None or self._flushed_at_end:
            return
        try:
            sim.out.flush()
            if self._writer is not None:
                self._writer.flush()
        except Exception as exc:  # a failure of this run: the server stops it
            self._failed_at = sim.now
            self._error = (
                f"storing the telemetry failed at t={sim.now:.1f} s: {type(exc).__name__}: {exc}"
            )
            raise
        self._flushed_at_end = self.ended() is not None
