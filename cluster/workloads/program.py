"""Agent programs: the unit of simulated work (paper 003 §3.2; paper 000 §2.1).

A program is a DAG of turns (LLM requests). Each turn belongs to a branch (an independently
maintained context). A turn is released at r = max(c_dep for dep in deps) + gap_s, i.e.
r_{k+1} = c_k + g_k for a chain (causal release; the simulator computes c). Policies never
see `output_tokens`, `gap_s` or future turns: the simulator reveals them only as they occur.

Contexts are sequences of `Segment`s (runs of tokens with a content identity) so that
prefix sharing is explicit and cheap: two contexts share a prefix exactly as long as their
leading segments are equal. How a turn forms its context from the branch's previous one:

- "start":    context = append                      (first turn of the program's root branch)
- "append":   context = prev context + prev output + append
- "fork":     context = parent's context + parent's output (as of `parent_turn`) + append
- "subagent": context = append                      (a new context; may reuse shared segments
              such as the system prompt, so it can share a prefix with other branches)
- "compact":  context = prev context[:compact_keep] + append   (history replaced by a summary,
              which is normally the first appended segment; version bump, Alg. E.1)

The output of a turn is the segment `Segment(turn.output_seg, turn.output_tokens)`.
A branch finishes after the turn with `finishes_branch=True`. Segment ids are unique per
content across the whole workload (`SegmentIds` hands them out); equal ids mean equal
tokens, which is how programs share system prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TurnKind = Literal["start", "append", "fork", "subagent", "compact"]
TURN_KINDS: tuple[TurnKind, ...] = ("start", "append", "fork", "subagent", "compact")

# Segment ids below this bound are reserved for content shared across programs
# (system prompts, tool schemas); generators allocate per-program ids above it.
SHARED_SEGMENT_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True, init=False)
class Segment:
    """A run of `tokens` tokens whose content is identified by `seg_id`."""

    seg_id: int
    tokens: int

    def __init__(self, seg_id: int, tokens: int) -> None:
        # Sets the frozen slots through their descriptors: what the generated __init__ does,
        # ~40% faster (a segment is made for most generated turns and packed-turn reads).
        if tokens <= 0:
            raise ValueError(f"Segment.tokens must be > 0, got {tokens}")
        _set_seg_id(self, seg_id)
        _set_tokens(self, tokens)


_set_seg_id = Segment.__dict__["seg_id"].__set__
_set_tokens = Segment.__dict__["tokens"].__set__


@dataclass(frozen=True, slots=True)
class Turn:
    """One LLM request of a branch; see the module docstring for context formation."""

    branch_id: str
    kind: TurnKind
    append: tuple[Segment, ...]
    output_tokens: int
    output_seg: int  # segment id of this turn's output
    deps: tuple[int, ...] = ()  # indices (in Program.turns) that must complete first
    gap_s: float = 0.0  # tool / user / sub-agent wait after the last dep completes
    parent_branch: str | None = None  # fork / subagent: the branch that spawned it
    parent_turn: int | None = None  # fork: the parent's turn whose context+output is reused
    compact_keep: int = 0  # compact: leading segments of the old context that survive
    tool: str | None = None  # what the gap before this turn waited for (per-tool TTL)
    finishes_branch: bool = False

    def __post_init__(self) -> None:
        if self.kind not in TURN_KINDS:
            raise ValueError(f"Turn.kind must be one of {TURN_KINDS}, got {self.kind!r}")
        if self.output_tokens < 0:
            raise ValueError(f"Turn.output_tokens must be >= 0, got {self.output_tokens}")
        if self.gap_s < 0:
            raise ValueError(f"Turn.gap_s must be >= 0, got {self.gap_s}")
        if self.kind in ("fork", "subagent") and self.parent_branch is None:
            raise ValueError(f"a {self.kind} turn needs parent_branch")
        if self.kind == "fork" and self.parent_turn is None:
            raise ValueError("a fork turn needs parent_turn")

    def finishing(self) -> Turn:
        """This turn as its branch's last (what `dataclasses.replace` would give, faster)."""
        return Turn(
            self.branch_id, self.kind, self.append, self.output_tokens, self.output_seg,
            self.deps, self.gap_s, self.parent_branch, self.parent_turn, self.compact_keep,
            self.tool, True,
        )  # fmt: skip

    @property
    def append_tokens(self) -> int:
        return sum(s.tokens for s in self.append)


@dataclass(frozen=True, slots=True)
class Program:
    """One agent: its turns in a topological order (every dep index < the turn's index)."""

    program_id: str
    workload: str
    turns: Sequence[Turn]  # a tuple, or a `TurnTable` for long programs (`pack_turns`)
    arrival_s: float | None = None  # trace replay: fixed arrival; None = set by the loop

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"program {self.program_id} has no turns")
        check = getattr(self.turns, "check", None)
        if check is not None:  # a packed table checks its columns (no Turn objects built)
            check(self.program_id)
            return
        for i, t in enumerate(self.turns):
            if any(d >= i or d < 0 for d in t.deps):
                raise ValueError(
                    f"program {self.program_id} turn {i}: deps {t.deps} must precede it"
                )
            if t.parent_turn is not None and not 0 <= t.parent_turn < i:
                raise ValueError(f"program {self.program_id} turn {i}: parent_turn must precede it")


class SegmentIds:
    """Allocator of per-program segment ids, all above the shared range."""

    def __init__(self, start: int = SHARED_SEGMENT_LIMIT) -> None:
        if start < SHARED_SEGMENT_LIMIT:
            raise ValueError(f"per-program segment ids start at {SHARED_SEGMENT_LIMIT} or above")
        self._next = start

    def __call__(self) -> int:
        self._next += 1
        return self._next
