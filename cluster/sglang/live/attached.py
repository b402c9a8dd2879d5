"""A running vLLM/SGLang fleet watched by pdlab (`pdlab attach`): `ClusterEngines` in shadow mode.

SPEC §6's control server over a fleet pdlab did not start and does not route: the REST
API, dashboard and notebooks read it as they read `pdlab serve`, while its own router
serves the requests. `AttachedFleet` implements `cluster.control.engines.ClusterEngines`
(what the server needs) and `EngineBackend` (phase switches). From the fleet file
(`fleet_file`) it discovers the engines, opens a telemetry run (source 'attach'), and per
engine (`attached_node.AttachedNode`) collects KV events into the KV directory and
`kv_events`, forward passes (SGLang's FPM, pdlab's vLLM step stream) into iteration rows
and online fits (`online_fit`), and /metrics samples into `engine_metrics`. A loop every
`scrape_every_s` checks health, scrapes, reports each node's queue, running requests and
KV to the control plane, feeds the planner the fleet's requests in service and the work of
the requests the counters say finished (`ControlPlane.observe_load`), refits, and updates
the shadow recommendations (`shadow.Shadow`, on GET /v1/cluster under "shadow").

Nothing acts unless asked: the planner may only be "advise" or "off"; a phase switch is
a manual POST, carried out only where the engine supports it (SGLang or pdlab's torch
engine started with --enable-pd-role-switch: POST /pd_role_switch) and refused otherwise
with the reason (409). The fleet's router must learn of a switch itself. Latency on the
dashboard is the decode (or collocated) engines' TTFT/E2E histograms, as a mean per scrape.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from cluster.control.control_plane import ControlPlane, ControlPlaneConfig, SwitchError
from cluster.control.engines import CompletedRequest, NodeStatus, RequestListener
from cluster.control.lock import ContendedRLock
from cluster.control.planning import SwitchMode
from cluster.control.state import NodeReport, QueuedWork
from cluster.core import ConfigError, Phase, TelemetrySink, tee
from cluster.sglang.live.attached_node import AttachedNode, Delta
from cluster.sglang.live.fleet_file import FleetConfig, discover, load_fleet_file
from cluster.sglang.live.online_fit import OnlineFitter
from cluster.sglang.live.shadow import Shadow
from cluster.sglang.live.telemetry_run import LockedSink
from cluster.sglang.wire.fpm import DecodeRow, PrefillRow
from models import attn_pairs

log = logging.getLogger(__name__)
DOWN = "engine down"


class AttachedFleet:
    """See module docstring. Times are seconds since `run_start_wall`."""

    source = "attach"
    speed = 1.0

    def __init__(
        self, config: FleetConfig | str | Path, db_path: str | Path | None = None,
        run_id: str | None = None,
    ) -> None:  # fmt: skip
        cfg = config if isinstance(config, FleetConfig) else load_fleet_file(config)
        self.config = cfg.numbered()
        self.settings = self.config.settings
        self._db_path = Path(db_path) if db_path is not None else None
        self._run_id = run_id
        self.sink: LockedSink | None = None
        self._tap: TelemetrySink | None = None  # the server's metrics (set_telemetry_tap)
        self.cp: ControlPlane = None  # type: ignore[assignment]  # set by start()
        self.nodes: dict[int, AttachedNode] = {}
        self.shadow = Shadow()
        self.lock = ContendedRLock()
        self.run_start_wall = time.time()
        self.requests_observed = 0.0
        self.router_up: bool | None = None
        self._listener: RequestListener | None = None
        self._error: str | None = None
        self._split: list[tuple[float, int, int]] = []
        self._mean_prompt: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prepared = self._started = self._stopped = False
        self.summary: dict[str, Any] | None = None

    # ---- lifecycle --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Discover the engines (ConfigError naming one that cannot be read)."""
        if self._prepared:
            return
        engines = tuple(discover(e) for e in self.config.engines)
        roles = {e.role for e in engines}
        if "null" in roles and len(roles) > 1:
            raise ConfigError(
                f"engines mix collocated (role null) and PD roles {sorted(roles)}; give every "
                "engine its role in the fleet file"
            )
        if roles in ({"prefill"}, {"decode"}):
            raise ConfigError(f"a PD fleet needs prefill and decode engines; roles are {roles}")
        self.config = dataclasses.replace(self.config, engines=engines)
        self._prepared = True

    def block_tokens(self) -> int:
        given = self.settings.block_tokens
        sizes = {e.block_size for e in self.config.engines if e.block_size}
        if given is None and len(sizes) > 1:
            raise ConfigError(f"engines use different KV block sizes {sorted(sizes)}")
        return given or (sizes.pop() if sizes else 16)

    def start(self) -> None:
        if self._started:
            return
        self.prepare()
        from cluster.hardware.profiles import load_profile

        s = self.settings
        engines = self.config.engines
        collocated = all(e.role == "null" for e in engines)
        phases: dict[int, Phase] = {
            e.node_id: ("prefill" if e.role == "null" else e.role)  # type: ignore[misc]
            for e in engines
        }
        model = load_profile(s.profile).node_model()
        self.run_start_wall = time.time()
        if self._db_path is not None:
            self.sink = _open_run(self._db_path, self.config, self._run_id, self.run_start_wall)
        rows = tee(self.sink, self._tap)
        cp_cfg = ControlPlaneConfig(
            block_tokens=self.block_tokens(), router=s.router, planner=s.planner,
            planner_mode="advise", planner_modes=("advise", "off"), window_s=s.window_s,
            slices=s.slices, kv_fetch="none",
        )  # fmt: skip
        try:
            self.cp = ControlPlane(
                phases, dict.fromkeys(phases, model), cp_cfg, sink=rows, backend=self
            )
            if collocated:
                self.cp.start_collocated()
            self.lock = self.cp.lock
            self.fitter = OnlineFitter(
                s.moe_top_k if s.moe_experts else 0, s.moe_experts, min_rows=s.refit_min_rows
            )
            for e in engines:
                node = AttachedNode(
                    e, self.lock, self.now, sink=rows, run_start_wall=self.run_start_wall,
                    catch_up=s.catch_up, on_kv_events=self.cp.on_kv_events,
                    on_restart=self.cp.drop_node_blocks, on_pass=self._on_pass,
                )  # fmt: skip
                self.nodes[node.node_id] = node
                node.start()
        except BaseException:
            for node in self.nodes.values():
                node.stop()
            if self.sink is not None:
                self.sink.close()
            raise
        self._split.append((0.0, *self.cp.split()))
        self._started = True
        self._thread = threading.Thread(target=self._loop, name="pdlab-attach", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        if self.summary is not None or not self._started:
            return self.summary
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for node in self.nodes.values():
            node.stop()
        with self.lock:
            self.summary = {
                "run_id": self.run_id, "seconds": self.now(), "nodes": len(self.nodes),
                "requests_observed": round(self.requests_observed), "switches":
                self.cp.num_switches, "split": "{}P{}D".format(*self.cp.split()),
                "telemetry_rejected": 0 if self.sink is None else self.sink.errors,
            }  # fmt: skip
        if self.sink is not None:
            self.sink.close()
        return self.summary

    # ---- ClusterEngines: identity -------------------------------------------------------
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

    def set_telemetry_tap(self, tap: TelemetrySink) -> None:
        self._tap = tap

    def set_request_listener(self, listener: RequestListener) -> None:
        self._listener = listener

    def now(self) -> float:
        return max(0.0, time.time() - self.run_start_wall)

    def ended(self) -> str | None:
        return "pdlab attach stopped watching the fleet" if self._stopped else None

    def flush_telemetry(self) -> None:
        if self.sink is not None and not self._stopped:
            self.sink.flush()

    # ---- streams (collector threads) ----------------------------------------------------
    def _on_pass(
        self, node: int, now: float, prefill: PrefillRow | None, decode: DecodeRow | None
    ) -> None:
        if prefill is not None:
            self.fitter.add_prefill(node, prefill)
            self.cp.on_prefill_iteration(node, now, prefill.t_uc, prefill.t_c, prefill.t_rst)
        if decode is not None:
            self.fitter.add_decode(node, decode)

    # ---- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        s = self.settings
        next_refit = time.monotonic() + s.refit_every_s
        with httpx.Client(timeout=min(2.0, 2 * s.scrape_every_s)) as client:
            while not self._stop.wait(s.scrape_every_s):
                try:
                    self._tick(client)
                    if s.refit_every_s > 0 and time.monotonic() >= next_refit:
                        self.refit_models()
                        next_refit = time.monotonic() + s.refit_every_s
                except Exception as exc:  # shown on /v1/health; the watch goes on
                    log.exception("attached fleet loop failed")
                    self._error = f"{type(exc).__name__}: {exc}"

    def _tick(self, client: httpx.Client) -> None:
        s = self.settings
        health = {n: node.check(client) for n, node in self.nodes.items()}
        deltas = {n: node.scrape(client) for n, node in self.nodes.items() if health[n]}
        if s.router_url:
            try:
                self.router_up = client.get(f"{s.router_url.rstrip('/')}/health").status_code < 500
            except httpx.HTTPError:
                self.router_up = False
        with self.lock:
            now = self.now()
            for n, ok in health.items():
                self._set_up(n, ok)
            finished = self._finished_work(deltas, now)
            in_flight = sum(nd.running(now) + nd.waiting(now) for nd in self.nodes.values())
            self.cp.observe_load(now, in_flight, finished)
            for n in self.nodes:
                self._report(n, now)
            self.shadow.update(self.cp, now, self._mean_prompt)

    def _set_up(self, n: int, ok: bool) -> None:
        node = self.nodes[n]
        if ok:
            node.failures = 0
            if not node.up:
                node.up = True
                self.cp.mark_available(n, DOWN)
            return
        node.failures += 1
        if node.up and node.failures >= self.settings.health_failures:
            node.up = False
            self.cp.mark_unavailable(n, DOWN)

    def _finished_work(
        self, deltas: dict[int, Delta | None], now: float
    ) -> list[tuple[float, ...]]:
        """The requests the counters say finished since the last scrape, each with the mean
        work of the interval (Eq. 3's t_uc, A, t_c; Eq. 4's t_out, t_acc = 1), and their mean
        TTFT/E2E to the rolling latency. Prompts count where prefill ran (prefill or
        collocated engines), outputs and finishes where decode ran."""
        collocated = self.cp.collocated
        pre = [
            d for n, d in deltas.items() if d and (collocated or self.cp.phase_of(n) == "prefill")
        ]
        dec = [
            d for n, d in deltas.items() if d and (collocated or self.cp.phase_of(n) == "decode")
        ]
        reqs_p = sum(d.requests for d in pre)
        reqs_d = sum(d.requests for d in dec)
        if reqs_p > 0:
            self._mean_prompt = sum(d.prompt_tokens for d in pre) / reqs_p
        k = round(reqs_d)
        if k <= 0 or self._mean_prompt is None:
            return []
        cached = sum(d.cached_tokens for d in pre) / reqs_p if reqs_p > 0 else 0.0
        t_c = min(cached, self._mean_prompt)
        t_uc = max(self._mean_prompt - t_c, 1.0)
        out_tokens = sum(d.generation_tokens for d in dec) / reqs_d
        self.requests_observed += reqs_d
        ttft_n, e2e_n = sum(d.ttft_count for d in dec), sum(d.e2e_count for d in dec)
        if self._listener is not None and e2e_n > 0:
            e2e = sum(d.e2e_sum for d in dec) / e2e_n
            ttft = sum(d.ttft_sum for d in dec) / ttft_n if ttft_n > 0 else None
            for _ in range(k):
                t0 = max(now - e2e, 0.0)
                self._listener(CompletedRequest(t0, None if ttft is None else t0 + ttft, now))
        return [(t_uc, attn_pairs(t_uc, t_c), t_c, max(out_tokens, 1.0), 1.0)] * k

    def _report(self, n: int, now: float) -> None:
        node = self.nodes[n]
        if not node.up:
            return
        mean = self._mean_prompt or 0.0
        waiting = node.waiting(now)
        queued = tuple(QueuedWork(f"q{n}-{i}", max(mean, 1.0), 0.0) for i in range(waiting))
        self.cp.on_report(NodeReport(
            node_id=n, t=now, phase=self.cp.phase_of(n), queued=queued, remaining_s=0.0,
            running=node.running(now), seen=None, kv_gpu_used=node.kv_used_tokens(),
            kv_gpu_capacity=node.spec.kv_capacity_tokens or 0,
        ))  # fmt: skip

    def refit_models(self) -> dict[int, Any]:
        with self.lock:
            models = self.cp.models()
            refits = self.fitter.refit_all(models)
            for n, r in refits.items():
                models[n] = r.model
                self.nodes[n].fit = {"t": self.now(), "phases": list(r.phases),
                                     "samples": r.samples, "mape": r.mape}  # fmt: skip
            if refits:
                self.cp.set_models(models)
            return {n: r.phases for n, r in refits.items()}

    # ---- EngineBackend ---------------------------------------------------------------------
    def begin_switch(self, node: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        why = self.switch_refusal(node)
        if why is not None:
            self.cp.cancel_switch(node)  # nothing began: the node keeps its phase
            raise SwitchError(why)
        threading.Thread(
            target=self._switch, args=(node, to_phase), name=f"pdlab-attach-switch-{node}",
            daemon=True,
        ).start()  # fmt: skip

    def switch_refusal(self, node: int) -> str | None:
        """Why `node` cannot switch phase (None when it can)."""
        e = self.nodes[node].spec
        if e.kind == "vllm":
            return (
                f"node {node} ({e.url}) is vLLM: a running vLLM instance cannot switch between "
                "prefill and decode (its kv_role is fixed at launch)"
            )
        if not e.enable_pd_role_switch:
            return f"node {node} ({e.url}) was not started with --enable-pd-role-switch"
        return None

    def _switch(self, node: int, to_phase: Phase) -> None:
        e = self.nodes[node].spec
        t0 = self.now()
        try:
            r = httpx.post(f"{e.url.rstrip('/')}/pd_role_switch", json={"new_role": to_phase},
                           timeout=self.settings.switch_timeout_s)  # fmt: skip
            ok = r.status_code == 200 and bool(r.json().get("success"))
            detail = r.json().get("message", "") if r.headers.get("content-type", "").startswith(
                "application/json") else r.text  # fmt: skip
        except (httpx.HTTPError, ValueError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        with self.lock:
            rec = {"to_phase": to_phase, "t_decided": t0, "t_done": self.now(), "ok": ok,
                   "message": str(detail)[:300]}  # fmt: skip
            self.nodes[node].last_switch = rec
            if ok:
                self.nodes[node].spec = dataclasses.replace(e, role=to_phase)
                self.cp.complete_switch(node, self.now())
                self._split.append((self.now(), *self.cp.split()))
            else:
                self.cp.cancel_switch(node)

    # ---- ClusterEngines: reads (lock held) ---------------------------------------------------
    def node_ids(self) -> list[int]:
        return sorted(self.nodes)

    def node_status(self, node: int) -> NodeStatus:
        nd, now = self.nodes[node], self.now()
        model = self.cp.models()[node]
        e = nd.spec
        return NodeStatus(
            out_of_service=not nd.up, queue=nd.waiting(now), running=nd.running(now),
            waiting_kv=0, kv_gpu_used=nd.kv_used_tokens(),
            kv_gpu_capacity=e.kv_capacity_tokens or 0, kv_host_used=0, kv_host_capacity=0,
            prefill_iterations=nd.prefill_iterations, decode_iterations=nd.decode_iterations,
            extras={
                "url": e.url, "kind": e.kind, "role": e.role, "healthy": nd.up,
                "last_error": nd.last_error, "can_switch": self.switch_refusal(node) is None,
                "switch_refusal": self.switch_refusal(node), "streams": nd.streams(),
                "kv_blocks": self.cp.node_blocks(node), "last_switch": nd.last_switch,
                "model": {"prefill": list(model.prefill.coef), "decode": list(model.decode.coef),
                          "online_fit": nd.fit},
            },
        )  # fmt: skip

    def in_flight(self) -> int:
        now = self.now()
        return sum(n.running(now) + n.waiting(now) for n in self.nodes.values())

    def split_timeline(self) -> list[tuple[float, int, int]]:
        return self._split

    def health_details(self) -> dict[str, Any]:
        return {
            "source": self.source, "mode": "shadow", "speed": self.speed,
            "engines_up": sum(1 for n in self.nodes.values() if n.up),
            "engines": len(self.config.engines),
            "router": None if not self.settings.router_url else
            {"url": self.settings.router_url, "healthy": self.router_up},
        }  # fmt: skip

    def cluster_details(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "mode": "shadow",
            "requests_observed": round(self.requests_observed),
            "shadow": self.shadow.as_json(self.cp),
        }


def _open_run(db: Path, config: FleetConfig, run_id: str | None, started_wall: float) -> LockedSink:
    from datetime import UTC, datetime

    from telemetry import TelemetryWriter

    s = config.settings
    writer = TelemetryWriter(
        db, run_id=run_id, source="attach", started_at=datetime.fromtimestamp(started_wall, UTC),
        config={"fleet": dataclasses.asdict(s), "fleet_file": config.source,
                "engines": [dataclasses.asdict(e) for e in config.engines]},
    )  # fmt: skip
    engines = sorted(config.engines, key=lambda e: e.node_id or 0)
    writer.add_nodes({
        "node_id": [e.node_id for e in engines],
        "name": [f"node-{e.node_id} {e.kind} {e.url}" for e in engines],
        "hardware": [s.hardware] * len(engines),
        "moe_top_k": [s.moe_top_k if s.moe_experts else 0] * len(engines),
        "moe_experts": [s.moe_experts] * len(engines),
    })  # fmt: skip
    return LockedSink(writer)
