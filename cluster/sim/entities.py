"""The simulator's entities: calls, decode epochs and program runs (paper 003 §3.2).

A `SimRequest` is one LLM call of a program (a turn): its context path, token counts and
the times it passes through the cluster; `t_out` stays hidden from every policy. A
`DecodeEpoch` is a run of decode iterations over a fixed batch. A `ProgramRun` is the
execution state of one agent program, the engine-side half of its Program Control Block
(the policy-visible half is `cluster.policies.pcb.ProgramControlBlock`).
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.core import BlockHash
from cluster.kv.hashing import ContextHasher
from cluster.policies.pcb import ProgramControlBlock
from cluster.workloads.program import Program
from cluster.workloads.turn_table import TurnTable


def branch_key(program_id: str, branch: str) -> str:
    """The cluster-wide branch ID the simulated harness tags requests with.

    Workloads name branches within their program ('root', 'sub0.1'); the control plane's
    branch table (Alg. E.1) needs IDs unique across the cluster, as a live harness sends.
    """
    return f"{program_id}/{branch}"


class SimRequest:
    """One LLM request (a turn). `t_out` is hidden from policies: only the engine reads it."""

    __slots__ = (
        "answer_t",
        "attn_pairs",
        "branch_id",
        "decode_clock",
        "decode_end",
        "decode_node",
        "decode_refusals",
        "decode_wait",
        "done_uc",
        "fetch_ready_t",
        "fetch_tokens",
        "first_chunk",
        "generated",
        "gpu_blocks",
        "kv_pinned",
        "kv_private",
        "measured",
        "overhead_row",
        "path",
        "preemptions",
        "prefill_node",
        "priority",
        "program",
        "recompute",
        "request_id",
        "route_t_c",
        "route_t_uc",
        "run",
        "seq",
        "t_arrival",
        "t_c",
        "t_done",
        "t_first_token",
        "t_ideal_c",
        "t_in",
        "t_joined",
        "t_out",
        "t_prefill_start",
        "t_release",
        "t_routed",
        "t_rst",
        "t_uc",
        "turn_index",
    )

    def __init__(
        self,
        request_id: str,
        run: ProgramRun,
        turn_index: int,
        branch_id: str,
        path: list[BlockHash],
        t_in: int,
        t_out: int,
        t_arrival: float,
        t_ideal_c: int,
    ) -> None:
        self.request_id = request_id
        self.run = run
        self.program = run.program.program_id
        self.turn_index = turn_index
        self.branch_id = branch_id
        self.path = path
        self.t_in = t_in
        self.t_out = t_out
        self.t_arrival = t_arrival
        self.t_ideal_c = t_ideal_c
        self.prefill_node = -1
        self.decode_node = -1
        self.route_t_c = 0
        self.route_t_uc = t_in
        self.fetch_tokens = 0
        self.fetch_ready_t = 0.0
        self.t_c = 0  # cached prefix at prefill start (local + fetched)
        self.t_uc = t_in
        self.t_rst = 0
        self.t_routed = t_arrival
        self.gpu_blocks = 0
        self.done_uc = 0
        self.first_chunk = True
        self.attn_pairs = 0.0
        self.t_prefill_start: float | None = None
        self.t_first_token: float | None = None
        self.t_done: float | None = None
        # serving overheads: when a live proxy would have the prefill engine's answer
        self.answer_t = float("-inf")
        self.overhead_row = -1  # its row of the overheads' joint stage vectors (-1: none)
        # Decode iterations left are `decode_end` less the clock of the decode batch the call
        # is in (`decode_clock`; None out of a batch: `decode_end` is then the count itself).
        self.decode_end = 0
        self.decode_clock: DecodeClock | None = None
        # When the call last became ready to decode (KV arrived or recomputed), the seconds
        # it waited to join the batch since, and how often a full batch or KV refused it
        # (engine limits only).
        self.t_joined = 0.0
        self.decode_wait = 0.0
        self.decode_refusals = 0
        self.measured = True
        # Dispatch Plane: priority q (smaller first), release time r and release order.
        self.priority = 0.0
        self.t_release = t_arrival
        self.seq = 0
        # Unified KV pool: blocks this call pins, tokens it reserves outside the cache,
        # tokens generated so far, and preemption (recompute) state.
        self.kv_pinned: list[BlockHash] = []
        self.kv_private = 0
        self.generated = 0.0
        self.recompute = False
        self.preemptions = 0

    @property
    def decode_left(self) -> int:
        """Decode iterations the call still has to run (<= 0: its last token is out)."""
        clock = self.decode_clock
        return self.decode_end if clock is None else self.decode_end - clock.iterations

    @decode_left.setter
    def decode_left(self, value: int) -> None:
        if self.decode_clock is not None:
            raise RuntimeError(
                f"{self.request_id}: decode_left of a call in a decode batch advances only "
                "with its batch's clock (cluster.sim.decode_batch)"
            )
        self.decode_end = value

    def sort_key(self) -> tuple[float, float, int]:
        """Priority order of the Dispatch Plane: q, then release time, then release order."""
        return (self.priority, self.t_release, self.seq)


class DecodeClock:
    """Decode iterations a node's batch has run: a call in the batch has `decode_end` less
    this many iterations left, so one addition advances the whole batch."""

    __slots__ = ("iterations",)

    def __init__(self) -> None:
        self.iterations = 0


class DecodeEpoch:
    """A run of decode iterations over a fixed batch (continuous batching between events)."""

    __slots__ = ("batch", "ctx0", "ends", "iter0", "start", "token")

    def __init__(
        self,
        start: float,
        batch: list[SimRequest],
        ends: list[float],
        ctx0: float,
        iter0: int,
        token: int,
    ) -> None:
        self.start = start
        self.batch = batch
        self.ends = ends  # cumulative end offsets of each iteration
        self.ctx0 = ctx0
        self.iter0 = iter0
        self.token = token


class ProgramRun:
    """Execution state of one program (its PCB as far as the engines are concerned)."""

    __slots__ = (
        "arrival",
        "branch_ctx",
        "branch_last",
        "done_turns",
        "finish_t",
        "fork_parents",
        "kv_paths",
        "out_node",
        "outputs_added",
        "pcb",
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
        # What policies may see of this program (never `program` itself).
        self.pcb = ProgramControlBlock(program.program_id, program.workload, arrival)
        # Retention Plane: branch -> (nodes, block path) of its latest completed call.
        self.kv_paths: dict[str, tuple[tuple[int, ...], list[int]]] = {}
        self.outputs_added: set[int] = set()  # turns whose output is already in the context
        turns = program.turns
        n = len(turns)
        self.succ: Sequence[Sequence[int]]
        if isinstance(turns, TurnTable):  # a long program: its graph without Turn objects
            self.pending = turns.dep_counts()
            self.succ = turns.successors()
            self.fork_parents = turns.fork_parents()
        else:
            self.pending = [len(t.deps) for t in turns]
            succ: list[list[int]] = [[] for _ in range(n)]
            for i, t in enumerate(turns):
                for d in t.deps:
                    succ[d].append(i)
            self.succ = succ
            self.fork_parents = {
                t.parent_turn for t in turns if t.kind == "fork" and t.parent_turn is not None
            }
        self.t_done: list[float | None] = [None] * n
        self.done_turns = 0
        self.branch_ctx: dict[str, ContextHasher] = {}
        self.branch_last: dict[str, int] = {}  # branch -> its last released turn
        self.snapshots: dict[int, ContextHasher] = {}  # fork parents: context incl. output
        self.out_node: dict[int, int] = {}  # turn -> decode node that produced its output
        self.finish_t: float | None = None

    @property
    def preemptions(self) -> int:
        """Times a call of the program was preempted (its PCB counts them)."""
        return self.pcb.preemptions

    def drop_turn_state(self) -> None:
        """The program finished: free what only its turns' releases read (contexts, counts,
        times); a long run keeps every finished program's run for its requests' sake."""
        self.pending = []
        self.t_done = []
        self.branch_ctx = {}
        self.branch_last = {}
        self.snapshots = {}
        self.out_node = {}
        self.outputs_added = set()
