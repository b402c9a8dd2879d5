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
from collections.abc import Iterator, Sequence
from typing import overload

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
        names: list[str | None] = [None]  # branch ids and tool names; index 0 is None
        index: dict[str | None, int] = {None: 0}

        def name(s: str | None) -> int:
            i = index.get(s)
            if i is None:
                i = index[s] = len(names)
                names.append(s)
            return i

        self._kind = array("b", [_KIND_INDEX[t.kind] for t in turns])
        self._branch = array("i", [name(t.branch_id) for t in turns])
        self._parent_branch = array("i", [name(t.parent_branch) for t in turns])
        self._tool = array("i", [name(t.tool) for t in turns])
        self._names = tuple(names)
        self._out_tok = array("i", [t.output_tokens for t in turns])
        self._out_seg = array("q", [t.output_seg for t in turns])
        self._gap = array("d", [t.gap_s for t in turns])
        self._parent_turn = array(
            "i", [-1 if t.parent_turn is None else t.parent_turn for t in turns]
        )
        self._keep = array("i", [t.compact_keep for t in turns])
        self._finishes = array("b", [t.finishes_branch for t in turns])
        self._dep_ptr, self._deps = _csr([t.deps for t in turns])
        self._app_ptr, self._app_id = _csr([[s.seg_id for s in t.append] for t in turns], "q")
        self._app_tok = array("i", [s.tokens for t in turns for s in t.append])
        succ: list[list[int]] = [[] for _ in turns]
        for i, t in enumerate(turns):
            for d in t.deps:
                succ[d].append(i)
        self._succ_ptr, self._succ = _csr(succ)

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
        """Raise unless every dep and fork parent precedes its turn (what `Program` checks)."""
        for i in range(len(self._kind)):
            deps = self.deps(i)
            if any(d >= i or d < 0 for d in deps):
                raise ValueError(
                    f"program {program_id} turn {i}: deps {tuple(deps)} must precede it"
                )
            if self._parent_turn[i] >= i:
                raise ValueError(f"program {program_id} turn {i}: parent_turn must precede it")

    # -- internals -----------------------------------------------------------------------------

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


def _csr(rows: Sequence[Sequence[int]], code: str = "i") -> tuple[array[int], array[int]]:
    ptr = array("i", [0])
    flat = array(code)
    for r in rows:
        flat.extend(r)
        ptr.append(len(flat))
    return ptr, flat


def root_turns(turns: Sequence[Turn]) -> list[int]:
    """The turns of a program without deps (released at its arrival)."""
    if isinstance(turns, TurnTable):
        return turns.roots()
    return [i for i, t in enumerate(turns) if not t.deps]


def pack_turns(turns: Sequence[Turn]) -> Sequence[Turn]:
    """`turns` as a `TurnTable` when the program is long, else as a tuple."""
    return TurnTable(turns) if len(turns) > PACK_MIN_TURNS else tuple(turns)
