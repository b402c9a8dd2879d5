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
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cluster.control_plane import ControlPlane, ControlPlaneConfig
from cluster.core import ConfigError, NullSink, Phase, TelemetrySink
from cluster.eviction import EVICTION_POLICIES, Evicted
from cluster.hashing import ContextHasher
from cluster.planning import SwitchMode
from cluster.sim.buffer import BufferedSink
from cluster.sim.engine import DecodeEpoch, SimNode, SimRequest
from cluster.sim.profiles import HardwareProfile, load_profile
from cluster.state import NodeReport, QueuedWork, RouteRequest
from cluster.workloads import make_workload
from cluster.workloads.loops import AdmissionQueue, OpenLoop
from cluster.workloads.program import Program, Segment
from models import DecodeModel, NodeModel, PrefillModel
from models.fitting import (
    DECODE_TERMS,
    PREFILL_TERMS,
    FitError,
    GramStats,
    decode_features,
    fit_from_gram,
    prefill_features,
)

# Event priorities at equal times: completions before new arrivals before planning.
_FETCH, _TRANSFER, _PREFILL_END, _DECODE_END, _SWITCH_DONE, _RELEASE, _ARRIVAL, _WARMUP, _TICK = (
    range(9)
)

DEFAULT_FETCH = {"ttft": "async"}  # other routers: engines with private caches (SGLang PD)
DEFAULT_BINDER = {"ttft": "fewest"}  # other routers: the gateway's round-robin decode routing


def parse_split(split: str, nodes: int) -> tuple[int, int] | None:
    """'4P5D' -> (4, 5); 'collocated' -> None. Errors name what is allowed."""
    if split == "collocated":
        return None
    s = split.upper()
    try:
        p_str, d_str = s.rstrip("D").split("P")
        p, d = int(p_str), int(d_str)
    except ValueError:
        raise ConfigError(f"split must look like 4P5D or be 'collocated', got {split!r}") from None
    if p < 1 or d < 1 or p + d != nodes:
        raise ConfigError(
            f"split {split} needs >= 1 prefill and >= 1 decode node summing to --nodes {nodes}"
        )
    return p, d


@dataclass(frozen=True, slots=True)
class SimConfig:
    workload: str = "cc"
    workload_params: dict[str, Any] = field(default_factory=dict)
    nodes: int = 9
    split: str = "4P5D"
    agents: int | None = 126
    arrival_rate_per_min: float | None = None
    max_active: int = 258
    duration_s: float = 3600.0
    warmup_s: float = 600.0
    planner: str = "gain"
    router: str = "ttft"
    eviction: str = "branch"
    profile: str | HardwareProfile = "gb300"
    seed: int = 0
    kv_fetch: str | None = None  # default: async for ttft, none for the baselines
    decode_binder: str | None = None
    copy_price_s_per_token: float = 2e-7
    relaunch_s: float = 700.0
    window_s: float = 600.0
    slices: int = 10
    cooldown_s: float = 120.0
    planner_tick_s: float = 10.0
    telemetry: str = "full"  # full | compact (drops kv_events, branch_counts, router_decisions)
    l1_tokens: int | None = None
    l2_tokens: int | None = None
    stagger_s: float = 60.0  # closed-loop agents start spread over this many seconds

    def validate(self) -> None:
        if self.nodes < 2:
            raise ConfigError(f"--nodes must be >= 2, got {self.nodes}")
        parse_split(self.split, self.nodes)
        if (self.agents is None) == (self.arrival_rate_per_min is None):
            raise ConfigError(
                "give exactly one of --agents N (closed loop) or --arrival-rate R (open loop)"
            )
        if self.agents is not None and self.agents < 1:
            raise ConfigError(f"--agents must be >= 1, got {self.agents}")
        if self.arrival_rate_per_min is not None and self.arrival_rate_per_min <= 0:
            raise ConfigError(f"--arrival-rate must be > 0, got {self.arrival_rate_per_min}")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.warmup_s >= self.duration_s:
            raise ConfigError(
                f"need 0 <= --warmup < --duration, got {self.warmup_s} and {self.duration_s}"
            )
        if self.telemetry not in ("full", "compact"):
            raise ConfigError(f"telemetry must be full or compact, got {self.telemetry!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError(
                f"unknown eviction {self.eviction!r}; choose one of: {', '.join(EVICTION_POLICIES.names())}"
            )


class ProgramRun:
    """Execution state of one program (its PCB as far as the engines are concerned)."""

    __slots__ = (
        "arrival",
        "branch_ctx",
        "branch_last",
        "done_turns",
        "finish_t",
        "fork_parents",
        "out_node",
        "pending",
        "program",
        "snapshots",
        "succ",
        "t_done",
        "uid",
    )

    def __init__(self, program: Program, uid: int, arrival: float) -> None:
        self.program = program
        self.uid = uid
        self.arrival = arrival
        n = len(program.turns)
        self.pending = [len(t.deps) for t in program.turns]
        self.succ: list[list[int]] = [[] for _ in range(n)]
        for i, t in enumerate(program.turns):
            for d in t.deps:
                self.succ[d].append(i)
        self.t_done: list[float | None] = [None] * n
        self.done_turns = 0
        self.branch_ctx: dict[str, ContextHasher] = {}
        self.branch_last: dict[str, int] = {}  # branch -> its last released turn
        self.snapshots: dict[int, ContextHasher] = {}  # fork parents: context incl. output
        self.out_node: dict[int, int] = {}  # turn -> decode node that produced its output
        self.fork_parents = {t.parent_turn for t in program.turns if t.kind == "fork"}
        self.finish_t: float | None = None


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
        cp_cfg = ControlPlaneConfig(
            block_tokens=self.bt,
            router=router,
            decode_binder=cfg.decode_binder or DEFAULT_BINDER.get(router, "round-robin"),
            planner=cfg.planner,
            window_s=cfg.window_s,
            slices=cfg.slices,
            cooldown_s=cfg.cooldown_s,
            kv_fetch=cfg.kv_fetch or DEFAULT_FETCH.get(router, "none"),
            copy_price_s_per_token=cfg.copy_price_s_per_token,
            log_branch_counts=cfg.telemetry == "full",
            log_router_decisions=cfg.telemetry == "full",
        )
        oracle = self.profile.node_model()
        self.cp = ControlPlane(
            dict(self.initial_phases), {n: oracle for n in ids}, cp_cfg, sink=self.out, backend=self
        )
        policy = EVICTION_POLICIES.create(cfg.eviction)
        l1 = cfg.l1_tokens or self.profile.l1_tokens
        l2 = cfg.l2_tokens or self.profile.l2_tokens
        d = self.cp.directory
        self.nodes: dict[int, SimNode] = {
            n: SimNode(n, self.initial_phases[n], l1, l2, policy, lambda h, n=n: d.count(n, h))
            for n in ids
        }
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
        self.decode_population = 0
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
        if gain_warmup:
            self._at(cfg.warmup_s, _WARMUP, self._end_warmup)
        elif cfg.warmup_s > 0:
            self._at(cfg.warmup_s, _WARMUP, self._fit_only)
        self._record_split()
        if cfg.planner_tick_s > 0 and not self.collocated_only:
            self._at(cfg.planner_tick_s, _TICK, self._tick)
        trace = self.source.trace_programs()
        if trace is not None and any(p.arrival_s is not None for p in trace):
            for p in trace:
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

    def _closed_arrival(self, t: float) -> None:
        p = self._new_program(self.now)
        if p is not None:
            self._arrive(p, t)

    def _open_arrival(self, t: float) -> None:
        assert self.admission is not None
        for arrived, p in self.admission.arrive(t, self.source.next_program(t)):
            self._arrive(p, arrived)

    def _arrive(self, program: Program, arrival: float) -> None:
        run = ProgramRun(program, self.next_uid, arrival)
        self.next_uid += 1
        self.active_programs += 1
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
        run.finish_t = self.now
        self.active_programs -= 1
        self.finished_programs += 1
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
        if j in run.fork_parents:
            h = h.copy()
            run.snapshots[j] = h
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
        req = SimRequest(
            rid,
            run,
            i,
            turn.branch_id,
            path,
            t_in,
            turn.output_tokens,
            arrival if arrival is not None else now,
            0,
        )
        req.t_ideal_c = min(ideal_blocks * self.bt, max(t_in - 1, 0))
        req.measured = req.t_arrival >= self.cfg.warmup_s
        self.requests.append(req)
        kind = turn.kind if turn.kind in ("start", "fork", "subagent") else "start"
        rr = RouteRequest(rid, run.program.program_id, turn.branch_id, path, t_in, now)
        decision = self.cp.admit(rr, branch_kind=kind, parent_id=turn.parent_branch)  # type: ignore[arg-type]
        self._enqueue(req, decision.node_id, decision.cached_tokens, decision.fetch_tokens)

    def _ideal_prefix(self, path: list[int]) -> int:
        ideal = self.ideal
        n = len(path)
        if n == 0 or path[0] not in ideal:
            return 0
        if path[n - 1] in ideal:
            return n
        lo, hi = 1, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if path[mid] in ideal:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _enqueue(self, req: SimRequest, node_id: int, cached: int, fetch: int) -> None:
        node = self.nodes[node_id]
        req.prefill_node = node_id
        req.t_routed = self.now
        req.route_t_c = cached + fetch
        req.route_t_uc = max(req.t_in - req.route_t_c, 1)
        req.fetch_tokens = fetch
        if fetch and self.cp.config.kv_fetch == "async":
            req.fetch_ready_t = self.now + self.cp.state.fetch.time(fetch)
            self._at(req.fetch_ready_t, _FETCH, self._fetch_done, req, node_id)
        else:
            req.fetch_ready_t = self.now
        node.queue.append(req)
        self._schedule(node)

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
        if host_from < len(path):
            hashes = path[host_from:]
            entries = node.l2.entries
            new_host = [h for h in hashes if h not in entries]
            evicted = node.l2.insert(hashes, bt, t, host_from)
            if evicted:
                self._evicted(node, "host", evicted, t)
            if new_host:
                d.store(node.id, new_host, path[host_from - 1] if host_from else 0, "host", t, bt)
                self._kv_rows(node.id, "host", "stored", new_host, t)
        if gpu_from is not None and gpu_from < len(path):
            hashes = path[gpu_from:]
            entries = node.l1.entries
            new_gpu = [h for h in hashes if h not in entries]
            ev1 = node.l1.insert(hashes, bt, t, gpu_from)
            if ev1:
                self._evicted(node, "gpu", ev1, t)
            if new_gpu:
                d.store(node.id, new_gpu, path[gpu_from - 1] if gpu_from else 0, "gpu", t, bt)
                self._kv_rows(node.id, "gpu", "stored", new_gpu, t)

    def _evicted(self, node: SimNode, tier: str, evicted: list[Evicted], t: float) -> None:
        d = self.cp.directory
        policy = node.l2.policy.name if tier == "host" else "lru"
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
                node.decode_kv_tokens if node.phase == "decode" else node.l1.used_tokens,
                node.l1.capacity_tokens,
                node.l2.used_tokens,
                node.l2.capacity_tokens,
            )
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
            exposed = self.cp.state.fetch.time(req.fetch_tokens)
            blocks = req.path[: req.route_t_c // bt]
            self._store(
                node,
                blocks,
                node.prefix_blocks(node.l2, blocks),
                node.prefix_blocks(node.l1, blocks),
                self.now,
            )
        local = node.prefix_blocks(node.l2, req.path)
        gpu = node.prefix_blocks(node.l1, req.path)
        t_c = min(local * bt, max(req.t_in - 1, 0))
        req.t_c = t_c
        req.t_uc = req.t_in - t_c
        req.t_rst = min(max(local - gpu, 0) * bt, t_c)
        req.gpu_blocks = gpu
        req.t_prefill_start = self.now
        if local:
            node.l2.touch(req.path[:local], self.now)
            node.l1.touch(req.path[:gpu], self.now)
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
            for req in node.queue:
                if budget <= 0 or req.fetch_ready_t > now:
                    keep.append(req)
                    continue
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
        # The restored prefix was loaded into GPU memory; the new blocks go to both tiers.
        self._store(node, req.path, start, req.gpu_blocks, now)
        self.ideal.update(req.path[start:])
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
        self.decode_population += 1
        self.cp.stats.record_decode_load(self.now, self.decode_population)
        self._schedule(node)

    # ---- decode ------------------------------------------------------------------------
    def _admit_joins(self, node: SimNode) -> None:
        if not node.join_queue:
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
        batch = list(node.decode_batch)
        b = len(batch)
        k = min(r.decode_left for r in batch)
        k = max(1, min(k, 1024))
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
        still = []
        finished = []
        for r in e.batch:  # the batch only changes at epoch boundaries
            r.decode_left -= n_it
            (finished if r.decode_left <= 0 else still).append(r)
        node.decode_batch = still
        for r in finished:
            node.decode_kv -= r.t_in + r.t_out
            self._complete(r)
        self._schedule(node)

    # ---- completion ------------------------------------------------------------------
    def _complete(self, req: SimRequest) -> None:
        now = self.now
        req.t_done = now
        run = req.run
        i = req.turn_index
        if req.decode_node >= 0 and req.t_out > 1:
            self.decode_population -= 1
            self.cp.stats.record_decode_load(now, self.decode_population)
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
        if turn.finishes_branch:
            self.cp.on_branch_finish(turn.branch_id, now)
        for j in run.succ[i]:
            run.pending[j] -= 1
            if run.pending[j] == 0:
                deps_done = max(run.t_done[d] or now for d in run.program.turns[j].deps)
                self._at(
                    deps_done + run.program.turns[j].gap_s, _RELEASE, self._release, run, j, None
                )
        if run.done_turns == len(run.program.turns):
            for b in list(run.branch_ctx):
                if b in self.cp.branches.branches:
                    self.cp.on_branch_finish(b, now)
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
        if mode in ("relaunch", "strand"):
            self._clear(node)
        if mode == "relaunch":
            node.out_of_service = True
            self._at(
                self.now + self.cfg.relaunch_s, _SWITCH_DONE, self._relaunched, node, to, running
            )
            node.switch = None
            return
        node.switch = None
        self._switched(node, to, running)

    def _relaunched(self, node: SimNode, to: Phase, running: int) -> None:
        node.out_of_service = False
        self._switched(node, to, running)

    def _switched(self, node: SimNode, to: Phase, running: int) -> None:
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
        self.cp.complete_switch(node.id, self.now, drained=running)
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
        prof = self.profile
        pre_rows: dict[int, np.ndarray] = {}
        dec_rows: dict[int, np.ndarray] = {}
        for n in self.node_ids:
            if self._fit_prefill[n]:
                pre_rows[n] = np.asarray(self._fit_prefill[n], dtype=np.float64)
            if self._fit_decode[n]:
                dec_rows[n] = np.concatenate(self._fit_decode[n])

        def pre_stats(a: np.ndarray) -> GramStats:
            return GramStats.from_rows(prefill_features(a[:, 0], a[:, 1], a[:, 2]), a[:, 3])

        def dec_stats(a: np.ndarray) -> GramStats:
            x = decode_features(a[:, 0], prof.t_fwd, prof.top_k, prof.num_experts)
            return GramStats.from_rows(x, a[:, 1])

        pooled_pre = [pre_stats(a) for a in pre_rows.values()]
        pooled_dec = [dec_stats(a) for a in dec_rows.values()]
        oracle = prof.node_model()
        models: dict[int, NodeModel] = {}
        report: dict[str, Any] = {}
        for n in self.node_ids:
            pre = oracle.prefill
            dec = oracle.decode
            for stats, terms, kind in (
                (
                    [pre_stats(pre_rows[n])] if n in pre_rows else pooled_pre,
                    PREFILL_TERMS,
                    "prefill",
                ),
                ([dec_stats(dec_rows[n])] if n in dec_rows else pooled_dec, DECODE_TERMS, "decode"),
            ):
                if not stats:
                    report[f"{n}.{kind}"] = "no samples: profile coefficients kept"
                    continue
                total = stats[0]
                for s in stats[1:]:
                    total = total + s
                try:
                    coef, _ = fit_from_gram(total, terms)
                except FitError as err:
                    try:
                        coef, _ = fit_from_gram(
                            sum(stats[1:], stats[0]) if len(stats) > 1 else total, terms
                        )
                    except FitError:
                        report[f"{n}.{kind}"] = f"{err}: profile coefficients kept"
                        continue
                if kind == "prefill":
                    pre = PrefillModel.from_coef(coef)
                else:
                    dec = DecodeModel.from_coef(coef, prof.top_k, prof.num_experts, prof.t_fwd)
                report[f"{n}.{kind}"] = [float(c) for c in coef]
            models[n] = NodeModel(pre, dec, mean_new_tokens=float(prof.chunk_tokens))
        self.fit_report = report
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
