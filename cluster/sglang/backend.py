"""A live SGLang PD cluster under the control plane: the engine side of `pdlab serve --sglang`.

SPEC §6 and paper 000 Fig. 1: the same `ControlPlane` that drives the simulator drives real
SGLang engines. `SGLangCluster` reads a cluster file (`cluster_file`), discovers the engines
through /server_info, and runs per engine a KV event collector (its events build the KV
directory, its rows go to `kv_events`) and a forward-pass-metrics collector (iteration rows
for `pdlab fit`, and the node reports of App. E.3), a health check, and the data-plane proxy
(`proxy.PDProxy`). Phase switches requested through the control plane (planner or REST)
are carried out by `role_switch.RoleSwitcher`.

`SGLangCluster` extends the server's `LiveCluster`, so `cluster.server.create_app` serves the
same REST API (SPEC §6) over it: the control-plane handlers (planner, router, branches,
directory, manual switches) are inherited unchanged and read `self.sim`, here a small view
(`_PlaneView`) with the control plane, the clock and the node ids; everything that touched
the simulator (start/stop, node state, health, timeline) is overridden. `serving.create_sglang_app`
adds the data-plane routes to that app.

Threads: the uvicorn loop (proxy and REST handlers), one SUB thread per collector, the
health loop, one thread per phase switch. `ControlPlane.lock` serializes all of them; the
telemetry writer is reached only through `LockedSink`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from cluster.control_plane import ControlPlane, ControlPlaneConfig
from cluster.core import ConfigError, KVEvent, Phase
from cluster.planning import SwitchMode
from cluster.server.live import (
    LiveCluster,
    LiveConfig,
    NotFoundError,
    UnavailableError,
    switch_state,
)
from cluster.sglang.cluster_file import ClusterConfig, EngineSpec, load_cluster_config
from cluster.sglang.engine_state import (
    EngineState,
    LockedSink,
    RestartAwareKVCollector,
    RollingLatency,
)
from cluster.sglang.forward_metrics import ForwardMetricsCollector
from cluster.sglang.fpm import DecodeRow, ForwardPassMetrics, PrefillRow
from cluster.sglang.online_fit import OnlineFitter
from cluster.sglang.proxy import LiveRequest, PDProxy
from cluster.sglang.role_switch import RoleSwitcher, SwitchRecord
from cluster.state import NodeReport

log = logging.getLogger(__name__)


class _PlaneView:
    """The part of a simulator that `LiveCluster`'s handlers read, over a live cluster."""

    def __init__(self, cluster: SGLangCluster) -> None:
        self._c = cluster

    @property
    def cp(self) -> ControlPlane:
        return self._c.cp

    @property
    def now(self) -> float:
        return self._c.now()

    @property
    def nodes(self) -> dict[int, EngineState]:
        return self._c.engines

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._c.engines)


class SGLangCluster(LiveCluster):
    """A live SGLang PD cluster behind the control plane (see module docstring).

    `start()` discovers the engines and starts collectors, health checks and the proxy's
    accounting; `stop()` stops them and closes the telemetry run. All times are seconds
    since `run_start_wall`, the run's `started_at`.
    """

    def __init__(
        self,
        config: ClusterConfig | str | Path,
        db_path: str | Path | None = None,
        run_id: str | None = None,
        live: LiveConfig | None = None,
    ) -> None:
        self.config = config if isinstance(config, ClusterConfig) else load_cluster_config(config)
        self.settings = self.config.settings
        self.live = live or LiveConfig(planner_mode=self.settings.planner_mode)
        self.db_path = Path(db_path) if db_path is not None else None
        self.requested_run_id = run_id
        self.run_id: str | None = None
        self.writer: Any = None
        self.sink: LockedSink | None = None
        self.sim: Any = None  # the `_PlaneView` once started (LiveCluster's handlers)
        self.error: str | None = None
        self.summary: dict[str, Any] | None = None
        self.timeline: deque[tuple[float, ...]] = deque(maxlen=self.live.timeline_samples)
        self.split_timeline: list[tuple[float, int, int]] = []
        self.engines: dict[int, EngineState] = {}
        self.switch_log: list[SwitchRecord] = []
        self.run_start_wall = time.time()
        self.request_latency = RollingLatency(self.live.latency_window_sim_s)
        self.cp: ControlPlane = None  # type: ignore[assignment]  # set by start()
        self.proxy: PDProxy = None  # type: ignore[assignment]
        self.switcher = RoleSwitcher(self)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._prepared = False
        self._stopped = False
        self._tok_i = 0

    # ---- clock and lookups ----------------------------------------------------------------
    def now(self) -> float:
        return max(0.0, time.time() - self.run_start_wall)

    @property
    def finished(self) -> bool:
        return self._stopped

    def engine(self, node: int) -> EngineSpec:
        return self.engines[node].spec

    def tokenizer_url(self) -> str | None:
        """A healthy engine to tokenize with (rotating, so no engine takes all of it)."""
        ups = [e.spec.http_url for n, e in sorted(self.engines.items()) if e.up]
        if not ups:
            return None
        self._tok_i += 1
        return ups[self._tok_i % len(ups)]

    # ---- lifecycle --------------------------------------------------------------------------
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
        cfg = self.config
        s = cfg.settings
        sizes = {e.block_size for e in cfg.engines if e.block_size}
        if len(sizes) > 1:
            raise ConfigError(f"engines publish different KV block sizes {sorted(sizes)}")
        block_tokens = s.block_tokens or (sizes.pop() if sizes else None)
        if block_tokens is None:
            raise ConfigError(
                "no engine advertises its KV block size (kv_events.block_size in /server_info);"
                " set [cluster] block_tokens to the engines' --page-size"
            )
        if sizes and block_tokens not in sizes and s.block_tokens is not None:
            raise ConfigError(
                f"[cluster] block_tokens = {block_tokens} but the engines' page size is "
                f"{sizes.pop()}: request paths would never match the stored blocks"
            )
        phases: dict[int, Phase] = {e.node_id: e.role for e in cfg.engines}  # type: ignore[misc]
        if "prefill" not in phases.values() or "decode" not in phases.values():
            raise ConfigError(
                f"a PD cluster needs a prefill and a decode engine; roles are {phases}"
            )
        from cluster.sim.profiles import load_profile

        model = load_profile(s.profile).node_model()
        self.run_start_wall = time.time()
        if self.db_path is not None:
            from telemetry import TelemetryWriter

            config_json: dict[str, Any] = {
                "cluster": dataclasses.asdict(s) | {"block_tokens": block_tokens},
                "engines": [dataclasses.asdict(e) for e in cfg.engines],
                "cluster_file": cfg.source,
            }
            config_json["cluster"].pop("api_key", None)
            self.writer = TelemetryWriter(
                self.db_path,
                run_id=self.requested_run_id,
                source="sglang",
                config=config_json,
                started_at=datetime.fromtimestamp(self.run_start_wall, UTC),
            )
            self.run_id = self.writer.run_id
            ids = sorted(phases)
            self.writer.add_nodes(
                {
                    "node_id": ids,
                    "name": [f"node-{n} {self.config_engine(n).http_url}" for n in ids],
                    "hardware": [s.hardware] * len(ids),
                    "moe_top_k": [s.moe_top_k if s.moe_experts else 0] * len(ids),
                    "moe_experts": [s.moe_experts] * len(ids),
                }
            )
            self.sink = LockedSink(self.writer)
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
                phases, {n: model for n in phases}, cp_cfg, sink=self.sink, backend=self
            )
            self.cp.set_planner_mode(self.live.planner_mode)
            self._lock = self.cp.lock
            self.engines = {e.node_id: EngineState(e) for e in cfg.engines}
            self.proxy = PDProxy(self)
            self.fitter = OnlineFitter(
                s.moe_top_k if s.moe_experts else 0, s.moe_experts, min_rows=s.refit_min_rows
            )
            self.split_timeline.append((0.0, *self.cp.split()))
            for n in self.engines:
                self._start_collectors(n)
        except BaseException:
            self._close_collectors()
            if self.sink is not None:
                self.sink.close()
            raise
        self.sim = _PlaneView(self)
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

    def _start_collectors(self, node: int) -> None:
        st = self.engines[node]
        spec = st.spec
        if spec.kv_events:
            st.kv = RestartAwareKVCollector(
                spec.kv_events,
                on_restart=self._on_publisher_restart,
                node_id=node,
                topic=spec.kv_topic,
                replay_endpoint=spec.kv_replay,
                callbacks=[self._on_kv_events],
                sink=self.sink,
                run_start_wall=self.run_start_wall,
                catch_up=self.settings.catch_up,
            ).start()
        else:
            log.warning(
                "engine %d (%s) publishes no KV events (start SGLang with --kv-events-config):"
                " the router sees no prefix on it",
                node,
                spec.http_url,
            )
        if spec.forward_metrics:
            st.fpm = ForwardMetricsCollector(
                spec.forward_metrics,
                node_id=node,
                sink=self.sink,
                callbacks=[self._fpm_callback(node)],
                run_start_wall=self.run_start_wall,
                chunk_tokens=spec.chunk_tokens,
            ).start()
        else:
            log.warning(
                "engine %d (%s) publishes no forward-pass metrics (start SGLang with "
                "--enable-forward-pass-metrics): no iteration rows to fit",
                node,
                spec.http_url,
            )

    def _stop_collectors(self, node: int) -> None:
        st = self.engines[node]
        for col in (st.kv, st.fpm):
            if col is not None:
                col.stop()  # idempotent; its stats stay readable

    def _close_collectors(self) -> None:
        for n in list(self.engines):
            self._stop_collectors(n)

    def restart_collectors(self, node: int, spec: EngineSpec) -> None:
        """New endpoints of a relaunched engine: resubscribe (rows already received stay)."""
        self._stop_collectors(node)
        with self.lock:
            self.engines[node].spec = spec
        self._start_collectors(node)

    def stop(self) -> dict[str, Any] | None:
        """Stop health checks, switches and collectors; consolidate the telemetry run."""
        if self.summary is not None or not self._started:
            return self.summary
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.switcher.join(timeout_s=30)
        self._close_collectors()
        with self.lock:
            self.summary = self._summary()
        if self.sink is not None:
            self.sink.close()
        return self.summary

    def _summary(self) -> dict[str, Any]:
        p = self.proxy
        return {
            "run_id": self.run_id,
            "seconds": self.now(),
            "requests": p.num_requests,
            "completed": self.request_latency.completed,
            "errors": p.num_errors,
            "retries": p.num_retries,
            "switches": self.cp.num_switches,
            "final_split": "{}P{}D".format(*self.cp.split()),
            "telemetry_rejected": 0 if self.sink is None else self.sink.errors,
            "streams": {
                n: {
                    "kv": None if st.kv is None else st.kv.stats.as_dict(),
                    "fpm": None if st.fpm is None else st.fpm.stats.as_dict(),
                }
                for n, st in self.engines.items()
            },
        }

    # ---- engine events (collector threads) ------------------------------------------------
    def _on_kv_events(self, events: list[KVEvent]) -> None:
        with self.lock:
            self.cp.on_kv_events(events)

    def _on_publisher_restart(self, node: int, last: int, seq: int) -> None:
        with self.lock:
            held = self.cp.directory.node_blocks(node)
            self.cp.directory.clear_node(node)
            self.engines[node].restarts_seen += 1
        log.warning(
            "engine %d's KV publisher restarted (seq %d after %d): the engine's cache is "
            "empty, %d stale blocks dropped from the directory",
            node,
            seq,
            last,
            held,
        )

    def _fpm_callback(self, node: int) -> Any:
        def on_metrics(
            m: ForwardPassMetrics, prefill: PrefillRow | None, decode: DecodeRow | None
        ) -> None:
            s = m.scheduled_requests
            with self.lock:
                st = self.engines[node]
                now = self.now()
                st.fpm_t = now
                st.running = s.num_prefill_requests + s.num_decode_requests
                if prefill is not None:
                    st.prefill_iterations += 1
                    self.fitter.add_prefill(node, prefill)
                    self.cp.stats.record_prefill_iteration(
                        node, now, prefill.t_uc, prefill.t_c, prefill.t_rst
                    )
                if decode is not None:
                    st.decode_iterations += 1
                    self.fitter.add_decode(node, decode)
                    st.decode_kv_tokens = decode.ctx_tokens
                self.refresh_report(node)

        return on_metrics

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
            cp = self.cp
            now = self.now()
            # The engine's last pass says how many run; a pass older than a second is stale
            # (an idle engine sends heartbeats, which carry no requests).
            fresh = st.fpm_t is not None and now - st.fpm_t < 1.0
            cp.on_report(
                NodeReport(
                    node_id=node,
                    t=now,
                    phase=cp.state.phases[node],
                    queued=tuple(self.proxy.prefill_queue(node)),
                    remaining_s=0.0,
                    running=max(st.running if fresh else 0, self.proxy.decode_running(node)),
                    seen=None,
                    kv_gpu_used=st.decode_kv_tokens,
                    kv_gpu_capacity=st.spec.kv_capacity_tokens or 0,
                )
            )

    def record_request(self, rec: LiveRequest) -> None:
        """One `requests` row and the rolling latency (the control plane counts q itself)."""
        with self.lock:
            self.request_latency.add(rec)
            if self.sink is None:
                return
            self.sink.emit(
                "requests",
                {
                    "request_id": [rec.request_id],
                    "program_id": [rec.program_id],
                    "branch_id": [rec.branch_id],
                    "t_arrival": [rec.t_arrival],
                    "prefill_node": [rec.prefill_node],
                    "decode_node": [rec.decode_node],
                    "t_in": [rec.t_in],
                    "t_c": [min(rec.cached_tokens, rec.t_in)],
                    "t_fetch": [rec.fetch_tokens],
                    "t_out": [rec.t_out],
                    "t_prefill_start": [rec.t_prefill_start],
                    "t_first_token": [rec.t_first_token],
                    "t_done": [rec.t_done],
                },
            )

    # ---- health ------------------------------------------------------------------------
    def mark_down(self, node: int, reason: str) -> None:
        with self.lock:
            st = self.engines[node]
            st.last_error = reason
            if not st.up:
                return
            st.up = False
            self._sync_availability(node)
        log.warning("engine %d (%s) marked unavailable: %s", node, st.spec.http_url, reason)

    def _mark_up(self, node: int) -> None:
        with self.lock:
            st = self.engines[node]
            st.failures = 0
            if st.up:
                return
            st.up = True
            self._sync_availability(node)
        log.info("engine %d (%s) is healthy again", node, st.spec.http_url)

    def _sync_availability(self, node: int) -> None:
        """Unavailable to the router while down, relaunching or switching (under the lock)."""
        st = self.engines[node]
        unavailable = self.cp.state.unavailable
        if not st.up or st.relaunching or node in self.cp.switches:
            unavailable.add(node)
        else:
            unavailable.discard(node)

    def _loop(self) -> None:
        s = self.settings
        next_flush = next_sample = time.monotonic()
        next_refit = next_flush + s.refit_every_s
        with httpx.Client(timeout=min(2.0, s.health_interval_s * 2)) as client:
            while not self._stop.wait(s.health_interval_s):
                try:
                    self._check_health(client)
                    with self.lock:
                        for n in self.engines:
                            self.refresh_report(n)
                        self.cp.tick(self.now())
                    wall = time.monotonic()
                    if wall >= next_sample:
                        self._sample()
                        next_sample = wall + self.live.sample_every_s
                    if s.refit_every_s > 0 and wall >= next_refit:
                        self.refit_models()
                        next_refit = wall + s.refit_every_s
                    if wall >= next_flush and self.sink is not None:
                        self.sink.flush()
                        next_flush = wall + s.flush_every_s
                except Exception as exc:  # surfaced through /v1/health; the cluster keeps serving
                    log.exception("SGLang cluster loop failed")
                    self.error = f"{type(exc).__name__}: {exc}"

    def refit_models(self) -> dict[int, Any]:
        """Refit every node's models from its recent passes and hand them to the control
        plane (router and planner); returns node -> phases refitted. Runs every
        `refit_every_s` from the health loop; callable at any time."""
        with self.lock:
            models = dict(self.cp.state.models)
            done: dict[int, Any] = {}
            for n in self.engines:
                r = self.fitter.refit(n, models[n])
                if r is None:
                    continue
                for problem in r.problems:
                    log.warning("online refit: %s (the previous model stays)", problem)
                if r.phases:
                    models[n] = r.model
                    done[n] = r.phases
                    self.engines[n].fit = {
                        "t": self.now(),
                        "phases": list(r.phases),
                        "samples": r.samples,
                        "mape": r.mape,
                    }
            if done:
                self.cp.set_models(models)
            return done

    def _check_health(self, client: httpx.Client) -> None:
        for n, st in list(self.engines.items()):
            if st.relaunching:
                continue
            try:
                r = client.get(f"{st.spec.http_url}/health", headers=self.proxy.headers)
                ok, why = r.status_code == 200, f"/health answered {r.status_code}"
            except httpx.HTTPError as e:
                ok, why = False, f"/health failed: {type(e).__name__}: {e}"
            if ok:
                self._mark_up(n)
                continue
            with self.lock:
                st.failures += 1
                st.last_error = why
                failing = st.failures >= self.settings.health_failures
            if failing:
                self.mark_down(n, why)

    def _sample(self) -> None:
        with self.lock:
            now = self.now()
            lat = self.request_latency.stats(now, self._in_flight())
            p, d = self.cp.split()
            self.timeline.append(
                (
                    now,
                    p,
                    d,
                    _nan(lat["ttft_p50_s"]),
                    _nan(lat["ttft_p95_s"]),
                    _nan(lat["e2e_p50_s"]),
                    _nan(lat["throughput_rps"]),
                    sum(len(self.proxy.prefill_queue(n)) for n in self.engines),
                )
            )

    def _in_flight(self) -> int:
        ids = {rid for reqs in self.proxy.inflight.values() for rid in reqs}
        return len(ids)

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
            st.relaunching = False
            if rec.ok:
                if rec.method == "relaunch":
                    self.cp.switches[rec.node_id].mode = "relaunch"
                self.cp.complete_switch(
                    rec.node_id, rec.t_done, drained=rec.drained, lost_kv_blocks=rec.lost_kv_blocks
                )
                self.split_timeline.append((rec.t_done, *self.cp.split()))
            else:
                # No in-place rollback exists in the control plane: forget the pending switch
                # and serve the old phase again.
                self.cp.switches.pop(rec.node_id, None)
            self._sync_availability(rec.node_id)

    # ---- reads of the REST API (LiveCluster's are simulator-specific) -----------------
    def health(self) -> dict[str, Any]:
        with self.lock:
            return {
                "status": "error" if self.error else ("ok" if self._started else "starting"),
                "error": self.error,
                "run_id": self.run_id,
                "db": str(self.db_path.resolve()) if self.db_path is not None else None,
                "time": self.now() if self._started else 0.0,
                "source": "sglang",
                "finished": self.finished,
                "engines_up": sum(1 for e in self.engines.values() if e.up),
                "engines": len(self.engines),
            }

    def node_state(self, node_id: int) -> dict[str, Any]:
        if node_id not in self.engines:
            raise NotFoundError(f"unknown node {node_id}; nodes are {sorted(self.engines)}")
        st = self.engines[node_id]
        cp = self.cp
        sw = cp.switches.get(node_id)
        bt = cp.directory.block_tokens
        queue = len(self.proxy.prefill_queue(node_id))
        blocks = cp.directory.node_blocks(node_id)
        return {
            "id": node_id,
            "phase": cp.state.phases[node_id],
            "switching": switch_state(sw),
            "out_of_service": (not st.up) or st.relaunching,
            "queue": queue,
            "running": max(
                st.running if st.fpm_t is not None and self.now() - st.fpm_t < 1.0 else 0,
                self.proxy.decode_running(node_id),
            ),
            "waiting_kv": 0,
            "kv_gpu_used": blocks * bt + st.decode_kv_tokens,
            "kv_gpu_capacity": st.spec.kv_capacity_tokens or 0,
            "kv_host_used": 0,
            "kv_host_capacity": 0,
            "prefill_iterations": st.prefill_iterations,
            "decode_iterations": st.decode_iterations,
            "url": st.spec.http_url,
            "healthy": st.up,
            "last_error": st.last_error,
            "in_flight": self.proxy.outstanding(node_id),
            "kv_blocks": blocks,
            "kv_stream": None if st.kv is None else st.kv.stats.as_dict(),
            "fpm_stream": None if st.fpm is None else st.fpm.stats.as_dict(),
            "publisher_restarts": st.restarts_seen,
            "last_switch": None if st.last_switch is None else st.last_switch.as_dict(),
            "model": {
                "prefill": list(cp.state.models[node_id].prefill.coef),
                "decode": list(cp.state.models[node_id].decode.coef),
                "mean_new_tokens": cp.state.models[node_id].mean_new_tokens,
                "online_fit": st.fit,
            },
        }

    def cluster(self) -> dict[str, Any]:
        with self.lock:
            if not self._started:
                raise UnavailableError("the SGLang cluster has not started yet")
            cp = self.cp
            p, d = cp.split()
            now = self.now()
            return {
                "time": now,
                "run_id": self.run_id,
                "source": "sglang",
                "speed": 1.0,
                "finished": self.finished,
                "collocated": cp.collocated,
                "split": {"prefill": p, "decode": d},
                "nodes": [self.node_state(n) for n in sorted(self.engines)],
                "latency": self.request_latency.stats(now, self._in_flight()),
                "requests_completed": self.request_latency.completed,
                "requests_failed": self.proxy.num_errors,
                "retries": self.proxy.num_retries,
                "switches": cp.num_switches,
                "planner": {"name": cp.planner.name, "mode": cp.planner_mode},
                "router": self._router_json(),
            }

    def timeline_json(self, since: float = 0.0) -> dict[str, Any]:
        with self.lock:
            cols = ("t", "prefill", "decode", "ttft_p50_s", "ttft_p95_s", "e2e_p50_s",
                    "throughput_rps", "queued")  # fmt: skip
            rows = [r for r in self.timeline if r[0] >= since]
            return {
                "time": self.now(),
                "samples": {c: [_json_num(r[i]) for r in rows] for i, c in enumerate(cols)},
                "split": [
                    {"t": t, "prefill": a, "decode": b}
                    for t, a, b in self.split_timeline
                    if t >= since
                ],
            }


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _json_num(v: float) -> float | None:
    return None if not math.isfinite(v) else float(v)


__all__ = ["SGLangCluster"]
