"""Execution state of one agent program in the simulator (paper 003 §3.2)."""

from __future__ import annotations

from cluster.hashing import ContextHasher
from cluster.policies.pcb import ProgramControlBlock
from cluster.workloads.program import Program


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
        "preemptions",
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
        self.preemptions = 0
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
