"""Incremental construction of agent programs (paper 003 §3.2; paper 000 §2.1).

`ProgramBuilder` is what generators and trace readers use to emit turns: it applies the
context-formation rules of `program.py` as turns are added, so a generator can ask how long a
branch's next context would be (to trigger compaction) or which segments it holds (to drop old
screenshots), and it wires the causal dependencies (each turn of a branch depends on the
branch's previous turn, r_{k+1} = c_k + g_k) so that generators cannot forget them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cluster.workloads.program import Program, Segment, SegmentIds, Turn, TurnKind
from cluster.workloads.turn_table import pack_turns


class ProgramBuilder:
    """Turns of one program in topological order, with each turn's context tracked."""

    def __init__(self, program_id: str, workload: str, ids: SegmentIds) -> None:
        self.program_id = program_id
        self.workload = workload
        self.ids = ids
        self.turns: list[Turn] = []
        self._contexts: list[tuple[Segment, ...]] = []  # input context of each turn
        self._last: dict[str, int] = {}  # branch -> index of its latest turn
        self._finished: set[str] = set()

    # -- content -----------------------------------------------------------------------------

    def seg(self, tokens: int) -> Segment:
        """A new segment of unique content."""
        return Segment(self.ids(), tokens)

    def context(self, turn: int) -> tuple[Segment, ...]:
        return self._contexts[turn]

    def output(self, turn: int) -> Segment | None:
        t = self.turns[turn]
        return Segment(t.output_seg, t.output_tokens) if t.output_tokens > 0 else None

    def last_turn(self, branch: str) -> int:
        return self._last[branch]

    def extended(self, branch: str) -> tuple[Segment, ...]:
        """What the branch's next "append" turn extends: last context + last output."""
        i = self._last[branch]
        out = self.output(i)
        return self._contexts[i] + ((out,) if out is not None else ())

    def next_tokens(self, branch: str, append_tokens: int = 0) -> int:
        """Length of the branch's next context if it appended `append_tokens`."""
        return sum(s.tokens for s in self.extended(branch)) + append_tokens

    # -- turns -------------------------------------------------------------------------------

    def start(self, branch: str, append: Sequence[Segment], output_tokens: int) -> int:
        if self.turns:
            raise ValueError("start must be the program's first turn")
        turn = Turn(branch, "start", tuple(append), output_tokens, self.ids())
        return self._add(turn, turn.append)

    def step(
        self,
        branch: str,
        append: Sequence[Segment],
        output_tokens: int,
        *,
        gap_s: float,
        tool: str | None,
        extra_deps: Iterable[int] = (),
    ) -> int:
        """An "append" turn of an existing branch; `extra_deps` e.g. the sub-agents it joins."""
        prev = self._require_open(branch)
        deps = (prev, *sorted(set(extra_deps) - {prev}))
        turn = Turn(
            branch, "append", tuple(append), output_tokens, self.ids(), deps, gap_s, tool=tool
        )
        return self._add(turn, self.extended(branch) + turn.append)

    def compact(
        self,
        branch: str,
        keep: int,
        append: Sequence[Segment],
        output_tokens: int,
        *,
        gap_s: float,
        tool: str | None,
        extra_deps: Iterable[int] = (),
    ) -> int:
        """A "compact" turn: the branch's previous context[:keep] + append (version bump)."""
        prev = self._require_open(branch)
        old = self._contexts[prev]
        if not 0 <= keep <= len(old):
            raise ValueError(f"compact keep={keep} outside the previous context (0..{len(old)})")
        turn = Turn(
            branch,
            "compact",
            tuple(append),
            output_tokens,
            self.ids(),
            (prev, *sorted(set(extra_deps) - {prev})),
            gap_s,
            compact_keep=keep,
            tool=tool,
        )
        return self._add(turn, old[:keep] + turn.append)

    def fork(
        self,
        branch: str,
        parent_turn: int,
        append: Sequence[Segment],
        output_tokens: int,
        *,
        gap_s: float,
        tool: str | None = "fork",
    ) -> int:
        """A new branch whose context reuses `parent_turn`'s context and output."""
        parent = self.turns[parent_turn].branch_id
        out = self.output(parent_turn)
        base = self._contexts[parent_turn] + ((out,) if out is not None else ())
        return self._new_branch(
            branch, "fork", parent, parent_turn, base, append, output_tokens, gap_s, tool
        )

    def subagent(
        self,
        branch: str,
        spawn_turn: int,
        append: Sequence[Segment],
        output_tokens: int,
        *,
        gap_s: float,
        tool: str | None = "spawn",
    ) -> int:
        """A new branch with a fresh context, released after `spawn_turn` completes."""
        parent = self.turns[spawn_turn].branch_id
        return self._new_branch(
            branch, "subagent", parent, spawn_turn, (), append, output_tokens, gap_s, tool
        )

    def finish(self, branch: str) -> None:
        """Mark the branch's latest turn as its last (the harness reports the finish)."""
        i = self._require_open(branch)
        self.turns[i] = self.turns[i].finishing()
        self._finished.add(branch)

    def build(self, arrival_s: float | None = None) -> Program:
        open_branches = set(self._last) - self._finished
        if open_branches:
            raise ValueError(
                f"program {self.program_id}: branches never finished: {sorted(open_branches)}"
            )
        return Program(self.program_id, self.workload, pack_turns(self.turns), arrival_s)

    # -- internals ---------------------------------------------------------------------------

    def _new_branch(
        self,
        branch: str,
        kind: TurnKind,
        parent: str,
        parent_turn: int,
        base: tuple[Segment, ...],
        append: Sequence[Segment],
        output_tokens: int,
        gap_s: float,
        tool: str | None,
    ) -> int:
        if branch in self._last:
            raise ValueError(f"branch {branch!r} already exists")
        turn = Turn(
            branch,
            kind,
            tuple(append),
            output_tokens,
            self.ids(),
            (parent_turn,),
            gap_s,
            parent_branch=parent,
            parent_turn=parent_turn if kind == "fork" else None,
            tool=tool,
        )
        return self._add(turn, base + turn.append)

    def _require_open(self, branch: str) -> int:
        if branch not in self._last:
            raise ValueError(f"branch {branch!r} has no turns yet")
        if branch in self._finished:
            raise ValueError(f"branch {branch!r} already finished")
        return self._last[branch]

    def _add(self, turn: Turn, context: tuple[Segment, ...]) -> int:
        if not context:
            raise ValueError(
                f"program {self.program_id}: turn {len(self.turns)} has an empty context"
            )
        self.turns.append(turn)
        self._contexts.append(context)
        self._last[turn.branch_id] = len(self.turns) - 1
        return len(self.turns) - 1
