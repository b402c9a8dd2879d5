"""Discrete-event simulator of a PD-disaggregated cluster serving agent programs (SPEC §5).

Paper 000 §4 and §6 (symmetric engines, shared host-memory KV pool, async fetch while a
request queues, phase switches without relaunch), paper 003 §3 (programs as the unit of
work; successor turns released causally, r_{k+1} = c_k + g_k; the Dispatch and Retention
Planes). The control plane of `cluster.control.control_plane` makes every decision,
exactly as it would on a live cluster, and receives the simulated nodes' KV events through
the same batched entry as live engines' (`ControlPlane.on_kv_events`).

This module is the composition root: `Simulator` assembles the layers from a resolved
config (`SimConfig.resolve()`, `resolved`: checks, defaults, profile, policies, workload),
wires the upward signals, and keeps the public face (`run`, `start`, `step_until`,
`finish`, `cp`, `nodes`, `requests`, `now`, ...). The stages share one `StageContext`
(`stage`). The layers, lowest first: `fields` and `resolved` (below `config`), `kernel`
(the event heap), `entities`
(calls, epochs, program runs), `memory` with `tiered_memory` / `unified_memory` (a node's
KV), `node`, the engine (`prefill`, `decode_batch` (a node's decode batch as columns),
`decode`, `mixed`, `engine`: queueing, chunked prefill, transfer, decode epochs,
preemption), `contexts` (turn contexts, the ideal cache), `planes` (PCBs and policy hooks),
`orchestrator` (arrivals, release, completion), `drain` (phase switches: a node drained,
then turned; the end of the warmup, with `warmup`'s fit) and `metrics` (the summary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.control import ControlPlane, ControlPlaneConfig, SwitchMode
from cluster.core import KVEvent, NullSink, Phase, TelemetrySink, parse_split
from cluster.kv.eviction import EVICTION_POLICIES, EvictionPolicy
from cluster.sim.buffer import BufferedSink
from cluster.sim.config import SimConfig
from cluster.sim.contexts import Contexts
from cluster.sim.drain import Switching
from cluster.sim.entities import ProgramRun, SimRequest
from cluster.sim.kernel import TICK, WARMUP, EventKernel
from cluster.sim.memory import NodeMemory, Publish, kv_event_rows, retention_caches, tier_caches
from cluster.sim.metrics import RunRecord, summarize
from cluster.sim.node import SimNode
from cluster.sim.node_engine import NodeEngine
from cluster.sim.orchestrator import ProgramOrchestrator
from cluster.sim.planes import PolicyPlanes
from cluster.sim.resolved import ResolvedConfig
from cluster.sim.stage import StageContext
from cluster.sim.tiered_memory import TieredMemory
from cluster.sim.unified_memory import UnifiedMemory
from cluster.sim.warmup import WarmupFit
from cluster.workloads.loops import AdmissionQueue
from models.overheads import with_pass_overheads

__all__ = ["SimConfig", "Simulator", "parse_split"]  # what callers import from here


def _kv_publisher(cp: ControlPlane, out: BufferedSink) -> Publish:
    """KV events enter the control plane (its directory) and, with full telemetry, the
    `kv_events` table."""
    if not out.wants("kv_events"):
        return cp.on_kv_events

    def publish(events: list[KVEvent]) -> None:
        cp.on_kv_events(events)
        out.emit("kv_events", kv_event_rows(events))

    return publish


class Simulator:
    """See module docstring. `run()` returns the summary dict (SPEC §7 keys)."""

    def __init__(
        self,
        config: SimConfig | ResolvedConfig,
        sink: TelemetrySink | None = None,
        progress: Callable[[float], None] | None = None,
        node_offset: int = 0,
    ) -> None:
        """Assemble the layers from `config` resolved (`SimConfig.resolve()`: checks,
        defaults, profile, policies, workload); this only wires them."""
        run = config if isinstance(config, ResolvedConfig) else config.resolve()
        self.cfg = cfg = run.config
        self.profile = profile = run.profile
        self.kv_source = run.kv_source
        self.progress = progress
        skip = (
            frozenset({"kv_events", "branch_counts", "router_decisions"})
            if cfg.telemetry == "compact"
            else frozenset()
        )
        self.out = out = BufferedSink(sink or NullSink(), skip=skip)
        self.node_ids = ids = [node_offset + i for i in range(cfg.nodes)]
        self.initial_phases: dict[int, Phase] = run.initial_phases(ids)
        self.collocated_only = run.collocated_only
        self.retention, self.scheduling, self.dispatch = run.retention, run.scheduling, run.dispatch
        self.fifo = run.fifo
        self.source = run.source
        self.kernel = EventKernel()
        self.nodes: dict[int, SimNode] = {}
        nodes = self.nodes
        ctx = StageContext(run, self.kernel, nodes, out, self.initial_phases)
        contexts = Contexts(
            profile.block_tokens,
            keep_outputs=run.track_kv,
            store_output=lambda n, path, start, t: nodes[n].keep_output(path, start, t),
        )
        self.planes = planes = PolicyPlanes(ctx, contexts)
        self.cp = cp = self._control_plane(run, planes)
        publish = _kv_publisher(cp, out)
        policy = EVICTION_POLICIES.create(cfg.eviction)
        for n in ids:
            memory = self._memory(n, run.unified, policy, publish)
            nodes[n] = SimNode(n, self.initial_phases[n], memory)

        def counts_zeroed(node: int, hashes: list[int]) -> None:
            sim_node = nodes.get(node)
            if sim_node is not None:
                sim_node.memory.on_counts_zeroed(hashes)

        cp.add_zero_count_listener(counts_zeroed)
        self.fit = fit = WarmupFit(profile, ids, warm=cfg.warmup_s == 0, form=cfg.fit_form)
        self.engine = engine = NodeEngine(
            ctx, cp, on_prefill_iteration=fit.record_prefill, on_decode_iterations=fit.record_decode
        )
        if cfg.overheads:
            engine.set_overheads(cfg.overheads.sampler(cfg.seed + 1))
        self.switching = switching = Switching(ctx, cp, engine, fit)
        self.orchestrator = orchestrator = ProgramOrchestrator(ctx, cp, engine, contexts, planes)
        # The engine's upward signals.
        engine.on_request_done = orchestrator.complete
        engine.on_switch_ready = switching.on_node_idle
        engine.on_computed = contexts.ideal.update

        self.requests: list[SimRequest] = orchestrator.requests
        self.runs: dict[int, ProgramRun] = planes.runs
        self.program_rows = orchestrator.program_rows
        self.queue_wait = engine.queue_wait
        self.split_timeline = switching.split_timeline
        self.switch_log = switching.switch_log
        self._started = False
        self.run_id: str | None = None  # set by the runner when telemetry goes to a database

    def _control_plane(self, run: ResolvedConfig, planes: PolicyPlanes) -> ControlPlane:
        """The control plane of every decision, as on a live cluster (with the Dispatch
        Plane's router when a dispatch policy is set)."""
        cfg = run.config
        cp_cfg = ControlPlaneConfig(
            block_tokens=run.profile.block_tokens,
            router=cfg.router,
            decode_binder=run.decode_binder,
            planner=cfg.planner,
            window_s=cfg.window_s,
            slices=cfg.slices,
            cooldown_s=cfg.cooldown_s,
            kv_fetch=run.kv_fetch,
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            log_branch_counts=cfg.telemetry == "full",
            log_router_decisions=cfg.telemetry == "full",
            prefill_forms=cfg.prefill_forms or cfg.fit_form != "paper",
            ttft_overhead_s=cfg.overheads.ttft_s if cfg.overheads else 0.0,
        )
        oracle = run.profile.node_model()
        if cfg.overheads:  # the planner's Eq. 3-4 and the router's queue price the passes' CPU
            oracle = with_pass_overheads(oracle, cfg.overheads)
        return ControlPlane(
            dict(self.initial_phases),
            {n: oracle for n in self.node_ids},
            cp_cfg,
            sink=self.out,
            backend=self,
            router=planes.dispatch_router(),
        )

    def _memory(
        self, n: int, unified: bool, policy: EvictionPolicy, publish: Publish
    ) -> NodeMemory:
        """Node n's KV memory: tiered, its tiers keyed by the Retention Plane if it has a
        policy, or one unified pool."""
        cfg, profile = self.cfg, self.profile
        l1 = cfg.l1_tokens or profile.l1_tokens
        l2 = cfg.l2_tokens or profile.l2_tokens
        count_of = self.cp.count_of(n)  # C-level read; absent blocks count 0
        bt = profile.block_tokens
        paged, t_acc = cfg.engine_limits, profile.t_acc  # decode KV grows as generated
        mixed = self.collocated_only  # vLLM V1 collocated: prompts hold KV from admission
        if self.retention is None and not unified:
            gpu, host = tier_caches(n, l1, l2, policy, count_of)
            return TieredMemory(
                n, gpu, host, bt, self.out, publish, paged=paged, t_acc=t_acc, reserve_prompts=mixed
            )
        name = self.retention.name if self.retention is not None else "lru"
        pool, tier2 = retention_caches(
            n,
            l1,
            None if unified else l2,
            name,
            self.kernel.clock,
            count_of,
            self.planes.on_owner_evicted,
        )
        if unified:
            return UnifiedMemory(n, pool, bt, profile.t_acc, self.out, publish, self.fifo)
        return TieredMemory(
            n,
            pool,
            tier2,
            bt,
            self.out,
            publish,
            exact_prefix=True,
            paged=paged,
            t_acc=t_acc,
            reserve_prompts=mixed,
        )

    # ---- running --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Simulate the whole configured duration and return the summary."""
        self.start()
        self.step_until(self.cfg.duration_s)
        return self.finish()

    def start(self) -> None:
        """Schedule the initial events (idempotent)."""
        if self._started:
            return
        self._started = True
        cfg = self.cfg
        kernel = self.kernel
        gain_warmup = cfg.planner == "gain" and cfg.warmup_s > 0 and not self.collocated_only
        if self.collocated_only or gain_warmup:
            self.cp.start_collocated()
        learn = cfg.learn_period_s
        if gain_warmup:
            kernel.push(learn, WARMUP, self.switching.end_warmup)
        elif cfg.warmup_s > 0:
            kernel.push(learn, WARMUP, self.switching.end_learning)
        self.switching.record_split()
        if cfg.planner_tick_s > 0 and not self.collocated_only:
            kernel.push(cfg.planner_tick_s, TICK, self._tick)
        self.orchestrator.start()

    def step_until(self, t_end: float) -> float:
        """Process every event up to `t_end` (simulated seconds); returns the new time.

        A live server calls this repeatedly to pace the simulation to wall-clock time.
        """
        self.start()
        duration = self.cfg.duration_s
        return self.kernel.step_until(
            min(t_end, duration), self.progress, max(duration / 200.0, 1.0)
        )

    def finish(self) -> dict[str, Any]:
        """Flush telemetry and summarize (the run ends at the current time)."""
        self.out.flush()
        if self.progress is not None:
            self.progress(self.now)
        return summarize(self.record())

    def record(self) -> RunRecord:
        """The run so far as a plain record (what `summarize` reads)."""
        cp = self.cp
        return RunRecord(
            config=self.cfg,
            run_id=self.run_id,
            profile=self.profile.name,
            kv_fetch=cp.config.kv_fetch,
            sim_seconds=self.now,
            wall_seconds=self.wall_s,
            events=self.events_processed,
            requests=self.requests,
            queue_wait=self.queue_wait,
            split=cp.split(),
            collocated=cp.collocated,
            split_timeline=self.split_timeline,
            switch_log=self.switch_log,
            switch_rows=self.switch_rows(),
            program_rows=self.program_rows,
            finished_programs=self.finished_programs,
            preemptions=self.preemptions,
            retention=self.retention.name if self.retention is not None else None,
            scheduling=self.scheduling.name,
            dispatch=self.dispatch.name if self.dispatch is not None else None,
            trace=self.orchestrator.trace_replay(),
            limits=self._limits() if self.cfg.engine_limits else None,
            forms=self.fit.forms() if self.cfg.fit_form != "paper" else None,
        )

    def _limits(self) -> dict[str, Any]:
        """The engine limits in force and the queueing they caused (the summary's)."""
        p = self.profile
        return {
            "max_num_seqs": p.max_decode_batch,
            "max_num_batched_tokens": p.chunk_tokens,
            "kv_tokens_per_node": self.cfg.l1_tokens or p.l1_tokens,
            "kv_source": self.kv_source,
            "prefill_seat_waits": self.engine.prefill.seat_waits,
            "mixed_iterations": self.engine.mixed.iterations,
            "priced_by": "measured grid" if self.engine.prefill.pricer else "profile forms",
        }

    def _tick(self) -> None:
        """The planner's clock (Alg. E.3), and the closed loop's concurrency target."""
        now = self.kernel.now
        self.cp.tick(now)
        self.orchestrator.top_up()
        self.kernel.push(now + self.cfg.planner_tick_s, TICK, self._tick)

    def begin_switch(self, node_id: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """EngineBackend of the control plane (see `Switching.begin_switch`)."""
        self.switching.begin_switch(node_id, to_phase, mode, now)

    # ---- the public face read by the runner, the live server and notebooks ------------------
    @property
    def now(self) -> float:
        return self.kernel.now

    @property
    def trace_finished(self) -> bool:
        """A trace replayed at its arrival times was served completely: the run ended at
        its last request's completion (`now`), before the configured duration."""
        return self.kernel.halted

    @property
    def events_processed(self) -> int:
        return self.kernel.events_processed

    @property
    def wall_s(self) -> float:
        return self.kernel.wall_s

    @property
    def preemptions(self) -> int:
        return self.engine.preemptions

    @property
    def finished_programs(self) -> int:
        return self.orchestrator.finished_programs

    @property
    def admission(self) -> AdmissionQueue | None:
        return self.orchestrator.admission

    @property
    def warm(self) -> bool:
        return self.fit.warm

    @property
    def fit_report(self) -> dict[str, Any]:
        return self.fit.report

    def switch_rows(self) -> list[dict[str, Any]]:
        return self.switching.rows

    def node_status(self, node_id: int) -> dict[str, Any]:
        """What a live view shows of one node: service, queues, batches, KV tiers, iterations."""
        return self.nodes[node_id].status()
