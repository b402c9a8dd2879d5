"""The Program Orchestrator: arrivals, causal release of turns, completion (paper 003 §3.2).

Programs arrive from the workload: replayed at their trace times, in a closed loop (a fixed
number of agents, each finished program replaced, scaled by the workload's own concurrency
schedule) or in an open loop (Poisson arrivals through an admission queue). A trace with
arrival times replays each program once at its time (the loop options do not apply) and,
when its last program finishes before the run's end, halts the run there; with
`trace_cycle` the loop draws the trace's programs over and over instead, ignoring their
times. A trace without arrival times feeds the closed loop once, in order. A turn is
released when its dependencies completed and its tool gap passed, r_{k+1} = c_k + g_k:
its context is formed, its PCB updated, and the control plane admits and routes it to a
prefill node's queue. When the engine reports the call done, the orchestrator logs it,
updates the PCB, schedules the successors' releases and ends the program after its last
turn (logging its JCT).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from cluster.control import ControlPlane, RouteRequest
from cluster.hardware.profiles import HardwareProfile
from cluster.sim.buffer import BufferedSink
from cluster.sim.config import SimConfig
from cluster.sim.contexts import Contexts
from cluster.sim.entities import ProgramRun, SimRequest, branch_key
from cluster.sim.kernel import ARRIVAL, RELEASE, EventKernel
from cluster.sim.metrics import TraceReplay
from cluster.sim.node_engine import NodeEngine
from cluster.sim.planes import PolicyPlanes
from cluster.sim.stage import StageContext
from cluster.workloads.loops import AdmissionQueue, OpenLoop
from cluster.workloads.program import Program
from cluster.workloads.source import WorkloadSource
from cluster.workloads.turn_table import root_turns


class ProgramOrchestrator:
    """See module docstring. `requests` lists every released call (append-only);
    `program_rows` one (arrival, finish, turns, preemptions, attained service) per
    finished program."""

    def __init__(
        self,
        ctx: StageContext,
        cp: ControlPlane,
        engine: NodeEngine,
        contexts: Contexts,
        planes: PolicyPlanes,
    ) -> None:
        self.cfg: SimConfig = ctx.cfg
        self.kernel: EventKernel = ctx.kernel
        self.cp = cp
        self.profile: HardwareProfile = ctx.profile
        self.source: WorkloadSource = ctx.run.source
        self.engine = engine
        self.contexts = contexts
        self.planes = planes
        self.out: BufferedSink = ctx.out
        self.bt = self.profile.block_tokens
        self.requests: list[SimRequest] = []
        self.program_rows: list[tuple[float, float, int, int, float]] = []
        self.arrivals = 0
        self.next_uid = 0
        self.active_programs = 0
        self.finished_programs = 0
        self.admission: AdmissionQueue | None = None
        self.loop: Literal["arrivals", "closed", "open"] = "closed"
        self._trace: list[Program] | None = None
        self._trace_iter: Iterator[Program] | None = None
        # arrivals mode: the trace's programs not yet finished (None: some arrive too late)
        self._trace_left: int | None = None

    # ---- arrivals -----------------------------------------------------------------------
    def start(self) -> None:
        """Schedule the arrivals: trace times, the open loop's Poisson times or the closed
        loop's agents (staggered over `stagger_s`)."""
        cfg = self.cfg
        push = self.kernel.push
        self._trace = trace = self.source.trace_programs()
        if (
            trace is not None
            and not cfg.trace_cycle
            and any(p.arrival_s is not None for p in trace)
        ):
            self.loop = "arrivals"
            admitted = trace[: cfg.max_programs]
            timely = [
                p for p in admitted if p.arrival_s is not None and p.arrival_s < cfg.duration_s
            ]
            for p in timely:
                assert p.arrival_s is not None
                push(p.arrival_s, ARRIVAL, self._arrive, p, p.arrival_s)
            # The run ends early only if the whole (admitted) trace arrives within it.
            self._trace_left = len(timely) if len(timely) == len(admitted) else None
            return
        if cfg.arrival_rate_per_min is not None:
            self.loop = "open"
            loop = OpenLoop(cfg.arrival_rate_per_min / 60.0, cfg.max_active)
            self.admission = AdmissionQueue(loop.max_active)
            for t in loop.arrivals(cfg.seed, cfg.duration_s):
                push(t, ARRIVAL, self._open_arrival, t)
            return
        agents = cfg.agents or 1
        # A trace feeds the closed loop once, in order, unless it is to cycle.
        self._trace_iter = iter(trace) if trace is not None and not cfg.trace_cycle else None
        for i in range(agents):
            t = cfg.stagger_s * i / agents
            push(t, ARRIVAL, self._closed_arrival, t)

    def top_up(self) -> None:
        """Closed loop: start programs until the concurrency target is met (it may rise)."""
        if self.loop != "closed" or self.cfg.agents is None:
            return
        while self.active_programs < self._target_agents():
            before = self.active_programs
            self._closed_arrival(self.kernel.now)
            if self.active_programs == before:
                break

    def _new_program(self, now: float) -> Program | None:
        if self._trace_iter is not None:
            return next(self._trace_iter, None)
        return self.source.next_program(now)

    def _admits_more(self) -> bool:
        cap = self.cfg.max_programs
        return cap is None or self.arrivals < cap

    def _closed_arrival(self, t: float) -> None:
        if not self._admits_more():
            return
        p = self._new_program(self.kernel.now)
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
        self.planes.on_arrival(run)
        now = self.kernel.now
        turns = program.turns
        for i in root_turns(turns):
            self.kernel.push(
                now + turns[i].gap_s, RELEASE, self._release, run, i, arrival if i == 0 else None
            )

    def _target_agents(self) -> int:
        """Closed-loop concurrency now: --agents, scaled by the workload's own schedule
        (shift: 288 -> 216 -> 144 agents in paper 000 §6.1 becomes N -> 0.75N -> 0.5N)."""
        agents = self.cfg.agents or 0
        prescribed = self.source.target_concurrency(self.kernel.now)
        first = self.source.target_concurrency(0.0)
        if prescribed is None or not first:
            return agents
        return max(1, round(agents * prescribed / first))

    # ---- turns --------------------------------------------------------------------------
    def _release(self, run: ProgramRun, i: int, arrival: float | None) -> None:
        """Release turn i: form its context, create the call, admit and route it."""
        turn = run.program.turns[i]
        now = self.kernel.now
        h = self.contexts.context(run, i)
        run.branch_ctx[turn.branch_id] = h
        run.branch_last[turn.branch_id] = i
        path = list(h.hashes)
        t_in = h.tokens
        ideal_blocks = self.contexts.ideal_prefix(path)
        pid = run.program.program_id
        rid = f"{pid}/{i}"
        bid = branch_key(pid, turn.branch_id)
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
        self.planes.on_release(run, turn, req)
        kind = turn.kind if turn.kind in ("start", "fork", "subagent") else "start"
        rr = RouteRequest(rid, pid, bid, path, t_in, now)
        parent = turn.parent_branch
        decision = self.cp.admit(
            rr,
            branch_kind=kind,
            parent_id=None if parent is None else branch_key(pid, parent),
        )
        over = self.engine.overheads
        if over is not None:
            req.overhead_row = over.start()
        if over is not None and over.has("ingress"):
            # A live proxy routes on arrival; the request reaches the engine's queue later.
            t = now + over.draw("ingress", row=req.overhead_row)
            args = (req, decision.node_id, decision.cached_tokens, decision.fetch_tokens)
            self.kernel.push(t, ARRIVAL, self.engine.enqueue, *args)
            return
        self.engine.enqueue(req, decision.node_id, decision.cached_tokens, decision.fetch_tokens)

    def complete(self, req: SimRequest) -> None:
        """The call's last token is out: log it, update the PCB, release successors."""
        now = self.kernel.now
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
        turns = run.program.turns
        turn = turns[i]
        self.planes.on_complete(run, req, turn)
        if turn.finishes_branch:
            self.cp.on_branch_finish(req.branch_id, now)
        for j in run.succ[i]:
            run.pending[j] -= 1
            if run.pending[j] == 0:
                nxt = turns[j]
                deps_done = max(run.t_done[d] or now for d in nxt.deps)
                self.kernel.push(deps_done + nxt.gap_s, RELEASE, self._release, run, j, None)
        # Its block path is read by nothing after this (the memory released its KV before);
        # finished requests stay for the summary, and a long run holds hundreds of thousands.
        req.path = []
        if run.done_turns == len(turns):
            for b in list(run.branch_ctx):
                key = branch_key(run.program.program_id, b)
                if self.cp.has_branch(key):
                    self.cp.on_branch_finish(key, now)
            self._program_done(run)

    def _program_done(self, run: ProgramRun) -> None:
        run.finish_t = now = self.kernel.now
        self.active_programs -= 1
        self.finished_programs += 1
        self.planes.on_program_done(run)
        run.drop_turn_state()
        pcb = run.pcb
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
        if self.loop == "arrivals":
            if self._trace_left is not None:
                self._trace_left -= 1
                if self._trace_left == 0:
                    self.kernel.halt()  # the trace is served; nothing more arrives
            return
        if self.admission is not None:
            for arrived, p in self.admission.finish():
                self._arrive(p, arrived)
            return
        if self.cfg.agents is not None and self.active_programs < self._target_agents():
            self._closed_arrival(now)

    # ---- the trace --------------------------------------------------------------------------
    def trace_replay(self) -> TraceReplay | None:
        """How the trace was fed and how much of it was served (None for generators)."""
        trace = self._trace
        if trace is None:
            return None
        return TraceReplay(
            self.loop,
            sum(len(p.turns) for p in trace),
            sum(1 for r in self.requests if r.t_done is not None),
            self.next_uid > len(trace),
            self.kernel.halted,
        )
