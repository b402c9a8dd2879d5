"""Discrete-event simulator of a PD-disaggregated cluster serving agent programs (SPEC §5).

Paper 000 §4 and §6 (symmetric engines, shared host-memory KV pool, async fetch while a
request queues, phase switches without relaunch), paper 003 §3 (programs as the unit of
work; successor turns released causally, r_{k+1} = c_k + g_k). The control plane of
`cluster.control_plane` makes every decision, exactly as it would on a live cluster.

Engines: chunked prefill (8,192-token chunks) with continuous batching, prefix reuse from
local L1/L2 and from peers' L2 (fetched while the request queues), the decode node bound
when prefill starts, KV handed over at prefill end, decode batches whose iteration times
come from the hardware profile's ground truth (with a context term and noise the fitted
model omits). Decode runs in epochs: between joins and leaves the batch is fixed, so a run
of iterations is computed (and logged) at once and cut at the next iteration boundary when
the batch changes. Events order by (time, priority, sequence).

Program-level policy planes (paper 003 §3, `cluster.policies`): every program has a
Program Control Block updated at release, completion and memory-pressure events. The
Dispatch Plane assigns each released call a priority q (node queues and decode admission
follow it; FCFS, the default, keeps the historical FIFO) and optionally routes it (a
`select` policy in place of the PD router); the Retention Plane decides at completion what
happens to the program's KV across the tool gap (protect / release / evict), and the tiers
reclaim by (1[t < d], v). Without a retention policy the tiers keep the `--eviction` policy
exactly as before. `host_kv=False` (collocated only) models one engine with a single GPU
KV pool (paper 003's memory-pressure regime): KV is allocated as tokens are prefilled and
generated (not from the hidden output length), and when a decode step cannot get memory
the running call with the largest q is preempted and later recomputed, like vLLM.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cluster.control_plane import ControlPlane, ControlPlaneConfig
from cluster.core import ConfigError, NullSink, Phase, TelemetrySink
from cluster.eviction import EVICTION_POLICIES, Evicted
from cluster.hashing import ContextHasher, prefix_in
from cluster.planning import SwitchMode
from cluster.policies.dispatch import DispatchRouter
from cluster.policies.kv_pool import RetentionCache
from cluster.policies.loader import LoadedPolicy, load_policy
from cluster.policies.pcb import ProgramControlBlock, Signals, write_pcb
from cluster.policies.retention import RELEASE, RetentionDecision, normalize_decision
from cluster.policies.scheduling import FCFS, check_priority
from cluster.sim.buffer import BufferedSink
from cluster.sim.config import SimConfig, _spec, parse_split
from cluster.sim.engine import DecodeEpoch, SimNode, SimRequest
from cluster.sim.profiles import HardwareProfile, load_profile
from cluster.sim.programs import ProgramRun
from cluster.sim.warmup import fit_node_models
from cluster.state import NodeReport, QueuedWork, RouteRequest
from cluster.workloads import make_workload
from cluster.workloads.loops import AdmissionQueue, OpenLoop
from cluster.workloads.program import Program, Segment
from models import NodeModel

# Event priorities at equal times: completions before new arrivals before planning.
_FETCH, _TRANSFER, _PREFILL_END, _DECODE_END, _SWITCH_DONE, _RELEASE, _ARRIVAL, _WARMUP, _TICK = (
    range(9)
)

DEFAULT_FETCH = {"ttft": "async"}  # other routers: engines with private caches (SGLang PD)
DEFAULT_BINDER = {"ttft": "fewest"}  # other routers: the gateway's round-robin decode routing


def branch_key(program_id: str, branch: str) -> str:
    """The cluster-wide branch ID the simulated harness tags requests with.

    Workloads name branches within their program ('root', 'sub0.1'); the control plane's
    branch table (Alg. E.1) needs IDs unique across the cluster, as a live harness sends.
    """
    return f"{program_id}/{branch}"


class Simulator:
    """See module docstring. `run()` returns the summary dict (SPEC §7 keys)."""

    def __init__(
        self,
        config: SimConfig,
        sink: TelemetrySink | None = None,
        progress: Callable[[float], None] | None = None,
        node_offset: int = 0,
    ) -> None:
        config.validate()
        self.cfg = cfg = config
        self.profile = (
            cfg.profile if isinstance(cfg.profile, HardwareProfile) else load_profile(cfg.profile)
        )
        self.rng = np.random.default_rng(cfg.seed)
        self.progress = progress
        skip = (
            frozenset({"kv_events", "branch_counts", "router_decisions"})
            if cfg.telemetry == "compact"
            else frozenset()
        )
        self.out = BufferedSink(sink or NullSink(), skip=skip)
        self.bt = self.profile.block_tokens
        ids = [node_offset + i for i in range(cfg.nodes)]
        self.node_ids = ids
        split = parse_split(cfg.split, cfg.nodes)
        self.initial_phases: dict[int, Phase] = (
            {n: ("prefill" if i < split[0] else "decode") for i, n in enumerate(ids)}
            if split
            else {n: "prefill" for n in ids}
        )
        self.collocated_only = split is None
        router = cfg.router
        # Program-level policy planes (paper 003 §3).
        self.retention: LoadedPolicy | None = (
            None
            if cfg.retention is None
            else load_policy("retention", _spec(cfg.retention), cfg.retention_params)
        )
        self.scheduling = load_policy("scheduling", _spec(cfg.scheduling), cfg.scheduling_params)
        self.dispatch: LoadedPolicy | None = (
            None
            if cfg.dispatch is None
            else load_policy("dispatch", _spec(cfg.dispatch), cfg.dispatch_params)
        )
        self.unified = not cfg.host_kv
        self.planes = self.retention is not None or self.unified
        # The default FCFS keeps each node's queue in arrival order (the historical FIFO).
        self.fifo = type(self.scheduling.instance) is FCFS
        kv_fetch = cfg.kv_fetch or DEFAULT_FETCH.get(router, "none")
        if self.unified:
            if cfg.kv_fetch not in (None, "none"):
                raise ConfigError(
                    "host_kv=False has no shared host pool to fetch from; use --kv-fetch none"
                )
            kv_fetch = "none"
        self.runs: dict[int, ProgramRun] = {}  # active programs by uid
        self.pcb_by_program: dict[str, ProgramControlBlock] = {}
        self.program_rows: list[tuple[float, float, int, int, float]] = []
        self.arrivals = 0
        self.preemptions = 0
        dispatch_router = None
        if self.dispatch is not None:
            dispatch_router = DispatchRouter(
                self.dispatch.instance,
                self.dispatch.hooks["select"],
                self.pcb_by_program.__getitem__,
                lambda n: self.nodes[n].inflight(),
                (lambda now: self._signals(None)) if self.dispatch.uses_signals else None,
            )
        cp_cfg = ControlPlaneConfig(
            block_tokens=self.bt,
            router=router,
            decode_binder=cfg.decode_binder or DEFAULT_BINDER.get(router, "round-robin"),
            planner=cfg.planner,
            window_s=cfg.window_s,
            slices=cfg.slices,
            cooldown_s=cfg.cooldown_s,
            kv_fetch=kv_fetch,
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            log_branch_counts=cfg.telemetry == "full",
            log_router_decisions=cfg.telemetry == "full",
        )
        oracle = self.profile.node_model()
        self.cp = ControlPlane(
            dict(self.initial_phases),
            {n: oracle for n in ids},
            cp_cfg,
            sink=self.out,
            backend=self,
            router=dispatch_router,
        )
        policy = EVICTION_POLICIES.create(cfg.eviction)
        l1 = cfg.l1_tokens or self.profile.l1_tokens
        l2 = cfg.l2_tokens or self.profile.l2_tokens
        d = self.cp.directory
        self.nodes: dict[int, SimNode] = {}
        for n in ids:
            caches = self._plane_caches(n, l1, l2) if self.planes else None
            self.nodes[n] = SimNode(
                n, self.initial_phases[n], l1, l2, policy, functools.partial(d.count, n), caches
            )
        d.zero_listeners.append(self._on_zeroed)
        self.source = make_workload(
            cfg.workload, seed=cfg.seed, duration_s=cfg.duration_s, **cfg.workload_params
        )
        self.heap: list[tuple[Any, ...]] = []
        self.seq = 0
        self.now = 0.0
        self.ideal: set[int] = set()
        self.requests: list[SimRequest] = []
        self.next_uid = 0
        self.active_programs = 0
        self.finished_programs = 0
        self.admission: AdmissionQueue | None = None
        self.epoch_token = 0
        self.split_timeline: list[tuple[float, int, int]] = []
        self.switch_log: list[dict[str, Any]] = []
        self._switch_rows: list[dict[str, Any]] = []
        self.fit_report: dict[str, Any] = {}
        self.warm = cfg.warmup_s == 0
        # In-memory iteration logs for the online fit at the end of warmup.
        self._fit_prefill: dict[int, list[tuple[float, float, float, float]]] = {n: [] for n in ids}
        self._fit_decode: dict[int, list[np.ndarray]] = {n: [] for n in ids}
        self.queue_wait: dict[int, list[float]] = {n: [] for n in ids}
        self.events_processed = 0
        self.wall_s = 0.0
        self._started = False
        self.run_id: str | None = None  # set by the runner when telemetry goes to a database

    def _plane_caches(self, n: int, l1: int, l2: int) -> tuple[RetentionCache, RetentionCache]:
        """Tiers keyed by the Retention Plane; one GPU pool when there is no host tier."""
        name = self.retention.name if self.retention is not None else "lru"
        d = self.cp.directory

        def make(tier: str, cap: int) -> RetentionCache:
            c = RetentionCache(n, tier, cap, name, self._clock, lambda h: d.count(n, h))  # type: ignore[arg-type]
            c.on_owner_evicted = self._on_owner_evicted
            return c

        gpu = make("gpu", l1)
        return (gpu, gpu) if self.unified else (gpu, make("host", l2))

    def _clock(self) -> float:
        return self.now

    # ---- kernel ------------------------------------------------------------------------
    def _at(self, t: float, prio: int, fn: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, prio, self.seq, fn, args))

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
        self._start()

    def step_until(self, t_end: float) -> float:
        """Process every event up to `t_end` (simulated seconds); returns the new time.

        A live server calls this repeatedly to pace the simulation to wall-clock time.
        """
        self.start()
        t_end = min(t_end, self.cfg.duration_s)
        wall0 = time.perf_counter()
        heap = self.heap
        progress = self.progress
        next_progress = self.now
        step = max(self.cfg.duration_s / 200.0, 1.0)
        while heap and heap[0][0] <= t_end:
            t, _, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)
            self.events_processed += 1
            if progress is not None and t >= next_progress:
                progress(t)
                next_progress = t + step
        self.now = max(self.now, t_end)
        self.wall_s += time.perf_counter() - wall0
        return self.now

    def finish(self) -> dict[str, Any]:
        """Flush telemetry and summarize (the run ends at the current time)."""
        self.out.flush()
        if self.progress is not None:
            self.progress(self.now)
        from cluster.sim.metrics import summarize

        return summarize(self)

    def _start(self) -> None:
        cfg = self.cfg
        gain_warmup = cfg.planner == "gain" and cfg.warmup_s > 0 and not self.collocated_only
        if self.collocated_only or gain_warmup:
            self.cp.start_collocated()
        learn = cfg.warmup_s if cfg.learn_s is None else cfg.learn_s
        if gain_warmup:
            self._at(learn, _WARMUP, self._end_warmup)
        elif cfg.warmup_s > 0:
            self._at(learn, _WARMUP, self._fit_only)
        self._record_split()
        if cfg.planner_tick_s > 0 and not self.collocated_only:
            self._at(cfg.planner_tick_s, _TICK, self._tick)
        trace = self.source.trace_programs()
        if trace is not None and any(p.arrival_s is not None for p in trace):
            for p in trace[: cfg.max_programs]:
                if p.arrival_s is not None and p.arrival_s < cfg.duration_s:
                    self._at(p.arrival_s, _ARRIVAL, self._arrive, p, p.arrival_s)
            return
        if cfg.arrival_rate_per_min is not None:
            loop = OpenLoop(cfg.arrival_rate_per_min / 60.0, cfg.max_active)
            self.admission = AdmissionQueue(loop.max_active)
            for t in loop.arrivals(cfg.seed, cfg.duration_s):
                self._at(t, _ARRIVAL, self._open_arrival, t)
            return
        agents = cfg.agents or 1
        self._trace_iter = iter(trace) if trace is not None else None
        for i in range(agents):
            t = cfg.stagger_s * i / agents
            self._at(t, _ARRIVAL, self._closed_arrival, t)

    def _new_program(self, now: float) -> Program | None:
        if getattr(self, "_trace_iter", None) is not None:
            try:
                return next(self._trace_iter)  # type: ignore[arg-type]
            except StopIteration:
                return None
        return self.source.next_program(now)

    def _admits_more(self) -> bool:
        cap = self.cfg.max_programs
        return cap is None or self.arrivals < cap

    def _closed_arrival(self, t: float) -> None:
        if not self._admits_more():
            return
        p = self._new_program(self.now)
        if p is not None:
            self.arrivals += 1
            self._arrive(p, t)

    def _open_arrival(self, t: float) -> None:
        assert self.admission is not None
        if not self._admits_more():
            return
        self.arrivals += 1
        for arrived, p in self.admission.arrive(t, self.source.next_program(t)):
            self._arrive(p, arrived)

    def _arrive(self, program: Program, arrival: float) -> None:
        run = ProgramRun(program, self.next_uid, arrival)
        self.next_uid += 1
        self.active_programs += 1
        self.runs[run.uid] = run
        self.pcb_by_program[program.program_id] = run.pcb
        for i, turn in enumerate(program.turns):
            if not turn.deps:
                self._at(
                    self.now + turn.gap_s,
                    _RELEASE,
                    self._release,
                    run,
                    i,
                    arrival if i == 0 else None,
                )

    def _program_done(self, run: ProgramRun) -> None:
        run.finish_t = now = self.now
        self.active_programs -= 1
        self.finished_programs += 1
        pcb = run.pcb
        write_pcb(pcb, finished=True, in_tool=False, branch_ids=())
        if self.retention is not None:
            # A finished program's protection lapses (the harness ends the session).
            for nodes, path in run.kv_paths.values():
                self._retain(run, nodes, path, RELEASE)
        self.runs.pop(run.uid, None)
        if self.pcb_by_program.get(pcb.program_id) is pcb:
            del self.pcb_by_program[pcb.program_id]
        turns = len(run.program.turns)
        self.program_rows.append((run.arrival, now, turns, run.preemptions, pcb.attained_service_s))
        self.out.row(
            "programs",
            program_id=pcb.program_id,
            workload=pcb.workload,
            t_arrival=run.arrival,
            t_done=now,
            jct_s=now - run.arrival,
            turns=turns,
            preemptions=run.preemptions,
            attained_service_s=pcb.attained_service_s,
        )
        if self.admission is not None:
            for arrived, p in self.admission.finish():
                self._arrive(p, arrived)
            return
        if self.cfg.agents is not None and self.active_programs < self._target_agents():
            self._closed_arrival(self.now)

    def _target_agents(self) -> int:
        """Closed-loop concurrency now: --agents, scaled by the workload's own schedule
        (shift: 288 -> 216 -> 144 agents in paper 000 §6.1 becomes N -> 0.75N -> 0.5N)."""
        agents = self.cfg.agents or 0
        prescribed = self.source.target_concurrency(self.now)
        first = self.source.target_concurrency(0.0)
        if prescribed is None or not first:
            return agents
        return max(1, round(agents * prescribed / first))

    # ---- turns -------------------------------------------------------------------------
    def _context(self, run: ProgramRun, i: int) -> ContextHasher:
        """Form the turn's context per the program model (cluster/workloads/program.py)."""
        turn = run.program.turns[i]
        kind = turn.kind
        if kind in ("start", "subagent"):
            h = ContextHasher(self.bt)
        elif kind == "fork":
            assert turn.parent_turn is not None
            h = self._with_output(run, turn.parent_turn).copy()
        else:
            last = run.branch_last.get(turn.branch_id)
            if last is None:
                raise ConfigError(
                    f"program {run.program.program_id} turn {i}: {kind} of unknown branch {turn.branch_id}"
                )
            if kind == "compact":
                h = run.branch_ctx[turn.branch_id].truncated(turn.compact_keep)
            else:
                h = self._with_output(run, last)
                if last in run.snapshots:
                    h = h.copy()  # the snapshot also serves forks of that turn
        h.extend(turn.append)
        return h

    def _with_output(self, run: ProgramRun, j: int) -> ContextHasher:
        """The branch context of turn j extended by its output (what successors reuse).

        The output's blocks were produced when turn j completed; they join the ideal set and
        the host memory of the decode node that produced them, stamped with that time.
        """
        snap = run.snapshots.get(j)
        if snap is not None:
            return snap
        turn = run.program.turns[j]
        h = run.branch_ctx[turn.branch_id]
        if j in run.outputs_added:
            return h  # the planes appended the output when the call completed
        if j in run.fork_parents:
            h = h.copy()
            run.snapshots[j] = h
        elif self.planes:
            run.outputs_added.add(j)
        if turn.output_tokens > 0:
            start = len(h.hashes)
            new = h.extend([Segment(turn.output_seg, turn.output_tokens)])
            self.ideal.update(new)
            node = run.out_node.get(j)
            done = run.t_done[j]
            if new and node is not None and done is not None:
                n = self.nodes[node]
                if n.cleared_at < done and not n.out_of_service:  # still holds that KV
                    self._store(n, h.hashes, start, None, done)
        return h

    def _release(self, run: ProgramRun, i: int, arrival: float | None) -> None:
        turn = run.program.turns[i]
        now = self.now
        h = self._context(run, i)
        run.branch_ctx[turn.branch_id] = h
        run.branch_last[turn.branch_id] = i
        path = list(h.hashes)
        t_in = h.tokens
        ideal_blocks = self._ideal_prefix(path)
        rid = f"{run.program.program_id}/{i}"
        bid = branch_key(run.program.program_id, turn.branch_id)
        req = SimRequest(
            rid,
            run,
            i,
            bid,
            path,
            t_in,
            turn.output_tokens,
            arrival if arrival is not None else now,
            0,
        )
        req.t_ideal_c = min(ideal_blocks * self.bt, max(t_in - 1, 0))
        req.measured = req.t_arrival >= self.cfg.warmup_s
        req.t_release = now
        req.seq = len(self.requests)
        self.requests.append(req)
        self._on_release(run, turn, req)
        kind = turn.kind if turn.kind in ("start", "fork", "subagent") else "start"
        rr = RouteRequest(rid, run.program.program_id, bid, path, t_in, now)
        parent = turn.parent_branch
        decision = self.cp.admit(
            rr,
            branch_kind=kind,
            parent_id=None if parent is None else branch_key(run.program.program_id, parent),
        )
        self._enqueue(req, decision.node_id, decision.cached_tokens, decision.fetch_tokens)

    def _ideal_prefix(self, path: list[int]) -> int:
        return prefix_in(path, self.ideal)

    def _enqueue(self, req: SimRequest, node_id: int, cached: int, fetch: int) -> None:
        node = self.nodes[node_id]
        req.prefill_node = node_id
        req.t_routed = self.now
        req.route_t_c = cached + fetch
        req.route_t_uc = max(req.t_in - req.route_t_c, 1)
        req.fetch_tokens = fetch
        if fetch and self.cp.config.kv_fetch == "async":
            req.fetch_ready_t = self.now + self.profile.fetch_time(fetch)
            self._at(req.fetch_ready_t, _FETCH, self._fetch_done, req, node_id)
        else:
            req.fetch_ready_t = self.now
        self._queue_insert(node, req)
        self._schedule(node)

    def _queue_insert(self, node: SimNode, req: SimRequest, front: bool = False) -> None:
        """FCFS (the default) appends; other policies keep the queue sorted by q, release."""
        if self.fifo:
            if front:
                node.queue.insert(0, req)
            else:
                node.queue.append(req)
        else:
            bisect.insort(node.queue, req, key=SimRequest.sort_key)

    def _fetch_done(self, req: SimRequest, node_id: int) -> None:
        if req.prefill_node != node_id or req.t_prefill_start is not None:
            return  # re-routed meanwhile, or already started
        node = self.nodes[node_id]
        blocks = req.path[: req.route_t_c // self.bt]
        self._store(
            node,
            blocks,
            node.prefix_blocks(node.l2, blocks),
            node.prefix_blocks(node.l1, blocks),
            self.now,
        )
        self._schedule(node)

    # ---- policy planes (paper 003 §3) ------------------------------------------------------
    def _signals(self, node_id: int | None) -> Signals:
        kv: dict[int, float] = {}
        host: dict[int, float] = {}
        inflight: dict[int, int] = {}
        for n, node in self.nodes.items():
            if node.unified:
                kv[n] = node.l1.utilization  # type: ignore[attr-defined]
                host[n] = 0.0
            else:
                used = node.decode_kv if node.phase == "decode" else node.l1.used_tokens
                kv[n] = used / node.l1.capacity_tokens
                host[n] = node.l2.used_tokens / node.l2.capacity_tokens
            inflight[n] = node.inflight()
        tokens = 0
        if node_id is not None:
            node = self.nodes[node_id]
            tokens = (
                node.l1.pinned_tokens + node.l1.reserved_tokens  # type: ignore[attr-defined]
                if node.unified
                else node.decode_kv
            )
        c = self.profile.prefill
        return Signals(
            self.now,
            node_id,
            kv,
            host,
            inflight,
            tokens,
            self.profile.chunk_tokens,
            c[1],
            c[0],
            c[2],
        )

    def _on_release(self, run: ProgramRun, turn: Any, req: SimRequest) -> None:
        """PCB at release r_{p,k}; the retention arrival hook; the call's priority q."""
        pcb = run.pcb
        now = self.now
        branches = pcb.branch_ids
        if turn.branch_id not in branches:
            branches = (*branches, turn.branch_id)
        write_pcb(
            pcb,
            turns_released=pcb.turns_released + 1,
            context_tokens=req.t_in,
            last_release_s=now,
            in_tool=False,
            calls_in_flight=pcb.calls_in_flight + 1,
            branch_ids=branches,
            branch_id=turn.branch_id,
        )
        if self.retention is not None:
            decision = self._retention_hook("on_turn_arrival", pcb, req.request_id, pcb.kv_node)
            kv = run.kv_paths.get(turn.branch_id)
            if kv is None and turn.kind == "fork":
                kv = run.kv_paths.get(turn.parent_branch or "")
            if decision is not None and kv is not None:
                self._retain(run, kv[0], kv[1], decision)
        sched = self.scheduling
        if sched.uses_signals:
            sched.instance.signals = self._signals(None)
        req.priority = check_priority(sched.hooks["priority"](pcb, now), sched.name)

    def _retention_hook(
        self, hook: str, pcb: ProgramControlBlock, request_id: str, node: int | None
    ) -> RetentionDecision | None:
        ret = self.retention
        assert ret is not None
        if ret.uses_signals:
            ret.instance.signals = self._signals(node)
        fn = ret.hooks[hook]
        now = self.now
        result = fn(pcb, request_id, now) if hook == "on_turn_complete" else fn(pcb, now)
        return normalize_decision(result, ret.name, hook)

    def _retain(
        self, run: ProgramRun, nodes: tuple[int, ...], path: list[int], dec: RetentionDecision
    ) -> None:
        """Apply a retention decision to the program's blocks of `path` on `nodes`."""
        now = self.now
        uid = run.uid
        for n in nodes:
            node = self.nodes[n]
            for tier, cache in (("host", node.l2), ("gpu", node.l1)):
                if tier == "host" and node.unified:
                    continue
                assert isinstance(cache, RetentionCache)
                if dec.kind == "protect":
                    cache.protect(path, uid, dec.until, dec.value)  # type: ignore[arg-type]
                elif dec.kind == "release":
                    cache.release(path, uid)
                else:
                    evicted = cache.discard(path, uid)
                    if evicted:
                        self._evicted(node, tier, evicted, now)
        protected = dec.kind == "protect" and dec.until > now  # type: ignore[operator]
        fields: dict[str, Any] = {
            "kv_protected": protected,
            "kv_protected_until": dec.until if protected else None,
            "kv_value": dec.value if protected else None,
        }
        if dec.kind == "evict":
            fields.update(kv_resident=False, kv_resident_tokens=self._resident_tokens(run))
        write_pcb(run.pcb, **fields)

    def _resident_tokens(self, run: ProgramRun) -> int:
        pcb = run.pcb
        kv = run.kv_paths.get(pcb.branch_id) if pcb.branch_id is not None else None
        if kv is None or pcb.kv_node is None:
            return 0
        node = self.nodes[pcb.kv_node]
        return node.prefix_blocks(node.l2, kv[1]) * self.bt

    def _on_owner_evicted(self, uid: int, h: int) -> None:
        """Memory pressure reclaimed a block a program decided on: update its PCB."""
        run = self.runs.get(uid)
        if run is not None and run.pcb.kv_resident:
            write_pcb(run.pcb, kv_resident=False)

    def _planes_complete(self, run: ProgramRun, req: SimRequest, turn: Any) -> None:
        """PCB at completion c_{p,k}; the program's KV enters the cache with the output;
        the retention decision (v, d) for it."""
        now = self.now
        i = req.turn_index
        pcb = run.pcb
        succ = run.succ[i]
        done = run.done_turns == len(run.program.turns)
        branches = pcb.branch_ids
        if turn.finishes_branch or done:
            branches = tuple(b for b in branches if b != turn.branch_id)
        assert req.t_prefill_start is not None
        in_flight = pcb.calls_in_flight - 1
        write_pcb(
            pcb,
            turns_completed=pcb.turns_completed + 1,
            attained_service_s=pcb.attained_service_s + (now - req.t_prefill_start),
            last_decode_node=req.decode_node,
            kv_node=req.decode_node,
            context_tokens=req.t_in + req.t_out,
            # The output names the requested tool; how long it will run stays hidden.
            tool_name=run.program.turns[succ[0]].tool if succ else None,
            tool_started_s=now,
            calls_in_flight=in_flight,
            in_tool=in_flight == 0 and not done,
            last_completion_s=now,
            branch_ids=branches,
            branch_id=turn.branch_id,
            preemptions=run.preemptions,
        )
        if not self.planes:
            return
        dnode = self.nodes[req.decode_node]
        if dnode.unified:
            dnode.l1.touch(req.path, now)  # freed KV is the most recently used (vLLM)
            dnode.pool_release(req)
        path = list(self._with_output(run, i).hashes)
        nodes = (
            (req.decode_node,)
            if req.decode_node == req.prefill_node
            else (req.prefill_node, req.decode_node)
        )
        run.kv_paths[turn.branch_id] = (nodes, path)
        resident = dnode.prefix_blocks(dnode.l2, path)
        write_pcb(pcb, kv_resident=resident == len(path), kv_resident_tokens=resident * self.bt)
        if self.retention is not None and not done:
            decision = self._retention_hook("on_turn_complete", pcb, req.request_id, dnode.id)
            if decision is not None:
                self._retain(run, nodes, path, decision)

    # ---- the unified KV pool: allocation as tokens are generated, preemption --------------
    def _reserve_epoch(self, node: SimNode, k: int) -> int:
        """Reserve KV for up to k decode iterations of the batch, preempting the running call
        with the largest q (then latest release) while not even one iteration fits."""
        l1 = node.l1
        t_acc = self.profile.t_acc
        while True:
            b = len(node.decode_batch)
            fit = int(l1.reservable_tokens // (b * t_acc))  # type: ignore[attr-defined]
            if fit >= 1 or b == 1:
                break
            self._preempt(node, max(node.decode_batch, key=SimRequest.sort_key))
        k = max(1, min(k, fit, min(r.decode_left for r in node.decode_batch)))
        tokens = math.ceil(k * b * t_acc)
        evicted = l1.reserve(tokens, force=True)  # type: ignore[attr-defined]
        if evicted:
            self._evicted(node, "gpu", evicted, self.now)
        node.epoch_reserved = tokens
        return k

    def _preempt(self, node: SimNode, req: SimRequest) -> None:
        """Recompute preemption (vLLM): the call frees its KV and waits to be re-prefilled
        (prompt plus the tokens generated so far), then resumes decoding."""
        node.decode_batch.remove(req)
        node.pool_release(req)
        req.recompute = True
        req.done_uc = 0
        req.fetch_ready_t = self.now
        req.preemptions += 1
        run = req.run
        run.preemptions += 1
        self.preemptions += 1
        write_pcb(run.pcb, preemptions=run.preemptions)
        self._queue_insert(node, req, front=True)

    def _settle_epoch(self, node: SimNode, batch: list[SimRequest], n_it: int) -> None:
        """The epoch's reservation becomes the generated tokens of its calls."""
        l1 = node.l1
        l1.unreserve(node.epoch_reserved)  # type: ignore[attr-defined]
        node.epoch_reserved = 0
        bt = self.bt
        t_acc = self.profile.t_acc
        grow = 0
        for r in batch:
            r.generated = min(r.generated + n_it * t_acc, float(r.t_out))
            want = r.t_in - len(r.path) * bt + math.ceil(r.generated)
            if want > r.kv_private:
                grow += want - r.kv_private
                r.kv_private = want
        evicted = l1.reserve(grow, force=True)  # type: ignore[attr-defined]
        if evicted:
            self._evicted(node, "gpu", evicted, self.now)

    # ---- KV tiers and events -----------------------------------------------------------
    def _store(
        self, node: SimNode, path: list[int], host_from: int, gpu_from: int | None, t: float
    ) -> None:
        """Write path[host_from:] through to L2 and path[gpu_from:] into L1 (None: L2 only).

        Blocks before the start indices are already held (the caller knows its prefix);
        stored and removed blocks are published to the directory as KV events.
        """
        d = self.cp.directory
        bt = self.bt
        if node.unified:
            self._store_pool(
                node, path, host_from if gpu_from is None else min(host_from, gpu_from), t
            )
            return
        tiers = ((node.l2, host_from, "host"), (node.l1, gpu_from, "gpu"))
        for cache, start, tier in tiers:
            if start is None or start >= len(path):
                continue
            hashes = path[start:]
            entries = cache.entries
            new = [h for h in hashes if h not in entries]
            evicted = cache.insert(hashes, bt, t, start)
            if evicted:
                self._evicted(node, tier, evicted, t)
            if new and new[-1] not in entries:  # no room for all (pinned blocks)
                new = [h for h in new if h in entries]
            if new:
                d.store(node.id, new, path[start - 1] if start else 0, tier, t, bt)  # type: ignore[arg-type]
                self._kv_rows(node.id, tier, "stored", new, t)

    def _store_pool(self, node: SimNode, path: list[int], start: int, t: float) -> None:
        """Unified pool: the blocks enter the GPU pool only (there is no host tier)."""
        if start >= len(path):
            return
        hashes = path[start:]
        entries = node.l1.entries
        fresh = [h for h in hashes if h not in entries]
        evicted = node.l1.insert(hashes, self.bt, t, start)
        if evicted:
            self._evicted(node, "gpu", evicted, t)
        stored = [h for h in fresh if h in entries]
        if stored:
            self.cp.directory.store(
                node.id, stored, path[start - 1] if start else 0, "gpu", t, self.bt
            )
            self._kv_rows(node.id, "gpu", "stored", stored, t)

    def _evicted(self, node: SimNode, tier: str, evicted: list[Evicted], t: float) -> None:
        d = self.cp.directory
        policy = node.l2.policy.name if tier == "host" else node.l1.policy.name
        out = self.out
        for ev in evicted:
            out.row(
                "evictions",
                t=t,
                node_id=node.id,
                tier=tier,
                block_hash=ev.block_hash,
                branch_count=ev.branch_count,
                last_access=ev.last_access,
                policy=policy,
            )
            if tier == "host":
                # Keep L1 within L2: a block leaving host memory leaves the node.
                if node.l1.remove(ev.block_hash):
                    d.remove(node.id, ev.block_hash, "gpu")
                d.remove(node.id, ev.block_hash, "host")
            else:
                d.remove(node.id, ev.block_hash, "gpu")
        self._kv_rows(node.id, tier, "removed", [e.block_hash for e in evicted], t)

    def _kv_rows(self, node: int, tier: str, kind: str, hashes: list[int], t: float) -> None:
        if "kv_events" in self.out.skip or not hashes:
            return
        n = len(hashes)
        self.out.emit(
            "kv_events",
            {
                "t": [t] * n,
                "node_id": [node] * n,
                "tier": [tier] * n,
                "kind": [kind] * n,
                "block_hash": hashes,
                "parent_hash": [None] * n,
                "num_tokens": [self.bt] * n,
            },
        )

    def _clear(self, node: SimNode) -> None:
        """The node's KV becomes unreachable (relaunch, stranded switch)."""
        node.l1.clear()
        node.l2.clear()
        node.cleared_at = self.now
        self.cp.directory.clear_node(node.id)
        self.out.row(
            "kv_events",
            t=self.now,
            node_id=node.id,
            tier="host",
            kind="cleared",
            block_hash=None,
            parent_hash=None,
            num_tokens=0,
        )

    def _on_zeroed(self, node: int, hashes: list[int]) -> None:
        n = self.nodes.get(node)
        if n is not None:
            n.l2.on_counts_zeroed(hashes)

    # ---- scheduling -----------------------------------------------------------------
    def _serves_prefill(self, node: SimNode) -> bool:
        return self.cp.collocated or node.phase == "prefill"

    def _serves_decode(self, node: SimNode) -> bool:
        return (
            self.cp.collocated
            or node.phase == "decode"
            or bool(node.decode_batch)
            or bool(node.join_queue)
        )

    def _prefill_ready(self, node: SimNode) -> bool:
        if node.prefilling:
            return True
        now = self.now
        if node.unified:
            # Only if the first ready call (in priority order) gets memory; else decode
            # runs on and frees it.
            for r in node.queue:
                if r.fetch_ready_t <= now:
                    return node.pool_fits(r, self.bt)
            return False
        return any(r.fetch_ready_t <= now for r in node.queue)

    def _schedule(self, node: SimNode) -> None:
        if node.out_of_service or node.busy:
            return
        if node.epoch is not None:
            if node.join_queue or (self._serves_prefill(node) and self._prefill_ready(node)):
                self._cut_epoch(node)
            return
        if (self._serves_prefill(node) or node.prefilling) and self._prefill_ready(node):
            self._start_prefill(node)
            return
        if self._serves_decode(node):
            self._admit_joins(node)
            if node.decode_batch:
                self._start_epoch(node)
                return
        if node.switch is not None and node.idle():
            self._finish_switch(node)

    def _report(self, node: SimNode, remaining_s: float) -> None:
        self.cp.on_report(
            NodeReport(
                node.id,
                self.now,
                node.phase,
                tuple(QueuedWork(r.request_id, r.route_t_uc, r.route_t_c) for r in node.queue),
                remaining_s,
                len(node.decode_batch) if node.phase == "decode" else len(node.prefilling),
                None,
                *self._kv_report(node),
            )
        )

    @staticmethod
    def _kv_report(node: SimNode) -> tuple[int, int, int, int]:
        """(gpu used, gpu capacity, host used, host capacity) for the node's report."""
        if node.unified:
            l1 = node.l1
            return (l1.used_tokens + l1.reserved_tokens, l1.pool_tokens, 0, 0)  # type: ignore[attr-defined]
        return (
            node.decode_kv_tokens if node.phase == "decode" else node.l1.used_tokens,
            node.l1.capacity_tokens,
            node.l2.used_tokens,
            node.l2.capacity_tokens,
        )

    def _noise(self, n: int | None = None) -> Any:
        s = self.profile.noise
        if n is None:
            return float(np.exp(self.rng.normal(0.0, s) - s * s / 2)) if s > 0 else 1.0
        return np.exp(self.rng.normal(0.0, s, n) - s * s / 2) if s > 0 else np.ones(n)

    # ---- prefill -----------------------------------------------------------------------
    def _begin_request(self, node: SimNode, req: SimRequest) -> float:
        """A request's first chunk starts: settle its cached prefix; returns exposed fetch time."""
        bt = self.bt
        exposed = 0.0
        fetch_mode = self.cp.config.kv_fetch
        if fetch_mode == "sync" and req.fetch_tokens:
            exposed = self.profile.fetch_time(req.fetch_tokens)
            blocks = req.path[: req.route_t_c // bt]
            self._store(
                node,
                blocks,
                node.prefix_blocks(node.l2, blocks),
                node.prefix_blocks(node.l1, blocks),
                self.now,
            )
        local = node.prefix_blocks(node.l2, req.path)
        gpu = local if node.unified else node.prefix_blocks(node.l1, req.path)
        t_c = min(local * bt, max(req.t_in - 1, 0))
        req.t_c = t_c
        req.t_uc = req.t_in - t_c
        req.t_rst = min(max(local - gpu, 0) * bt, t_c)
        req.gpu_blocks = gpu
        if local:
            node.l2.touch(req.path[:local], self.now)
            node.l1.touch(req.path[:gpu], self.now)
        if req.recompute:
            # Re-prefill after preemption: the tokens generated so far are recomputed too;
            # the call keeps its first start, its decode binding and its queueing record.
            req.t_uc += math.ceil(req.generated)
            return exposed
        req.t_prefill_start = self.now
        write_pcb(req.run.pcb, last_prefill_node=node.id)
        if req.measured:
            self.queue_wait[node.id].append(self.now - req.t_routed)
        rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, self.now)
        d = self.cp.bind_decode(rr, node.id, req.t_in + req.t_out)
        req.decode_node = d
        if d != node.id:
            self.nodes[d].inbound += 1
        return exposed

    def _start_prefill(self, node: SimNode) -> None:
        now = self.now
        budget = self.profile.chunk_tokens
        batch: list[tuple[SimRequest, int, float, int, int]] = []  # req, take, A, rst, ctx
        exposed = 0.0
        for req in node.prefilling:
            if budget <= 0:
                break
            take = min(req.t_uc - req.done_uc, budget)
            ctx = req.t_c + req.done_uc
            batch.append((req, take, take * ctx + take * (take + 1) / 2.0, 0, ctx))
            budget -= take
        if budget > 0 and node.queue:
            keep: list[SimRequest] = []
            blocked = False  # unified pool: a call that does not fit stops admission (vLLM)
            for req in node.queue:
                if budget <= 0 or req.fetch_ready_t > now or blocked:
                    keep.append(req)
                    continue
                if node.unified:
                    evicted = node.pool_admit(req, self.bt)
                    if evicted is None:
                        blocked = True
                        keep.append(req)
                        continue
                    if evicted:
                        self._evicted(node, "gpu", evicted, now)
                exposed += self._begin_request(node, req)
                take = min(req.t_uc, budget)
                ctx = req.t_c
                batch.append((req, take, take * ctx + take * (take + 1) / 2.0, req.t_rst, ctx))
                node.prefilling.append(req)
                budget -= take
            node.queue = keep
        if not batch:
            return
        sum_uc = sum(b[1] for b in batch)
        sum_a = sum(b[2] for b in batch)
        sum_rst = sum(b[3] for b in batch)
        sum_c = sum(b[4] for b in batch)
        dur = self.profile.prefill_time(sum_uc, sum_a, sum_rst) * self._noise() + exposed
        node.busy = True
        it = node.prefill_iter
        node.prefill_iter += 1
        out = self.out
        out.row(
            "prefill_iterations",
            node_id=node.id,
            iter_id=it,
            t_start=now,
            duration_s=dur,
            num_reqs=len(batch),
            t_uc=sum_uc,
            attn_pairs=sum_a,
            t_rst=sum_rst,
            t_c=sum_c,
        )
        if "prefill_iteration_requests" not in out.skip:
            n = len(batch)
            out.emit(
                "prefill_iteration_requests",
                {
                    "node_id": [node.id] * n,
                    "iter_id": [it] * n,
                    "request_id": [b[0].request_id for b in batch],
                    "t_uc": [b[1] for b in batch],
                    "t_c": [b[4] for b in batch],
                    "t_rst": [b[3] for b in batch],
                },
            )
        if not self.warm:
            self._fit_prefill[node.id].append((sum_uc, sum_a, sum_rst, dur))
        first_cached = sum(b[4] for b in batch if b[0].done_uc == 0)
        self.cp.stats.record_prefill_iteration(node.id, now, sum_uc, first_cached, sum_rst)
        remaining = dur + sum(
            self.cp.view.prefill_time(node.id, r.t_uc - r.done_uc - take, r.t_c + r.done_uc + take)
            for r, take, *_ in batch
            if r.t_uc - r.done_uc - take > 0
        )
        self._report(node, remaining)
        for req, _take, a, *_ in batch:
            req.attn_pairs += a
        self._at(now + dur, _PREFILL_END, self._prefill_end, node, batch)

    def _prefill_end(
        self, node: SimNode, batch: list[tuple[SimRequest, int, float, int, int]]
    ) -> None:
        node.busy = False
        finished = []
        for req, take, *_ in batch:
            req.done_uc += take
            if req.done_uc >= req.t_uc:
                finished.append(req)
        if finished:
            done_ids = {id(r) for r in finished}
            node.prefilling = [r for r in node.prefilling if id(r) not in done_ids]
        for req in finished:
            self._prefill_finished(node, req)
        self._schedule(node)

    def _prefill_finished(self, node: SimNode, req: SimRequest) -> None:
        now = self.now
        bt = self.bt
        start = req.t_c // bt
        if node.unified:
            node.pool_prefilled(req, bt)
        # The restored prefix was loaded into GPU memory; the new blocks go to both tiers.
        self._store(node, req.path, start, req.gpu_blocks, now)
        self.ideal.update(req.path[start:])
        if node.unified:
            node.pool_pin_path(req)
        if req.recompute:
            req.recompute = False
            self._join(node, req)  # resumes decoding where the preemption left it
            return
        req.t_first_token = now
        rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, now)
        self.cp.on_prefill_done(rr, node.id, now)
        if req.t_out <= 1:
            if req.decode_node != node.id:
                self.nodes[req.decode_node].inbound -= 1
            self._complete(req)
            return
        req.decode_left = math.ceil((req.t_out - 1) / self.profile.t_acc)
        dnode = self.nodes[req.decode_node]
        if dnode is node:
            self._join(node, req)
            return
        # Decode nodes keep running requests' KV in GPU memory and write it through to the
        # pool; they reuse nothing from their own GPU memory, so the whole context moves.
        delay = self.profile.transfer_base_s + self.profile.transfer_s_per_token * req.t_in
        self._at(now + delay, _TRANSFER, self._transfer_done, req)

    def _transfer_done(self, req: SimRequest) -> None:
        dnode = self.nodes[req.decode_node]
        dnode.inbound -= 1
        self._store(dnode, req.path, dnode.prefix_blocks(dnode.l2, req.path), None, self.now)
        self.cp.on_transfer_done(req.branch_id, dnode.id, self.now)
        self._join(dnode, req)

    def _join(self, node: SimNode, req: SimRequest) -> None:
        node.join_queue.append(req)
        self._schedule(node)

    # ---- decode ------------------------------------------------------------------------
    def _admit_joins(self, node: SimNode) -> None:
        if not node.join_queue:
            return
        if not self.fifo:
            node.join_queue.sort(key=SimRequest.sort_key)
        if node.unified:
            # The KV is already allocated (prompt at prefill, tokens as they are generated).
            room = self.profile.max_decode_batch - len(node.decode_batch)
            node.decode_batch.extend(node.join_queue[:room])
            node.join_queue = node.join_queue[room:]
            return
        cap = node.l1.capacity_tokens
        used = node.decode_kv_tokens
        keep = []
        for req in node.join_queue:
            need = req.t_in + req.t_out
            if len(node.decode_batch) < self.profile.max_decode_batch and (
                used + need <= cap or not node.decode_batch
            ):
                node.decode_batch.append(req)
                node.decode_kv += need
                used += need
            else:
                keep.append(req)
        node.join_queue = keep

    def _start_epoch(self, node: SimNode) -> None:
        k = min(r.decode_left for r in node.decode_batch)
        k = max(1, min(k, 1024))
        if node.unified:
            k = self._reserve_epoch(node, min(k, 256))
        batch = list(node.decode_batch)
        b = len(batch)
        t_acc = self.profile.t_acc
        ctx0 = float(sum(r.t_in + (r.t_out - 1 - r.decode_left * t_acc) for r in batch))
        ctx = ctx0 + np.arange(k) * b * t_acc
        dur = self.profile.decode_times(b, ctx) * self._noise(k)
        ends = np.cumsum(dur)
        self.epoch_token += 1
        node.epoch = DecodeEpoch(self.now, batch, ends, ctx0, node.decode_iter, self.epoch_token)
        self._report(node, 0.0)
        self._at(self.now + float(ends[-1]), _DECODE_END, self._decode_end, node, self.epoch_token)

    def _cut_epoch(self, node: SimNode) -> None:
        """End the epoch at the boundary of the iteration in progress."""
        e = node.epoch
        assert e is not None
        done = int(np.searchsorted(e.ends, self.now - e.start, side="right"))
        keep = min(done + 1, len(e.ends))
        if keep >= len(e.ends):
            return
        e.ends = e.ends[:keep]
        self.epoch_token += 1
        e.token = self.epoch_token
        self._at(e.start + float(e.ends[-1]), _DECODE_END, self._decode_end, node, e.token)

    def _decode_end(self, node: SimNode, token: int) -> None:
        e = node.epoch
        if e is None or e.token != token:
            return
        n_it = len(e.ends)
        b = len(e.batch)
        starts = np.concatenate(([0.0], e.ends[:-1])) + e.start
        durs = np.diff(np.concatenate(([0.0], e.ends)))
        ctx = e.ctx0 + np.arange(n_it) * b * self.profile.t_acc
        self.out.emit(
            "decode_iterations",
            {
                "node_id": [node.id] * n_it,
                "iter_id": list(range(e.iter0, e.iter0 + n_it)),
                "t_start": starts.tolist(),
                "duration_s": durs.tolist(),
                "batch_size": [b] * n_it,
                "t_fwd": [self.profile.t_fwd] * n_it,
                "ctx_tokens": ctx.astype(np.int64).tolist(),
            },
        )
        if not self.warm:
            self._fit_decode[node.id].append(np.column_stack([np.full(n_it, b), durs]))
        node.decode_iter += n_it
        node.epoch = None
        if node.unified:
            self._settle_epoch(node, e.batch, n_it)
        still: list[SimRequest] = []
        finished: list[SimRequest] = []
        for r in e.batch:  # the batch only changes at epoch boundaries
            r.decode_left -= n_it
            (finished if r.decode_left <= 0 else still).append(r)
        node.decode_batch = still
        for r in finished:
            if not node.unified:
                node.decode_kv -= r.t_in + r.t_out
            self._complete(r)
        self._schedule(node)

    # ---- completion ------------------------------------------------------------------
    def _complete(self, req: SimRequest) -> None:
        now = self.now
        req.t_done = now
        run = req.run
        i = req.turn_index
        self.cp.on_request_done(
            req.request_id,
            req.prefill_node,
            req.decode_node,
            now,
            t_uc=req.t_uc,
            t_c=req.t_c,
            attn_pairs=req.attn_pairs,
            t_out=req.t_out,
            t_acc=self.profile.t_acc,
        )
        self.out.row(
            "requests",
            request_id=req.request_id,
            program_id=req.program,
            branch_id=req.branch_id,
            t_arrival=req.t_arrival,
            prefill_node=req.prefill_node,
            decode_node=req.decode_node,
            t_in=req.t_in,
            t_c=req.t_c,
            t_fetch=req.fetch_tokens,
            t_out=req.t_out,
            t_prefill_start=req.t_prefill_start,
            t_first_token=req.t_first_token,
            t_done=now,
            t_ideal_c=req.t_ideal_c,
        )
        run.t_done[i] = now
        run.out_node[i] = req.decode_node
        run.done_turns += 1
        turn = run.program.turns[i]
        self._planes_complete(run, req, turn)
        if turn.finishes_branch:
            self.cp.on_branch_finish(req.branch_id, now)
        for j in run.succ[i]:
            run.pending[j] -= 1
            if run.pending[j] == 0:
                deps_done = max(run.t_done[d] or now for d in run.program.turns[j].deps)
                self._at(
                    deps_done + run.program.turns[j].gap_s, _RELEASE, self._release, run, j, None
                )
        if run.done_turns == len(run.program.turns):
            for b in list(run.branch_ctx):
                key = branch_key(run.program.program_id, b)
                if key in self.cp.branches.branches:
                    self.cp.on_branch_finish(key, now)
            self._program_done(run)
        dnode = self.nodes.get(req.decode_node)
        if dnode is not None and dnode.switch is not None and dnode.idle():
            self._finish_switch(dnode)

    # ---- planner and phase switches ------------------------------------------------------
    def _tick(self) -> None:
        self.cp.tick(self.now)
        if self.cfg.agents is not None and self.admission is None:
            while self.active_programs < self._target_agents():
                before = self.active_programs
                self._closed_arrival(self.now)
                if self.active_programs == before:
                    break
        self._at(self.now + self.cfg.planner_tick_s, _TICK, self._tick)

    def begin_switch(self, node_id: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """EngineBackend: move queued requests to peers, let running ones finish in place."""
        node = self.nodes[node_id]
        running = (
            len(node.prefilling) + len(node.decode_batch) + len(node.join_queue) + node.inbound
        )
        node.switch = (to_phase, mode, now, running)
        moved, node.queue = node.queue, []
        for req in moved:
            self.cp.router.on_done(req.request_id, node_id)
            rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, now)
            d = self.cp.reroute(rr)
            self._enqueue(req, d.node_id, d.cached_tokens, d.fetch_tokens)
        if node.idle():
            self._finish_switch(node)

    def _finish_switch(self, node: SimNode) -> None:
        assert node.switch is not None
        to, mode, _, running = node.switch
        lost = 0
        if mode in ("relaunch", "strand"):
            lost = self.cp.directory.node_blocks(node.id)
            self._clear(node)
        if mode == "relaunch":
            node.out_of_service = True
            self._at(
                self.now + self.cfg.relaunch_s,
                _SWITCH_DONE,
                self._relaunched,
                node,
                to,
                running,
                lost,
            )
            node.switch = None
            return
        node.switch = None
        self._switched(node, to, running, lost)

    def _relaunched(self, node: SimNode, to: Phase, running: int, lost: int) -> None:
        node.out_of_service = False
        self._switched(node, to, running, lost)

    def _switched(self, node: SimNode, to: Phase, running: int, lost: int = 0) -> None:
        node.phase = to
        if to == "decode" and node.l1.entries:
            # GPU memory now holds running requests' KV: the prefix cache in it is gone
            # (its host copies stay in the pool).
            gone = node.l1.clear()
            d = self.cp.directory
            for h in gone:
                d.remove(node.id, h, "gpu")
            self._kv_rows(node.id, "gpu", "removed", gone, self.now)
        t_decided = self.cp.switches[node.id].t_decided if node.id in self.cp.switches else self.now
        self.cp.complete_switch(node.id, self.now, drained=running, lost_kv_blocks=lost)
        self._switch_rows.append(
            {"node_id": node.id, "t_decided": t_decided, "t_done": self.now, "to": to}
        )
        self.switch_log.append({"node_id": node.id, "t_done": self.now, "to": to})
        self._record_split()
        self._schedule(node)

    def _record_split(self) -> None:
        if self.cp.collocated:
            self.split_timeline.append((self.now, len(self.nodes), len(self.nodes)))
        else:
            p, d = self.cp.split()
            self.split_timeline.append((self.now, p, d))

    def switch_rows(self) -> list[dict[str, Any]]:
        return self._switch_rows

    # ---- warmup: fit and freeze (Alg. E.3 line 1) -----------------------------------------
    def _fit_models(self) -> dict[int, NodeModel]:
        models, self.fit_report = fit_node_models(
            self.profile, self._fit_prefill, self._fit_decode, self.node_ids
        )
        return models

    def _fit_only(self) -> None:
        self.cp.set_models(self._fit_models())
        self.warm = True

    def _end_warmup(self) -> None:
        self.cp.set_models(self._fit_models())
        self.warm = True
        self.cp.start_disaggregation(self.initial_phases, self.now)
        for n in self.nodes.values():
            n.phase = self.initial_phases[n.id]
        self._record_split()
        for n in self.nodes.values():
            self._schedule(n)
