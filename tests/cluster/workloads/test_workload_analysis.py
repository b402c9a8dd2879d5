"""Reference context builder, program checks and the ideal cache (cluster/workloads/analysis.py)."""

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.workloads import make_workload
from cluster.workloads.analysis import (
    check_disjoint,
    check_program,
    contexts,
    ideal_hit_rate,
    request_stats,
    top_share,
)
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.loops import AdmissionQueue, ClosedLoop, OpenLoop
from cluster.workloads.program import Program, Segment, SegmentIds, Turn

SYS = Segment(7, 100)


def _toy_program(ids: SegmentIds | None = None, pid: str = "toy") -> Program:
    """root: start, append, [fork f], [subagent s x2 turns], join, compact."""
    b = ProgramBuilder(pid, "toy", ids or SegmentIds())
    t0 = b.start("root", (SYS, b.seg(10)), 5)
    t1 = b.step("root", (b.seg(20),), 6, gap_s=1.0, tool="bash")
    b.fork("f", t1, (b.seg(3),), 4, gap_s=0.0)
    b.finish("f")
    s0 = b.subagent("s", t1, (SYS, b.seg(8)), 2, gap_s=0.0)
    s1 = b.step("s", (b.seg(9),), 3, gap_s=0.5, tool="read")
    b.finish("s")
    t4 = b.step("root", (b.seg(11),), 7, gap_s=0.1, tool="subagent", extra_deps=[s1])
    b.compact("root", 1, (b.seg(12),), 8, gap_s=0.2, tool="compact")
    b.finish("root")
    assert (t0, t1, s0, t4) == (0, 1, 3, 5)
    return b.build()


def test_contexts_follow_the_five_formation_rules():
    p = _toy_program()
    ctx = contexts(p)
    out = [Segment(t.output_seg, t.output_tokens) for t in p.turns]
    app = [list(t.append) for t in p.turns]
    assert ctx[0] == app[0]  # start
    assert ctx[1] == ctx[0] + [out[0]] + app[1]  # append
    assert ctx[2] == ctx[1] + [out[1]] + app[2]  # fork of turn 1
    assert ctx[3] == app[3]  # subagent: a new context
    assert ctx[4] == ctx[3] + [out[3]] + app[4]
    assert ctx[5] == ctx[1] + [out[1]] + app[5]  # root's next turn extends the root, not s
    assert ctx[6] == ctx[5][:1] + app[6]  # compact keeps the system prompt only
    assert p.turns[5].deps == (1, 4)
    check_program(p)


def test_ideal_cache_counts_shared_prefixes_and_outputs():
    ids = SegmentIds()
    a, b = _toy_program(ids), _toy_program(ids, "toy2")
    stats = request_stats([a, b])
    by = {(s.program_id, s.turn): s for s in stats}
    # first program: nothing cached at its first turn, then prev context + output
    assert by[("toy", 0)].cached_tokens == 0
    assert by[("toy", 1)].cached_tokens == 115  # 100 + 10 + output 5
    assert by[("toy", 2)].cached_tokens == 115 + 20 + 6  # fork reuses context + output
    assert by[("toy", 3)].cached_tokens == 100  # sub-agent shares only the system prompt
    assert by[("toy", 6)].cached_tokens == 100  # after compaction: the kept prefix
    assert by[("toy", 5)].joins == 1 and by[("toy", 3)].joins == 1
    assert by[("toy2", 0)].cached_tokens == 100  # shared system prompt hit across programs
    assert by[("toy2", 1)].cached_tokens == 115  # its own first prompt + output, nothing of toy
    total = sum(s.input_tokens for s in stats)
    assert ideal_hit_rate([a, b]) == pytest.approx(sum(s.cached_tokens for s in stats) / total)


def _trie_hit_tokens(programs: list[Program]) -> int:
    """Independent reference: a trie of segment ids, walked from the root."""
    root: dict[int, dict] = {}
    hits = 0
    for p in programs:
        for t, ctx in zip(p.turns, contexts(p), strict=True):
            node, matching = root, True
            full = list(ctx) + (
                [Segment(t.output_seg, t.output_tokens)] if t.output_tokens > 0 else []
            )
            for j, s in enumerate(full):
                if matching and s.seg_id in node and j < len(ctx):
                    hits += s.tokens
                else:
                    matching = False
                node = node.setdefault(s.seg_id, {})
    return hits


@pytest.mark.parametrize("spec", ["cc", "osworld", "putnam"])
def test_ideal_cache_matches_a_naive_prefix_set(spec):
    src = make_workload(spec, seed=5)
    progs = [src.next_program(0.0) for _ in range(6)]
    stats = request_stats(progs)
    assert sum(s.cached_tokens for s in stats) == _trie_hit_tokens(progs)


def test_check_program_rejects_broken_structure():
    ids = SegmentIds()
    good = _toy_program(ids)
    # an append turn that does not depend on its branch's previous turn
    turns = list(good.turns)
    turns[1] = Turn("root", "append", turns[1].append, 6, turns[1].output_seg, deps=(), gap_s=1.0)
    with pytest.raises(ValueError, match="previous turn"):
        check_program(Program("bad", "toy", tuple(turns)))
    # a branch that never finishes
    unfinished = Program("bad2", "toy", (Turn("root", "start", (SYS,), 3, ids()),))
    with pytest.raises(ValueError, match="never finish"):
        check_program(unfinished)
    # compact_keep beyond the previous context
    t0 = Turn("root", "start", (SYS,), 3, ids())
    t1 = Turn(
        "root",
        "compact",
        (Segment(ids(), 4),),
        3,
        ids(),
        deps=(0,),
        compact_keep=5,
        finishes_branch=True,
    )
    with pytest.raises(ValueError, match="compact_keep"):
        check_program(Program("bad3", "toy", (t0, t1)))
    # a fork whose parent_turn belongs to another branch
    bad_fork = list(good.turns)
    bad_fork[2] = Turn(
        "f",
        "fork",
        (Segment(ids(), 3),),
        4,
        ids(),
        deps=(1,),
        parent_branch="s",
        parent_turn=1,
        finishes_branch=True,
    )
    with pytest.raises(ValueError, match="parent"):
        check_program(Program("bad4", "toy", tuple(bad_fork)))


def test_check_disjoint_finds_id_collisions():
    a = _toy_program(SegmentIds())
    b = _toy_program(SegmentIds(), "toy2")  # a second allocator hands out the same ids
    with pytest.raises(ValueError, match="used by"):
        check_disjoint([a, b])
    ids = SegmentIds()
    check_disjoint([_toy_program(ids), _toy_program(ids, "toy2")])


def test_top_share():
    assert top_share([1.0] * 19 + [81.0], 0.05) == pytest.approx(0.81)
    assert top_share([], 0.05) == 0.0


def test_open_loop_arrivals_are_poisson_and_seeded():
    loop = OpenLoop(rate_per_s=0.5, max_active=10)
    t1 = list(loop.arrivals(seed=3, until_s=20_000))
    assert t1 == list(loop.arrivals(seed=3, until_s=20_000))
    assert t1 != list(loop.arrivals(seed=4, until_s=20_000))
    assert len(t1) == pytest.approx(10_000, rel=0.05)
    gaps = np.diff(t1)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    with pytest.raises(ConfigError, match="rate_per_s"):
        OpenLoop(rate_per_s=0)
    with pytest.raises(ConfigError, match="concurrency"):
        ClosedLoop(0)


def test_admission_queue_is_fifo_under_the_limit():
    src = make_workload("putnam")
    progs = [src.next_program(0.0) for _ in range(4)]
    q = AdmissionQueue(max_active=2)
    assert [p.program_id for _, p in q.arrive(0.0, progs[0])] == [progs[0].program_id]
    assert len(q.arrive(1.0, progs[1])) == 1
    assert q.arrive(2.0, progs[2]) == [] and q.arrive(3.0, progs[3]) == []
    assert q.num_waiting == 2
    admitted = q.finish()
    assert [(t, p.program_id) for t, p in admitted] == [(2.0, progs[2].program_id)]
    assert q.active == 2
