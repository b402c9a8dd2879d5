"""Reference context builder and workload statistics (paper 003 §3.2; paper 000 Fig. 3, Table D.4).

`contexts(program)` applies the context-formation rules of `program.py` turn by turn; it is the
reference the simulator's own bookkeeping can be tested against. `check_program` asserts the
structural rules a simulator relies on. `request_stats` measures every request under the
*ideal* cache of paper 000: unlimited KV shared by all nodes, no switches, so a prompt token is
cached iff the same prefix (by segment identity, token-level) appeared in an earlier request's
prompt or output ("the ideal KV hit rate counts every prompt token whose KV an earlier request
produced", Table D.4). `ideal_hit_rate` is h*, against which lost KV reuse 1 - h/h* is defined.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from cluster.workloads.program import SHARED_SEGMENT_LIMIT, Program, Segment, Turn


def contexts(program: Program) -> list[list[Segment]]:
    """The input context (list of segments) of every turn, by the rules of `program.py`."""
    out: list[list[Segment]] = []
    last: dict[str, int] = {}
    for i, turn in enumerate(program.turns):
        if turn.kind in ("start", "subagent"):
            ctx = list(turn.append)
        elif turn.kind == "fork":
            assert turn.parent_turn is not None
            ctx = (
                out[turn.parent_turn] + _output(program.turns[turn.parent_turn]) + list(turn.append)
            )
        else:
            prev = last.get(turn.branch_id)
            if prev is None:
                raise ValueError(
                    f"{program.program_id} turn {i}: {turn.kind} on a branch with no turns"
                )
            if turn.kind == "append":
                ctx = out[prev] + _output(program.turns[prev]) + list(turn.append)
            else:  # compact
                ctx = out[prev][: turn.compact_keep] + list(turn.append)
        out.append(ctx)
        last[turn.branch_id] = i
    return out


def _output(turn: Turn) -> list[Segment]:
    return [Segment(turn.output_seg, turn.output_tokens)] if turn.output_tokens > 0 else []


def check_program(program: Program) -> None:
    """Raise ValueError naming the first structural problem of `program`, if any.

    Rules: the first turn is the program's only "start" (branch "root"); a branch's first turn
    is start/fork/subagent and its later turns append/compact, each depending on the branch's
    previous turn; fork/subagent turns depend on a turn of `parent_branch` (fork: `parent_turn`);
    compact_keep fits the previous context; every branch ends with exactly one
    `finishes_branch` turn and has no turn after it; output segment ids are unique; contexts are
    non-empty.
    """
    pid = program.program_id
    last: dict[str, int] = {}
    finished: set[str] = set()
    lengths: list[int] = []
    outputs: set[int] = set()
    for i, t in enumerate(program.turns):
        where = f"{pid} turn {i} ({t.branch_id}, {t.kind})"
        if (t.kind == "start") != (i == 0):
            raise ValueError(f"{where}: exactly the first turn must be 'start'")
        if t.branch_id in finished:
            raise ValueError(f"{where}: branch already finished")
        if t.output_seg in outputs:
            raise ValueError(f"{where}: output_seg {t.output_seg} reused")
        outputs.add(t.output_seg)
        if t.output_seg < SHARED_SEGMENT_LIMIT:
            raise ValueError(f"{where}: output_seg {t.output_seg} lies in the shared range")
        new_branch = t.branch_id not in last
        if new_branch != (t.kind in ("start", "fork", "subagent")):
            raise ValueError(f"{where}: kind does not match the branch's position")
        if t.kind in ("append", "compact"):
            prev = last[t.branch_id]
            if prev not in t.deps:
                raise ValueError(f"{where}: does not depend on its branch's previous turn {prev}")
            if t.kind == "compact" and t.compact_keep > lengths[prev]:
                raise ValueError(
                    f"{where}: compact_keep {t.compact_keep} > previous context {lengths[prev]}"
                )
        if t.kind in ("fork", "subagent"):
            parents = [d for d in t.deps if program.turns[d].branch_id == t.parent_branch]
            if not parents:
                raise ValueError(f"{where}: no dependency on parent branch {t.parent_branch!r}")
            if t.kind == "fork":
                assert t.parent_turn is not None
                if program.turns[t.parent_turn].branch_id != t.parent_branch:
                    raise ValueError(f"{where}: parent_turn is not a turn of {t.parent_branch!r}")
                if t.parent_turn not in t.deps:
                    raise ValueError(f"{where}: fork does not depend on its parent_turn")
        lengths.append(_context_len(program, i, lengths, last))
        if lengths[-1] == 0:
            raise ValueError(f"{where}: empty context")
        last[t.branch_id] = i
        if t.finishes_branch:
            finished.add(t.branch_id)
    unfinished = set(last) - finished
    if unfinished:
        raise ValueError(f"{pid}: branches never finish: {sorted(unfinished)}")


def _context_len(program: Program, i: int, lengths: list[int], last: dict[str, int]) -> int:
    """Number of segments in turn i's context (cheap, no segment lists)."""
    t = program.turns[i]
    n_app = len(t.append)
    if t.kind in ("start", "subagent"):
        return n_app
    if t.kind == "fork":
        assert t.parent_turn is not None
        p = t.parent_turn
        return lengths[p] + (program.turns[p].output_tokens > 0) + n_app
    prev = last[t.branch_id]
    if t.kind == "append":
        return lengths[prev] + (program.turns[prev].output_tokens > 0) + n_app
    return t.compact_keep + n_app


def check_disjoint(programs: Iterable[Program]) -> None:
    """Raise ValueError if two programs use the same per-program (non-shared) segment id."""
    owner: dict[int, str] = {}
    for prog in programs:
        mine: set[int] = set()
        for t in prog.turns:
            mine.add(t.output_seg)
            mine.update(s.seg_id for s in t.append if s.seg_id >= SHARED_SEGMENT_LIMIT)
        for seg_id in mine:
            other = owner.setdefault(seg_id, prog.program_id)
            if other != prog.program_id:
                raise ValueError(f"segment id {seg_id} used by {other} and {prog.program_id}")


class RequestStat(NamedTuple):
    """One request under the ideal cache."""

    program_id: str
    workload: str
    turn: int
    branch_id: str
    kind: str
    tool: str | None
    input_tokens: int
    cached_tokens: int  # t_c under the ideal cache
    output_tokens: int
    gap_s: float
    joins: int  # dependencies on other branches (sub-agents joined by this turn)

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    @property
    def reuse(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


class IdealCache:
    """Unlimited prefix cache shared by everyone, keyed by chained hashes of segment ids.

    A prefix is present iff some earlier request's prompt + output started with it; since every
    prefix of a stored sequence is stored too, presence is monotone in the prefix length and the
    longest cached prefix is found by bisection.
    """

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def lookup_and_store(self, ctx: Sequence[Segment], output: Segment | None) -> int:
        """Cached prompt tokens of `ctx`; then store ctx + output. Returns t_c."""
        chain: list[int] = []
        h = 0
        for s in ctx:
            h = hash((h, s.seg_id))
            chain.append(h)
        seen = self._seen
        # number of leading segments whose prefix is cached (monotone -> bisect)
        n = bisect.bisect_left(range(len(chain)), True, key=lambda j: chain[j] not in seen)
        cached = sum(s.tokens for s in ctx[:n])
        for j in range(len(chain) - 1, n - 1, -1):
            seen.add(chain[j])
        if output is not None:
            seen.add(hash((h, output.seg_id)))
        return cached


def request_stats(
    programs: Iterable[Program], cache: IdealCache | None = None
) -> list[RequestStat]:
    """Per-request statistics, programs in the given order, turns in program order."""
    cache = cache if cache is not None else IdealCache()
    stats: list[RequestStat] = []
    for prog in programs:
        for i, (t, ctx) in enumerate(zip(prog.turns, contexts(prog), strict=True)):
            out = Segment(t.output_seg, t.output_tokens) if t.output_tokens > 0 else None
            cached = cache.lookup_and_store(ctx, out)
            joins = sum(1 for d in t.deps if prog.turns[d].branch_id != t.branch_id)
            stats.append(
                RequestStat(
                    prog.program_id, prog.workload, i, t.branch_id, t.kind, t.tool,
                    sum(s.tokens for s in ctx), cached, t.output_tokens, t.gap_s, joins,
                )
            )  # fmt: skip
    return stats


def ideal_hit_rate(programs: Iterable[Program]) -> float:
    """h*: fraction of prompt tokens whose prefix an earlier request already produced."""
    stats = request_stats(programs)
    total = sum(s.input_tokens for s in stats)
    return sum(s.cached_tokens for s in stats) / total if total else 0.0


def top_share(values: Sequence[float] | np.ndarray, top_fraction: float) -> float:
    """Share of the total held by the largest `top_fraction` of values (gap concentration)."""
    x = np.sort(np.asarray(values, dtype=float))[::-1]
    if x.size == 0 or x.sum() == 0:
        return 0.0
    k = max(1, round(top_fraction * x.size))
    return float(x[:k].sum() / x.sum())


class WorkloadSummary(NamedTuple):
    """Per-workload statistics (means are per request unless named per program)."""

    workload: str
    num_programs: int
    num_requests: int
    turns_per_program: float
    branches_per_program: float
    input_tokens: float
    uncached_tokens: float
    output_tokens: float
    gap_s: float  # mean gap over turns after the first of each program
    ideal_hit_rate: float
    top5_gap_share: float  # share of total gap time in the largest 5% of gaps
    long_gap_share: float  # share of gaps over 60 s
    long_gap_time_share: float  # share of gap time in gaps over 60 s


def summarize(programs: Sequence[Program], workload: str | None = None) -> WorkloadSummary:
    """Summary over `programs` (with a fresh ideal cache)."""
    stats = request_stats(programs)
    gaps = np.asarray([s.gap_s for s in stats if s.turn > 0], dtype=float)
    n = max(1, len(stats))
    inp = sum(s.input_tokens for s in stats)
    gap_total = gaps.sum() if gaps.size else 0.0
    return WorkloadSummary(
        workload=workload or (programs[0].workload if programs else ""),
        num_programs=len(programs),
        num_requests=len(stats),
        turns_per_program=len(stats) / max(1, len(programs)),
        branches_per_program=float(np.mean([len({t.branch_id for t in p.turns}) for p in programs]))
        if programs
        else 0.0,
        input_tokens=inp / n,
        uncached_tokens=sum(s.uncached_tokens for s in stats) / n,
        output_tokens=sum(s.output_tokens for s in stats) / n,
        gap_s=float(gaps.mean()) if gaps.size else 0.0,
        ideal_hit_rate=sum(s.cached_tokens for s in stats) / inp if inp else 0.0,
        top5_gap_share=top_share(gaps, 0.05),
        long_gap_share=float((gaps > 60).mean()) if gaps.size else 0.0,
        long_gap_time_share=float(gaps[gaps > 60].sum() / gap_total) if gap_total else 0.0,
    )
