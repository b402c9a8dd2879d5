"""Turn contexts of agent programs and the ideal cache (paper 003 §3.2; paper 000 §6 h*).

A released turn's context is formed per the program model (`cluster/workloads/program.py`):
a new branch (start, sub-agent) starts empty, a fork copies its parent turn's context with
that turn's output, other turns extend their branch's last context with its output (or a
compaction keeps a part of it), and every turn appends its own segments. Contexts are
hashed incrementally into block paths. The ideal set holds every block some request
produced (unlimited KV shared by all nodes, no switches): the prefix of a path found there
is the ideal cached prefix behind h*.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.core import BlockHash, ConfigError
from cluster.kv.hashing import ContextHasher, prefix_in
from cluster.sim.entities import ProgramRun
from cluster.workloads.program import Segment

# (node that produced the output, the context path, first new block, completion time)
StoreOutput = Callable[[int, list[BlockHash], int, float], None]


class Contexts:
    """Context formation for released turns. `store_output` puts a completed turn's output
    blocks into the memory of the node that produced them (wired by the composition root);
    `keep_outputs` (the policy planes track KV per branch) appends the output to the
    branch context at completion, so later turns find it there."""

    def __init__(self, block_tokens: int, keep_outputs: bool, store_output: StoreOutput) -> None:
        self.bt = block_tokens
        self.keep_outputs = keep_outputs
        self.store_output = store_output
        self.ideal: set[BlockHash] = set()

    def ideal_prefix(self, path: list[BlockHash]) -> int:
        return prefix_in(path, self.ideal)

    def context(self, run: ProgramRun, i: int) -> ContextHasher:
        """Form turn i's context per the program model."""
        turn = run.program.turns[i]
        kind = turn.kind
        if kind in ("start", "subagent"):
            h = ContextHasher(self.bt)
        elif kind == "fork":
            assert turn.parent_turn is not None
            h = self.with_output(run, turn.parent_turn).copy()
        else:
            last = run.branch_last.get(turn.branch_id)
            if last is None:
                raise ConfigError(
                    f"program {run.program.program_id} turn {i}: {kind} of unknown branch {turn.branch_id}"
                )
            if kind == "compact":
                h = run.branch_ctx[turn.branch_id].truncated(turn.compact_keep)
            else:
                h = self.with_output(run, last)
                if last in run.snapshots:
                    h = h.copy()  # the snapshot also serves forks of that turn
        h.extend(turn.append)
        return h

    def with_output(self, run: ProgramRun, j: int) -> ContextHasher:
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
        elif self.keep_outputs:
            run.outputs_added.add(j)
        if turn.output_tokens > 0:
            start = len(h.hashes)
            new = h.extend([Segment(turn.output_seg, turn.output_tokens)])
            self.ideal.update(new)
            node = run.out_node.get(j)
            done = run.t_done[j]
            if new and node is not None and done is not None:
                self.store_output(node, h.hashes, start, done)
        return h
