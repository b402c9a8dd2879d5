"""Incremental construction of agent programs (paper 003 §3.2; paper 000 §2.1).

`ProgramBuilder` is what generators and trace readers use to emit turns: it applies the
context-formation rules of `program.py` as turns are added, so a generator can ask how long a
branch's next context would be (to trigger compaction) or which segments it holds (to drop old
screenshots), and it wires the causal dependencies (each turn of a branch depends on the
branch's previous turn, r_{k+1} = c_k + g_k) so that generators cannot forget them.

It is on the simulator's hot path (a 96-node partition generates thousands of ~200-turn
programs), so it keeps each turn as a row of `Turn`'s fields (no `Turn` object until a caller
asks) and each branch's context as one growing list: a turn's context is the first `n`
segments of its branch's list, with its token total kept alongside, so `next_tokens` is O(1)
and contexts take O(turns) memory, not O(turns²). Forks, sub-agents and compactions start a
new list (a fork copies its parent's prefix once).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cluster.workloads.program import Program, Segment, SegmentIds, Turn, TurnKind
from cluster.workloads.turn_table import PACK_MIN_TURNS, TurnTable

# A turn as a row of `Turn`'s fields, in field order, without `finishes_branch`.
Row = tuple[
    str, TurnKind, tuple[Segment, ...], int, int, tuple[int, ...], float,
    str | None, int | None, int, str | None,
]  # fmt: skip


class ProgramBuilder:
    """Turns of one program in topological order, with each turn's context tracked."""

    def __init__(self, program_id: str, workload: str, ids: SegmentIds) -> None:
        self.program_id = program_id
        self.workload = workload
        self.ids = ids
        self._rows: list[Row] = []
        self._finishing: set[int] = set()  # turns that finish their branch
        # Turn i's input context is _ctx[i][:_ctx_len[i]] (its branch's list), of _ctx_tok[i]
        # tokens; only a branch's own "append" turns extend its list, in place. An int j in a
        # list stands for turn j's output segment (made only when a context is read).
        self._ctx: list[list[Segment | int]] = []
        self._ctx_len: list[int] = []
        self._ctx_tok: list[int] = []
        self._last: dict[str, int] = {}  # branch -> index of its latest turn
        self._finished: set[str] = set()

    # -- content -----------------------------------------------------------------------------

    def seg(self, tokens: int) -> Segment:
        """A new segment of unique content."""
        return Segment(self.ids(), tokens)

    @property
    def num_turns(self) -> int:
        return len(self._rows)

    @property
    def turns(self) -> list[Turn]:
        """The turns so far, as new `Turn` objects (a copy; `build` gives the program)."""
        fin = self._finishing
        return [Turn(*r, i in fin) for i, r in enumerate(self._rows)]

    def context(self, turn: int) -> tuple[Segment, ...]:
        return tuple(
            s if isinstance(s, Segment) else self._output(s)
            for s in self._ctx[turn][: self._ctx_len[turn]]
        )

    def context_len(self, turn: int) -> int:
        """How many segments `context(turn)` holds (without building it)."""
        return self._ctx_len[turn]

    def output(self, turn: int) -> Segment | None:
        r = self._rows[turn]
        return Segment(r[4], r[3]) if r[3] > 0 else None

    def _output(self, turn: int) -> Segment:
        r = self._rows[turn]
        return Segment(r[4], r[3])

    def last_turn(self, branch: str) -> int:
        return self._last[branch]

    def extended(self, branch: str) -> tuple[Segment, ...]:
        """What the branch's next "append" turn extends: last context + last output."""
        i = self._last[branch]
        out = self.output(i)
        return self.context(i) + ((out,) if out is not None else ())

    def next_tokens(self, branch: str, append_tokens: int = 0) -> int:
        """Length of the branch's next context if it appended `append_tokens`."""
        i = self._last[branch]
        return self._ctx_tok[i] + self._rows[i][3] + append_tokens

    # -- turns -------------------------------------------------------------------------------

    def start(self, branch: str, append: Sequence[Segment], output_tokens: int) -> int:
        if self._rows:
            raise ValueError("start must be the program's first turn")
        app = tuple(append)
        row: Row = (branch, "start", app, output_tokens, self.ids(), (), 0.0, None, None, 0, None)
        return self._add(row, list(app), _tokens(app))

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
        # The most frequent call of every generator: the checks inline, helpers only to raise.
        prev = self._last.get(branch)
        if prev is None or branch in self._finished:
            prev = self._require_open(branch)
        deps = self._deps(prev, extra_deps) if extra_deps else (prev,)
        if output_tokens < 0 or gap_s < 0:
            _check(output_tokens, gap_s)
        app = tuple(append)
        row: Row = (branch, "append", app, output_tokens, self.ids(), deps, gap_s, None, None, 0,
                    tool)  # fmt: skip
        ctx, n = self._ctx[prev], self._ctx_len[prev]
        if len(ctx) != n:  # not the branch's own list (cannot happen; kept safe)
            ctx = ctx[:n]
        prow = self._rows[prev]
        tokens = self._ctx_tok[prev] + prow[3]
        if prow[3] > 0:
            ctx.append(prev)
        for s in app:
            tokens += s.tokens
        ctx.extend(app)
        return self._add(row, ctx, tokens)

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
        n = self._ctx_len[prev]
        if not 0 <= keep <= n:
            raise ValueError(f"compact keep={keep} outside the previous context (0..{n})")
        deps = self._deps(prev, extra_deps)
        _check(output_tokens, gap_s)
        app = tuple(append)
        row: Row = (branch, "compact", app, output_tokens, self.ids(), deps, gap_s, None, None,
                    keep, tool)  # fmt: skip
        ctx = self._ctx[prev][:keep]
        tokens = sum(self._rows[s][3] if isinstance(s, int) else s.tokens for s in ctx)
        tokens += _tokens(app)
        ctx.extend(app)
        return self._add(row, ctx, tokens)

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
        self._check_dep(parent_turn)
        ctx = self._ctx[parent_turn][: self._ctx_len[parent_turn]]
        prow = self._rows[parent_turn]
        if prow[3] > 0:
            ctx.append(parent_turn)
        return self._new_branch(
            branch, "fork", parent_turn, ctx, self._ctx_tok[parent_turn] + prow[3], append,
            output_tokens, gap_s, tool,
        )  # fmt: skip

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
        self._check_dep(spawn_turn)
        return self._new_branch(
            branch, "subagent", spawn_turn, [], 0, append, output_tokens, gap_s, tool
        )

    def finish(self, branch: str) -> None:
        """Mark the branch's latest turn as its last (the harness reports the finish)."""
        self._finishing.add(self._require_open(branch))
        self._finished.add(branch)

    def build(self, arrival_s: float | None = None) -> Program:
        open_branches = set(self._last) - self._finished
        if open_branches:
            raise ValueError(
                f"program {self.program_id}: branches never finished: {sorted(open_branches)}"
            )
        turns = (
            TurnTable.from_rows(self._rows, self._finishing)
            if len(self._rows) > PACK_MIN_TURNS
            else tuple(self.turns)
        )
        return Program(self.program_id, self.workload, turns, arrival_s)

    # -- internals ---------------------------------------------------------------------------

    def _new_branch(
        self,
        branch: str,
        kind: TurnKind,
        parent_turn: int,
        ctx: list[Segment | int],
        tokens: int,
        append: Sequence[Segment],
        output_tokens: int,
        gap_s: float,
        tool: str | None,
    ) -> int:
        if branch in self._last:
            raise ValueError(f"branch {branch!r} already exists")
        _check(output_tokens, gap_s)
        app = tuple(append)
        row: Row = (
            branch, kind, app, output_tokens, self.ids(), (parent_turn,), gap_s,
            self._rows[parent_turn][0], parent_turn if kind == "fork" else None, 0, tool,
        )  # fmt: skip
        ctx.extend(app)
        return self._add(row, ctx, tokens + _tokens(app))

    def _require_open(self, branch: str) -> int:
        if branch not in self._last:
            raise ValueError(f"branch {branch!r} has no turns yet")
        if branch in self._finished:
            raise ValueError(f"branch {branch!r} already finished")
        return self._last[branch]

    def _deps(self, prev: int, extra: Iterable[int]) -> tuple[int, ...]:
        if not extra:
            return (prev,)
        deps = (prev, *sorted(set(extra) - {prev}))
        for d in deps:
            self._check_dep(d, deps)
        return deps

    def _check_dep(self, d: int, deps: tuple[int, ...] | None = None) -> None:
        """A dependency must be an earlier turn (what `Program` checks, raised here)."""
        if not 0 <= d < len(self._rows):
            raise ValueError(
                f"program {self.program_id} turn {len(self._rows)}: deps {deps or (d,)} "
                "must precede it"
            )

    def _add(self, row: Row, ctx: list[Segment | int], tokens: int) -> int:
        i = len(self._rows)
        if not ctx:
            raise ValueError(f"program {self.program_id}: turn {i} has an empty context")
        self._rows.append(row)
        self._ctx.append(ctx)
        self._ctx_len.append(len(ctx))
        self._ctx_tok.append(tokens)
        self._last[row[0]] = i
        return i


def _tokens(segments: Iterable[Segment]) -> int:
    n = 0
    for s in segments:
        n += s.tokens
    return n


def _check(output_tokens: int, gap_s: float) -> None:
    """`Turn`'s own checks of the values a caller passes (rows skip `Turn.__post_init__`)."""
    if output_tokens < 0:
        raise ValueError(f"Turn.output_tokens must be >= 0, got {output_tokens}")
    if gap_s < 0:
        raise ValueError(f"Turn.gap_s must be >= 0, got {gap_s}")
