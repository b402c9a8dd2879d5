"""The program-level policy planes inside the simulator (paper 003 §3.1-3.4).

Every program has a Program Control Block, updated once per event through its own methods
(§3.2): here at call release r_{p,k}, call completion c_{p,k}, retention decisions,
memory-pressure evictions and the program's end; the engine records prefill starts and
preemptions on the request's PCB where they happen. At release the Dispatch Plane
assigns the call a priority q (node queues and decode admission follow it; FCFS keeps the
historical FIFO) and optionally routes it (§3.3, `DispatchRouter`); at completion the
Retention Plane decides what happens to the program's KV across the tool gap (protect
until d with value v, release, evict; §3.4), which the node memories honor when they
reclaim. Policies see the PCB and the deployable signals s(t) (per-node load and KV
utilization), never the hidden output lengths or tool durations.
"""

from __future__ import annotations

from cluster.core import BlockHash
from cluster.hardware.profiles import HardwareProfile
from cluster.policies.dispatch import DispatchRouter
from cluster.policies.loader import LoadedPolicy
from cluster.policies.pcb import ProgramControlBlock, Signals
from cluster.policies.retention import RELEASE, RetentionDecision, normalize_decision
from cluster.policies.scheduling import check_priority
from cluster.sim.contexts import Contexts
from cluster.sim.entities import ProgramRun, SimRequest
from cluster.sim.kernel import EventKernel
from cluster.sim.node import SimNode
from cluster.sim.stage import StageContext
from cluster.workloads.program import Turn


class PolicyPlanes:
    """PCBs of the active programs (`runs` by uid, `pcb_by_program`) and the three planes.
    `track_kv`: completed calls' KV is followed per branch (a retention policy, or the
    unified pool whose freed KV is the most recently used)."""

    def __init__(self, ctx: StageContext, contexts: Contexts) -> None:
        self.kernel: EventKernel = ctx.kernel
        self.profile: HardwareProfile = ctx.profile
        self.nodes: dict[int, SimNode] = ctx.nodes
        self.contexts = contexts
        self.retention: LoadedPolicy | None = ctx.run.retention
        self.scheduling: LoadedPolicy = ctx.run.scheduling
        self.dispatch: LoadedPolicy | None = ctx.run.dispatch
        self.track_kv = ctx.run.track_kv
        self.bt = self.profile.block_tokens
        self.runs: dict[int, ProgramRun] = {}  # active programs by uid
        self.pcb_by_program: dict[str, ProgramControlBlock] = {}

    def dispatch_router(self) -> DispatchRouter | None:
        """The Dispatch Plane's router (its `select` hook), or None for the PD router."""
        d = self.dispatch
        if d is None:
            return None
        nodes = self.nodes
        return DispatchRouter(
            d.instance,
            d.hooks["select"],
            self.pcb_by_program.__getitem__,
            lambda n: nodes[n].inflight(),
            (lambda now: self.signals(None)) if d.uses_signals else None,
        )

    def signals(self, node_id: int | None) -> Signals:
        """s(t): per-node KV and host utilization and calls in flight; the KV tokens of the
        node a decision concerns."""
        kv: dict[int, float] = {}
        host: dict[int, float] = {}
        inflight: dict[int, int] = {}
        for n, node in self.nodes.items():
            kv[n], host[n] = node.memory.signal_kv(node.phase)
            inflight[n] = node.inflight()
        tokens = 0 if node_id is None else self.nodes[node_id].memory.signal_tokens()
        c = self.profile.prefill
        return Signals(
            self.kernel.now,
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

    # ---- program lifetime ---------------------------------------------------------------
    def on_arrival(self, run: ProgramRun) -> None:
        self.runs[run.uid] = run
        self.pcb_by_program[run.program.program_id] = run.pcb

    def on_program_done(self, run: ProgramRun) -> None:
        pcb = run.pcb
        pcb.record_finish()
        if self.retention is not None:
            # A finished program's protection lapses (the harness ends the session).
            for nodes, path in run.kv_paths.values():
                self._retain(run, nodes, path, RELEASE)
        self.runs.pop(run.uid, None)
        if self.pcb_by_program.get(pcb.program_id) is pcb:
            del self.pcb_by_program[pcb.program_id]

    # ---- calls --------------------------------------------------------------------------
    def on_release(self, run: ProgramRun, turn: Turn, req: SimRequest) -> None:
        """PCB at release r_{p,k}; the retention arrival hook; the call's priority q."""
        pcb = run.pcb
        now = self.kernel.now
        pcb.record_release(now, req.t_in, turn.branch_id)
        if self.retention is not None:
            decision = self._retention_hook("on_turn_arrival", pcb, req.request_id, pcb.kv_node)
            kv = run.kv_paths.get(turn.branch_id)
            if kv is None and turn.kind == "fork":
                kv = run.kv_paths.get(turn.parent_branch or "")
            if decision is not None and kv is not None:
                self._retain(run, kv[0], kv[1], decision)
        sched = self.scheduling
        if sched.uses_signals:
            sched.instance.signals = self.signals(None)
        req.priority = check_priority(sched.hooks["priority"](pcb, now), sched.name)

    def on_owner_evicted(self, uid: int, h: BlockHash) -> None:
        """Memory pressure reclaimed a block a program decided on: update its PCB."""
        run = self.runs.get(uid)
        if run is not None and run.pcb.kv_resident:
            run.pcb.record_eviction()

    def on_complete(self, run: ProgramRun, req: SimRequest, turn: Turn) -> None:
        """PCB at completion c_{p,k}; the program's KV enters the cache with the output;
        the retention decision (v, d) for it."""
        now = self.kernel.now
        i = req.turn_index
        pcb = run.pcb
        succ = run.succ[i]
        done = run.done_turns == len(run.program.turns)
        assert req.t_prefill_start is not None
        resident: int | None = None
        if self.track_kv:
            path = list(self.contexts.with_output(run, i).hashes)
            nodes = (
                (req.decode_node,)
                if req.decode_node == req.prefill_node
                else (req.prefill_node, req.decode_node)
            )
            run.kv_paths[turn.branch_id] = (nodes, path)
            resident = self.nodes[req.decode_node].memory.host_prefix(path)
        pcb.record_completion(
            now,
            now - req.t_prefill_start,
            req.decode_node,
            req.t_in + req.t_out,
            # The output names the requested tool; how long it will run stays hidden.
            run.program.turns[succ[0]].tool if succ else None,
            turn.branch_id,
            branch_done=turn.finishes_branch,
            program_done=done,
            kv_resident_tokens=None if resident is None else resident * self.bt,
            kv_resident=resident is not None and resident == len(path),
        )
        if resident is None:
            return
        if self.retention is not None and not done:
            decision = self._retention_hook(
                "on_turn_complete", pcb, req.request_id, req.decode_node
            )
            if decision is not None:
                self._retain(run, nodes, path, decision)

    # ---- the Retention Plane --------------------------------------------------------------
    def _retention_hook(
        self, hook: str, pcb: ProgramControlBlock, request_id: str, node: int | None
    ) -> RetentionDecision | None:
        ret = self.retention
        assert ret is not None
        if ret.uses_signals:
            ret.instance.signals = self.signals(node)
        fn = ret.hooks[hook]
        now = self.kernel.now
        result = fn(pcb, request_id, now) if hook == "on_turn_complete" else fn(pcb, now)
        return normalize_decision(result, ret.name, hook)

    def _retain(
        self, run: ProgramRun, nodes: tuple[int, ...], path: list[int], dec: RetentionDecision
    ) -> None:
        """Apply a retention decision to the program's blocks of `path` on `nodes`."""
        now = self.kernel.now
        for n in nodes:
            self.nodes[n].memory.retain(path, run.uid, dec, now)
        protected = dec.kind == "protect" and dec.until > now  # type: ignore[operator]
        run.pcb.record_retention(
            dec.until if protected else None,
            dec.value if protected else None,
            self._resident_tokens(run) if dec.kind == "evict" else None,
        )

    def _resident_tokens(self, run: ProgramRun) -> int:
        pcb = run.pcb
        kv = run.kv_paths.get(pcb.branch_id) if pcb.branch_id is not None else None
        if kv is None or pcb.kv_node is None:
            return 0
        return self.nodes[pcb.kv_node].memory.host_prefix(kv[1]) * self.bt
