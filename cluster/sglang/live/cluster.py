"""A live SGLang PD cluster under the control plane: the engines of `pdlab serve --sglang`.

SPEC §6 and paper 000 Fig. 1: the same `ControlPlane` that drives the simulator drives real
SGLang engines. `SGLangCluster` implements `cluster.control.engines.ClusterEngines` (what the
control server needs) and `EngineBackend` (what the control plane asks): it reads a cluster
file (`cluster_file`), discovers the engines through /server_info, opens the telemetry run
(`telemetry_run`), and wires its parts — the engines' collectors and health checks
(`fleet.EngineFleet`), the data-plane proxy (`proxy.PDProxy`), phase switches
(`role_switch.RoleSwitcher`), online refits of the nodes' models (`online_fit`) and the
engines' KV usage and branch counts (`kv_sync.KVSync`) — to the control plane. Its health
loop reports every node to the control plane, runs the planner, refits the models, reads
the engines' KV usage and pushes branch counts. `serving.add_data_plane` mounts the proxy's
routes on an app; `launched.LaunchedCluster` also starts the engine processes.

Threads: the uvicorn loop (proxy and REST handlers), one SUB thread per collector, the
health loop, one thread per phase switch. `ControlPlane.lock` serializes all of them; the
telemetry writer is reached only through `LockedSink`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
from cluster.control.engines import CompletedRequest, NodeStatus, RequestListener
from cluster.control.lock import ContendedRLock
from cluster.control.planning import SwitchMode
from cluster.control.state import NodeReport
from cluster.core import ConfigError, Phase, TelemetrySink, tee
from cluster.sglang.live.cluster_file import ClusterConfig, EngineSpec, load_cluster_config
from cluster.sglang.live.engine_state import EngineState
from cluster.sglang.live.fleet import EngineFleet
from cluster.sglang.live.kv_sync import KVSync
from cluster.sglang.live.live_request import LiveRequest
from cluster.sglang.live.online_fit import OnlineFitter
from cluster.sglang.live.overhead_stats import OverheadStats
from cluster.sglang.live.proxy import PDProxy
from cluster.sglang.live.role_switch import RoleSwitcher, SwitchRecord
from cluster.sglang.live.telemetry_run import LockedSink, open_run
from cluster.sglang.wire.fpm import DecodeRow, PrefillRow
from models.overheads import pass_overheads

log = logging.getLogger(__name__)

DOWN = "engine down"  # control-plane hold reasons of this cluster
RELAUNCHING = "relaunching"


class SGLangCluster:
    """A live SGLang PD cluster behind the control plane (see module docstring).

    `start()` discovers the engines and starts collectors, health checks and the proxy's
    accounting; `stop()` stops them and closes the telemetry run. All times are seconds
    since `run_start_wall`, the run's `started_at`.
    """

    source = "sglang"
    speed = 1.0

    def __init__(
        self,
        config: ClusterConfig | str | Path,
        db_path: str | Path | None = None,
        run_id: str | None = None,
    ) -> None:
        self.config = config if isinstance(config, ClusterConfig) else load_cluster_config(config)
        self.settings = self.config.settings
        self._db_path = Path(db_path) if db_path is not None else None
        self._requested_run_id = run_id
        self.sink: LockedSink | None = None  # the database
        self._tap: TelemetrySink | None = None
        self.rows: TelemetrySink | None = None  # what every part writes: database and tap
        self._error: str | None = None
        self.summary: dict[str, Any] | None = None
        self._split_timeline: list[tuple[float, int, int]] = []
        self.switch_log: list[SwitchRecord] = []
        self.run_start_wall = time.time()
        self.num_completed = 0
        self._listener: RequestListener | None = None
        self.cp: ControlPlane = None  # type: ignore[assignment]  # set by start()
        self.proxy: PDProxy = None  # type: ignore[assignment]
        self.fleet: EngineFleet = None  # type: ignore[assignment]
        self.kv_sync: KVSync = None  # type: ignore[assignment]
        self.switcher = RoleSwitcher(self)
        self.lock = ContendedRLock()  # the control plane's once started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._prepared = False
        self._stopped = False

    # ---- ClusterEngines: identity and lifecycle ----------------------------------------------
    @property
    def run_id(self) -> str | None:
        return None if self.sink is None else self.sink.run_id

    @property
    def db_path(self) -> Path | None:
        return self._db_path

    @property
    def control_plane(self) -> ControlPlane | None:
        return self.cp if self._started else None

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def engines(self) -> dict[int, EngineState]:
        return {} if self.fleet is None else self.fleet.states

    def set_request_listener(self, listener: RequestListener) -> None:
        self._listener = listener

    def set_telemetry_tap(self, tap: TelemetrySink) -> None:
        self._tap = tap

    def now(self) -> float:
        return max(0.0, time.time() - self.run_start_wall)

    @property
    def finished(self) -> bool:
        """True once the cluster is stopping (switches in progress give up)."""
        return self._stopped

    def ended(self) -> str | None:
        return "the SGLang cluster stopped" if self._stopped else None

    def prepare(self) -> None:
        """Discover the engines through /server_info (raises ConfigError naming the engine).

        `start` does it too; a CLI calls it first to report a bad cluster before serving.
        """
        if not self._prepared:
            self.config = self.config.discovered()
            self._prepared = True

    def start(self) -> None:
        """Discover engines, open the telemetry run, start collectors and health checks."""
        if self._started:
            return
        self.prepare()
        cfg, s = self.config, self.settings
        block_tokens = cfg.block_tokens()
        phases: dict[int, Phase] = {e.node_id: e.role for e in cfg.engines}  # type: ignore[misc]
        if "prefill" not in phases.values() or "decode" not in phases.values():
            raise ConfigError(
                f"a PD cluster needs a prefill and a decode engine; roles are {phases}"
            )
        from cluster.hardware.profiles import load_profile

        model = load_profile(s.profile).node_model()
        self.run_start_wall = time.time()
        if self._db_path is not None:
            self.sink = open_run(
                self._db_path,
                cfg,
                block_tokens,
                self._requested_run_id,
                self.run_start_wall,
                source=self.source,
            )
        self.rows = tee(self.sink, self._tap)
        cp_cfg = ControlPlaneConfig(
            block_tokens=block_tokens,
            router=s.router,
            decode_binder=s.decode_binder,
            planner=s.planner,
            planner_mode=s.planner_mode,  # type: ignore[arg-type]
            window_s=s.window_s,
            slices=s.slices,
            kv_fetch=s.kv_fetch,
            copy_price_s_per_token=s.copy_price_s_per_token,
        )
        try:
            self.cp = ControlPlane(
                phases, {n: model for n in phases}, cp_cfg, sink=self.rows, backend=self
            )
            self.lock = self.cp.lock
            self.fleet = EngineFleet(
                cfg.engines,
                self.lock,
                self.now,
                sink=self.rows,
                run_start_wall=self.run_start_wall,
                catch_up=s.catch_up,
                on_kv_events=self.cp.on_kv_events,
                on_restart=self.cp.drop_node_blocks,
                on_pass=self._on_pass,
            )
            self.proxy = PDProxy(self)
            self.kv_sync = KVSync(
                self.fleet.states,
                self.lock,
                self.cp.branch_counts,
                self.proxy.headers,
                s.branch_counts_every_s,
            )
            self.fitter = OnlineFitter(
                s.moe_top_k if s.moe_experts else 0, s.moe_experts, min_rows=s.refit_min_rows
            )
            self.overheads = OverheadStats()
            self._split_timeline.append((0.0, *self.cp.split()))
            for n in self.fleet.states:
                self.fleet.start_collectors(n)
        except BaseException:
            if self.fleet is not None:
                self.fleet.close()
            if self.sink is not None:
                self.sink.close()
            raise
        self._started = True
        self._thread = threading.Thread(target=self._loop, name="pdlab-sglang", daemon=True)
        self._thread.start()
        log.info(
            "SGLang cluster up: %s; block %d tokens; run %s",
            ", ".join(f"{n}:{p}" for n, p in sorted(phases.items())),
            block_tokens,
            self.run_id,
        )

    def config_engine(self, node: int) -> EngineSpec:
        return next(e for e in self.config.engines if e.node_id == node)

    def stop(self) -> dict[str, Any] | None:
        """Stop health checks, switches and collectors; consolidate the telemetry run."""
        if self.summary is not None or not self._started:
            return self.summary
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.switcher.join(timeout_s=30)
        self.fleet.close()
        with self.lock:
            self.summary = self._summary()
        if self.sink is not None:  # closed, or failed when an engine died or is down
            self.fleet.outages.end_run(self.sink)
        return self.summary

    def _summary(self) -> dict[str, Any]:
        p = self.proxy
        return {
            "run_id": self.run_id,
            "seconds": self.now(),
            "requests": p.num_requests,
            "completed": self.num_completed,
            "errors": p.num_errors,
            "retries": p.num_retries,
            "switches": self.cp.num_switches,
            "final_split": "{}P{}D".format(*self.cp.split()),
            "telemetry_rejected": 0 if self.sink is None else self.sink.errors,
            "outages": self.fleet.outages.as_list(),
            "streams": {n: st.stream_stats() for n, st in self.engines.items()},
        }

    def flush_telemetry(self) -> None:
        if self.sink is not None and not self._stopped:
            self.sink.flush()

    # ---- the proxy's host (ProxyHost) and the switcher's -------------------------------------
    def engine(self, node: int) -> EngineSpec:
        return self.fleet.engine(node)

    def tokenizer_url(self) -> str | None:
        return self.fleet.tokenizer_url()

    def restart_collectors(self, node: int, spec: EngineSpec) -> None:
        self.fleet.restart_collectors(node, spec)

    def refresh_report(self, node: int) -> None:
        """Report `node` to the control plane from the proxy's accounting (under the lock).

        The queue is every request whose prefill the proxy sent there and has not seen
        finish (in order; a running one counts whole, so T_rem = 0); every request sent
        before now has arrived (seen = None), so the router stops counting them as pending.
        """
        with self.lock:
            st = self.engines[node]
            if not st.up:
                return
            self.cp.on_report(
                NodeReport(
                    node_id=node,
                    t=self.now(),
                    phase=self.cp.phase_of(node),
                    queued=tuple(self.proxy.prefill_queue(node)),
                    remaining_s=0.0,
                    running=max(self.fleet.running(node), self.proxy.decode_running(node)),
                    seen=None,
                    kv_gpu_used=st.decode_kv_tokens,
                    kv_gpu_capacity=st.spec.kv_capacity_tokens or 0,
                )
            )

    def record_request(self, rec: LiveRequest) -> None:
        """One `requests` row (and a completed request's `request_stages` row); a completed
        request goes to the rolling latency."""
        with self.lock:
            if rec.t_done is not None:
                self.num_completed += 1
                if self._listener is not None:
                    self._listener(CompletedRequest(rec.t_arrival, rec.t_first_token, rec.t_done))
            if self.rows is not None:
                self.rows.emit("requests", rec.row())
                if rec.t_done is not None:
                    self.rows.emit("request_stages", rec.stage_row(self.run_start_wall))
            if rec.t_done is not None:
                self.overheads.add_request(rec, self.run_start_wall)

    def mark_down(self, node: int, reason: str) -> None:
        with self.lock:
            changed = self.fleet.mark_down(node, reason)
            if changed:
                self.cp.mark_unavailable(node, DOWN)
        if changed:
            log.warning(
                "engine %d (%s) marked unavailable: %s", node, self.engine(node).http_url, reason
            )

    def _mark_up(self, node: int) -> None:
        with self.lock:
            changed = self.fleet.mark_up(node)
            if changed:
                self.cp.mark_available(node, DOWN)
        if changed:
            log.info("engine %d (%s) is healthy again", node, self.engine(node).http_url)

    def set_relaunching(self, node: int, relaunching: bool) -> None:
        """The switcher relaunches the engine: health checks skip it, routing too."""
        with self.lock:
            self.engines[node].relaunching = relaunching
            if relaunching:
                self.cp.mark_unavailable(node, RELAUNCHING)
            else:
                self.cp.mark_available(node, RELAUNCHING)

    # ---- engine events (collector threads, lock held) ----------------------------------------
    def _on_pass(
        self, node: int, now: float, prefill: PrefillRow | None, decode: DecodeRow | None
    ) -> None:
        if prefill is not None:
            self.fitter.add_prefill(node, prefill)
            self.overheads.add_pass("prefill", prefill.overhead_s, prefill.num_reqs)
            self.cp.on_prefill_iteration(node, now, prefill.t_uc, prefill.t_c, prefill.t_rst)
        if decode is not None:
            self.fitter.add_decode(node, decode)
            self.overheads.add_pass("decode", decode.overhead_s, decode.batch_size)
        self.refresh_report(node)

    # ---- the health loop ------------------------------------------------------------------
    def _loop(self) -> None:
        s = self.settings
        next_refit = time.monotonic() + s.refit_every_s
        with httpx.Client(timeout=min(2.0, s.health_interval_s * 2)) as client:
            while not self._stop.wait(s.health_interval_s):
                try:
                    self.fleet.check_health(
                        client,
                        self.proxy.headers,
                        s.health_failures,
                        on_healthy=self._mark_up,
                        on_failing=self.mark_down,
                    )
                    self.kv_sync.read_states(client)
                    if self.kv_sync.push_due():
                        self.kv_sync.push_counts(client)
                    with self.lock:
                        for n in self.engines:
                            self.refresh_report(n)
                        self.cp.tick(self.now())
                    if s.refit_every_s > 0 and time.monotonic() >= next_refit:
                        self.refit_models()
                        next_refit = time.monotonic() + s.refit_every_s
                except Exception as exc:  # surfaced through /v1/health; the cluster keeps serving
                    log.exception("SGLang cluster loop failed")
                    self._error = f"{type(exc).__name__}: {exc}"

    def refit_models(self) -> dict[int, Any]:
        """Refit every node's models from its recent passes and hand them to the control
        plane (router and planner) with the serving overheads measured meanwhile (the
        router's TTFT term, each pass's CPU overhead in Eq. 3-4: overhead_stats); returns
        node -> phases refitted. Runs every `refit_every_s` from the health loop; callable
        at any time."""
        with self.lock:
            models = self.cp.models()
            refits = self.fitter.refit_all(models)
            for n, r in refits.items():
                models[n] = r.model
                self.engines[n].fit = {
                    "t": self.now(),
                    "phases": list(r.phases),
                    "samples": r.samples,
                    "mape": r.mape,
                }
            ov = self.overheads.overheads()
            self.cp.set_ttft_overhead(ov.ttft_s)
            pre, dec = pass_overheads(ov)
            if pre or dec:
                over = {"prefill_overhead": pre, "decode_overhead": dec}
                models = {n: replace(m, **over) for n, m in models.items()}  # type: ignore[arg-type]
            if refits or pre or dec:
                self.cp.set_models(models)
            return {n: r.phases for n, r in refits.items()}

    # ---- EngineBackend (called by ControlPlane.request_switch under the lock) ---------
    def begin_switch(self, node: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        self.switcher.begin(node, to_phase, mode, now)

    def on_switched(self, rec: SwitchRecord, spec: EngineSpec | None) -> None:
        """The switcher finished (or gave up on) a switch: resume routing to the node."""
        with self.lock:
            st = self.engines[rec.node_id]
            st.last_switch = rec
            self.switch_log.append(rec)
            if spec is not None:
                st.spec = spec
            if st.relaunching:
                self.set_relaunching(rec.node_id, False)
            if rec.ok:
                if rec.method == "relaunch":
                    self.cp.set_switch_mode(rec.node_id, "relaunch")
                    st.pushed_counts = {}  # a new engine process holds no counts
                self.cp.complete_switch(
                    rec.node_id, rec.t_done, drained=rec.drained, lost_kv_blocks=rec.lost_kv_blocks
                )
                self._split_timeline.append((rec.t_done, *self.cp.split()))
            else:
                self.cp.cancel_switch(rec.node_id)

    # ---- ClusterEngines: reads (lock held) -----------------------------------------------
    def node_ids(self) -> list[int]:
        return sorted(self.engines)

    def node_status(self, node: int) -> NodeStatus:
        st = self.engines[node]
        cp = self.cp
        blocks = cp.node_blocks(node)
        model = cp.models()[node]
        return NodeStatus(
            out_of_service=(not st.up) or st.relaunching,
            queue=len(self.proxy.prefill_queue(node)),
            running=max(self.fleet.running(node), self.proxy.decode_running(node)),
            waiting_kv=0,
            kv_gpu_used=(
                st.kv_gpu_used_tokens
                if st.kv_gpu_used_tokens is not None
                else blocks * cp.block_tokens + st.decode_kv_tokens
            ),
            kv_gpu_capacity=st.spec.kv_capacity_tokens or 0,
            kv_host_used=st.kv_host_used_tokens or 0,
            kv_host_capacity=st.kv_host_capacity_tokens,
            prefill_iterations=st.prefill_iterations,
            decode_iterations=st.decode_iterations,
            extras={
                **self.fleet.status_extras(node),
                "in_flight": self.proxy.outstanding(node),
                "kv_blocks": blocks,
                "model": {
                    "prefill": list(model.prefill.coef),
                    "decode": list(model.decode.coef),
                    "mean_new_tokens": model.mean_new_tokens,
                    "online_fit": st.fit,
                },
            },
        )

    def in_flight(self) -> int:
        return self.proxy.inflight.num_requests()

    def split_timeline(self) -> list[tuple[float, int, int]]:
        return self._split_timeline

    def health_details(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "speed": self.speed,
            "engines_up": self.fleet.num_up() if self.fleet is not None else 0,
            "engines": len(self.config.engines),
        }

    def cluster_details(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "requests_failed": self.proxy.num_errors,
            "retries": self.proxy.num_retries,
        }


__all__ = ["SGLangCluster"]
