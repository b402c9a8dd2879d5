"""A program's turns packed into columns: what a long-running simulation holds per agent.

A `Turn` object with its segments, ids and draws is ~430 bytes; a 96-node partition of the
3,072-GPU configuration holds 3,840 coding agents of ~300 turns each from their arrival on,
i.e. over a million turns. `TurnTable` keeps the same turns in `array` columns (~70 bytes a
turn) and hands out an equal `Turn` on each access, so every reader of `Program.turns` (a
`Sequence[Turn]`) works unchanged. It also holds the dependency graph both ways (each turn's
dependency count and its successors), which the simulator needs for every program it runs.

Short programs (a trace's single calls) stay plain tuples: packing pays only for long ones.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterator, Sequence
from itertools import accumulate, chain
from typing import Any, overload

import numpy as np

from cluster.workloads.program import TURN_KINDS, Segment, Turn

# Programs with more turns than this are packed (`pack_turns`).
PACK_MIN_TURNS = 16

_KIND_INDEX = {k: i for i, k in enumerate(TURN_KINDS)}


class Successors(Sequence[Sequence[int]]):
    """Turn i's successors (the turns that list i among their deps), in increasing order."""

    __slots__ = ("_idx", "_ptr")

    def __init__(self, ptr: array[int], idx: array[int]) -> None:
        self._ptr = ptr
        self._idx = idx

    @overload
    def __getitem__(self, i: int) -> Sequence[int]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Sequence[int]]: ...
    def __getitem__(self, i: int | slice) -> Sequence[int] | Sequence[Sequence[int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._idx[self._ptr[i] : self._ptr[i + 1]]

    def __len__(self) -> int:
        return len(self._ptr) - 1


class TurnTable(Sequence[Turn]):
    """The turns of one program in columns; `table[i]` is a `Turn` equal to the one packed."""

    __slots__ = (
        "_app_id",
        "_app_ptr",
        "_app_tok",
        "_branch",
        "_dep_ptr",
        "_deps",
        "_finishes",
        "_gap",
        "_keep",
        "_kind",
        "_names",
        "_out_seg",
        "_out_tok",
        "_parent_branch",
        "_parent_turn",
        "_succ",
        "_succ_ptr",
        "_tool",
    )

    def __init__(self, turns: Sequence[Turn]) -> None:
        self._fill(
            [
                (t.branch_id, t.kind, t.append, t.output_tokens, t.output_seg, t.deps, t.gap_s,
                 t.parent_branch, t.parent_turn, t.compact_keep, t.tool)
                for t in turns
            ],
            [t.finishes_branch for t in turns],
        )  # fmt: skip

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Any, ...]], finishing: Collection[int]) -> TurnTable:
        """A table from rows of `Turn`'s fields in field order without `finishes_branch`
        (`ProgramBuilder`'s form); `finishing` holds the indices of the branches' last turns.
        The rows are not checked as `Turn` checks its fields: the builder has done that."""
        table = cls.__new__(cls)
        finishes = bytearray(len(rows))
        for i in finishing:
            finishes[i] = 1
        table._fill(rows, finishes)
        return table

    def _fill(self, rows: Sequence[tuple[Any, ...]], finishes: Sequence[bool | int]) -> None:
        n = len(rows)
        if n:
            branch, kind, append, out_tok, out_seg, deps, gap, pbranch, pturn, keep, tool = zip(
                *rows, strict=True
            )
        else:
            branch = kind = append = out_tok = out_seg = deps = gap = pbranch = pturn = keep = ()
            tool = ()
        # Branch ids and tool names (sorted), index 0 is None.
        names: tuple[str | None, ...] = (None, *sorted({*branch, *pbranch, *tool} - {None}))
        index = {s: i for i, s in enumerate(names)}
        self._kind = array("b", [_KIND_INDEX[k] for k in kind])
        self._branch = array("i", [index[s] for s in branch])
        self._parent_branch = array("i", [index[s] for s in pbranch])
        self._tool = array("i", [index[s] for s in tool])
        self._names = names
        self._out_tok = array("i", out_tok)
        self._out_seg = array("q", out_seg)
        self._gap = array("d", gap)
        self._parent_turn = array("i", [-1 if t is None else t for t in pturn])
        self._keep = array("i", keep)
        self._finishes = array("b", list(finishes))  # a list: no spare capacity
        self._dep_ptr = array("i", accumulate(map(len, deps), initial=0))
        self._deps = array("i", chain.from_iterable(deps))
        self._app_ptr = array("i", accumulate(map(len, append), initial=0))
        self._app_id = array("q", [s.seg_id for a in append for s in a])
        self._app_tok = array("i", [s.tokens for a in append for s in a])
        # Successors: the dep entries' owning turns, stably sorted by dep (a counting sort).
        dep = np.frombuffer(self._deps, np.intc)
        if dep.size and (dep.min() < 0 or dep.max() >= n):
            i = int(self._owners()[(dep < 0) | (dep >= n)][0])
            raise ValueError(f"turn {i}: deps {tuple(self.deps(i))} outside the program's turns")
        self._succ = _ints(self._owners()[np.argsort(dep, kind="stable")])
        self._succ_ptr = _ints(np.concatenate(([0], np.cumsum(np.bincount(dep, minlength=n)))))

    # -- Sequence[Turn] ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._kind)

    @overload
    def __getitem__(self, i: int) -> Turn: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Turn, ...]: ...
    def __getitem__(self, i: int | slice) -> Turn | tuple[Turn, ...]:
        if isinstance(i, slice):
            return tuple(self._turn(j) for j in range(*i.indices(len(self))))
        n = len(self._kind)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"turn index {i} out of range (0..{n - 1})")
        return self._turn(i)

    def __iter__(self) -> Iterator[Turn]:
        return (self._turn(i) for i in range(len(self._kind)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TurnTable | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"TurnTable({len(self)} turns)"

    # -- the dependency graph ------------------------------------------------------------------

    def dep_counts(self) -> list[int]:
        """How many deps each turn waits for (a new list: the caller counts it down)."""
        ptr = self._dep_ptr
        return [ptr[i + 1] - ptr[i] for i in range(len(self._kind))]

    def successors(self) -> Successors:
        return Successors(self._succ_ptr, self._succ)

    def gaps(self) -> Sequence[float]:
        """Every turn's `gap_s`, in turn order: the column itself (read it, do not modify it)."""
        return self._gap

    def deps(self, i: int) -> Sequence[int]:
        return self._deps[self._dep_ptr[i] : self._dep_ptr[i + 1]]

    def roots(self) -> list[int]:
        """Turns without deps (released at arrival)."""
        ptr = self._dep_ptr
        return [i for i in range(len(self._kind)) if ptr[i] == ptr[i + 1]]

    def fork_parents(self) -> set[int]:
        fork = _KIND_INDEX["fork"]
        return {self._parent_turn[i] for i, k in enumerate(self._kind) if k == fork}

    def check(self, program_id: str) -> None:
        """Raise unless every dep and fork parent precedes its turn (what `Program` checks);
        the first offending turn is named, its deps checked before its fork parent."""
        turn = np.arange(len(self._kind), dtype=np.intc)
        owner = self._owners()
        dep = np.frombuffer(self._deps, np.intc)
        bad_dep = owner[(dep >= owner) | (dep < 0)]
        bad_parent = turn[np.frombuffer(self._parent_turn, np.intc) >= turn]
        if not bad_dep.size and not bad_parent.size:
            return
        if bad_dep.size and (not bad_parent.size or bad_dep[0] <= bad_parent[0]):
            i = int(bad_dep[0])
            raise ValueError(
                f"program {program_id} turn {i}: deps {tuple(self.deps(i))} must precede it"
            )
        raise ValueError(f"program {program_id} turn {bad_parent[0]}: parent_turn must precede it")

    # -- internals -----------------------------------------------------------------------------

    def _owners(self) -> np.ndarray:
        """The turn each entry of the flat deps column belongs to."""
        ptr: np.ndarray = np.frombuffer(self._dep_ptr, np.intc)
        return np.repeat(np.arange(len(ptr) - 1, dtype=np.intc), ptr[1:] - ptr[:-1])

    def _turn(self, i: int) -> Turn:
        names = self._names
        a0, a1 = self._app_ptr[i], self._app_ptr[i + 1]
        ids, toks = self._app_id, self._app_tok
        parent_turn = self._parent_turn[i]
        return Turn(
            names[self._branch[i]],  # type: ignore[arg-type]
            TURN_KINDS[self._kind[i]],
            tuple(Segment(ids[j], toks[j]) for j in range(a0, a1)),
            self._out_tok[i],
            self._out_seg[i],
            tuple(self._deps[self._dep_ptr[i] : self._dep_ptr[i + 1]]),
            self._gap[i],
            names[self._parent_branch[i]],
            None if parent_turn < 0 else parent_turn,
            self._keep[i],
            names[self._tool[i]],
            bool(self._finishes[i]),
        )


def _ints(values: np.ndarray) -> array[int]:
    """A numpy integer vector as an `array("i")` column (from a list: no spare capacity)."""
    return array("i", values.tolist())


def root_turns(turns: Sequence[Turn]) -> list[int]:
    """The turns of a program without deps (released at its arrival)."""
    if isinstance(turns, TurnTable):
        return turns.roots()
    return [i for i, t in enumerate(turns) if not t.deps]


def pack_turns(turns: Sequence[Turn]) -> Sequence[Turn]:
    """`turns` as a `TurnTable` when the program is long, else as a tuple."""
    return TurnTable(turns) if len(turns) > PACK_MIN_TURNS else tuple(turns)
