"""Generated programs are pinned: the generators' RNG draw order and context rules stay fixed.

Every synthetic workload (and every golden simulator summary built on one) depends on the exact
sequence of random draws each generator makes: which `rng.random()` / `rng.standard_normal()`
call comes when, and what is done with it. Speed work on the generators (cc, putnam, osworld,
shift; `ProgramBuilder`, `TurnTable`, the samplers in tools.py) must not change a single turn,
so these digests were computed with the implementation before that work (commit 7ae296b) and
must not change; a change here means every generated workload changed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.workloads import make_workload
from cluster.workloads.analysis import contexts
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Segment, SegmentIds
from cluster.workloads.tools import Categorical

# (workload, seed, params, programs) -> digest of every field of every turn, the program ids
# and the segment-id allocator's state after them.
CC_BUSY = (("compact_threshold_tokens", 20_000), ("burst_prob", 0.2), ("fork_prob", 0.1))
OSWORLD_BUSY = (("delegate_prob", 0.3), ("keep_images", 3), ("image_removal_chunk", 2))
PINNED = {
    ("cc", 0, (), 4): "9d0f4ddb39a71df2",
    ("cc", 5, CC_BUSY, 4): "2169cf9dda0212bc",
    ("putnam", 0, (), 25): "7d2153b07840a996",
    ("putnam", 5, (("max_context_tokens", 20_000),), 25): "4be178d84327a905",
    ("osworld", 0, (), 8): "c961358c3d72ee9f",
    ("osworld", 5, OSWORLD_BUSY, 8): "e3fa891899e217c8",
    ("shift", 0, (("period_s", 100.0),), 24): "5d39f6d1edc65f23",
}


def _digest(name: str, seed: int, params: tuple[tuple[str, Any], ...], n: int) -> str:
    src = make_workload(name, seed=seed, **dict(params))
    h = hashlib.sha256()
    for i in range(n):
        p = src.next_program(i * 300.0 / n)  # shift: through its three periods
        h.update(repr((p.program_id, p.workload, p.arrival_s, len(p.turns))).encode())
        for t in p.turns:
            h.update(repr(t).encode())
    h.update(repr(src.ids()).encode())  # type: ignore[attr-defined]
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(PINNED, key=str), ids=lambda c: f"{c[0]}-{c[1]}")
def test_generated_programs_are_pinned(case: tuple) -> None:
    assert _digest(*case) == PINNED[case]


@pytest.mark.parametrize(
    "weights", [(0.25, 0.30, 0.25, 0.12, 0.08), (0.8, 0.2), (1.0, 0.0, 3.0), (1.0,), (0.1,) * 7]
)
def test_categorical_draws_what_numpy_choice_draws(weights: tuple[float, ...]) -> None:
    """Same index from the same single draw, and the same generator state after it."""
    cat = Categorical(weights)
    p = np.asarray(weights, dtype=float) / sum(weights)
    for seed in range(1500):
        a, b = np.random.default_rng([seed, 9]), np.random.default_rng([seed, 9])
        for _ in range(3):
            assert cat.draw(a) == b.choice(len(p), p=p)
        assert a.random() == b.random()


def test_categorical_rejects_weights_numpy_would_reject() -> None:
    """numpy's choice raises at every draw; a Categorical at construction."""
    for bad in ((), (1.0, -1.0), (float("nan"), 1.0), (0.0, 0.0)):
        with pytest.raises(ConfigError, match="categorical weights"):
            Categorical(bad)


def _random_program(seed: int) -> None:
    """Random builder calls (forks of old turns, sub-agents, compactions, empty outputs);
    the builder's contexts and `next_tokens` must match the reference `contexts()`."""
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(f"r{seed}", "toy", SegmentIds())
    shared = Segment(3, 50)

    def segs(k: int) -> list[Segment]:
        return [b.seg(int(rng.integers(1, 20))) for _ in range(k)]

    b.start("root", [shared, *segs(1)], int(rng.integers(0, 5)))
    open_, expect = ["root"], {}
    for n in range(int(rng.integers(5, 60))):
        op = rng.random()
        out = int(rng.integers(0, 5))
        branch = open_[int(rng.integers(len(open_)))]
        if op < 0.45:
            app = segs(int(rng.integers(0, 3)))
            want = b.next_tokens(branch, sum(s.tokens for s in app))
            expect[b.step(branch, app, out, gap_s=0.0, tool="t")] = want
        elif op < 0.6:
            t = int(rng.integers(b.num_turns))
            b.fork(f"f{n}", t, segs(1), out, gap_s=0.0)
            open_.append(f"f{n}")
        elif op < 0.72:
            b.subagent(f"s{n}", int(rng.integers(b.num_turns)), [shared, *segs(1)], out, gap_s=0.0)
            open_.append(f"s{n}")
        elif op < 0.85:
            keep = int(rng.integers(b.context_len(b.last_turn(branch)) + 1))
            b.compact(branch, keep, segs(1), out, gap_s=0.0, tool="c")
        elif branch != "root":
            b.finish(branch)
            open_.remove(branch)
    built = [b.context(i) for i in range(b.num_turns)]
    lens = [b.context_len(i) for i in range(b.num_turns)]
    ext = {br: b.extended(br) for br in open_}
    for br in open_:
        b.finish(br)
    p = b.build()
    ref = contexts(p)
    assert [list(c) for c in built] == ref and lens == [len(c) for c in ref]
    for i, tokens in expect.items():
        assert sum(s.tokens for s in ref[i]) == tokens
    for br, e in ext.items():
        t = max(i for i, turn in enumerate(p.turns) if turn.branch_id == br)
        out = p.turns[t].output_tokens
        assert list(e) == ref[t] + ([Segment(p.turns[t].output_seg, out)] if out else [])


def test_builder_contexts_match_the_reference_rules() -> None:
    for seed in range(150):
        _random_program(seed)


def test_builder_rejects_bad_turns_with_the_errors_turns_and_programs_give() -> None:
    b = ProgramBuilder("p", "toy", SegmentIds())
    b.start("root", [Segment(3, 50)], 4)
    cases = [
        (lambda: b.step("x", [], 1, gap_s=0.0, tool=None), "branch 'x' has no turns yet"),
        (lambda: b.step("root", [], -1, gap_s=0.0, tool=None), "output_tokens must be >= 0"),
        (lambda: b.step("root", [], 1, gap_s=-1.0, tool=None), "gap_s must be >= 0"),
        (
            lambda: b.step("root", [], 1, gap_s=0.0, tool=None, extra_deps=[5]),
            r"program p turn 1: deps \(0, 5\) must precede it",
        ),
        (lambda: b.fork("f", 3, [], 1, gap_s=0.0), r"turn 1: deps \(3,\) must precede it"),
        (lambda: b.subagent("s", -1, [], 1, gap_s=0.0), r"deps \(-1,\) must precede it"),
        (lambda: b.subagent("s", 0, [], 1, gap_s=0.0), "turn 1 has an empty context"),
        (lambda: b.compact("root", 2, [], 1, gap_s=0.0, tool=None), r"keep=2 outside .*\(0..1\)"),
        (lambda: b.start("root", [Segment(4, 1)], 1), "start must be the program's first turn"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert b.num_turns == 1 and b.next_tokens("root") == 54  # nothing half-added
    b.finish("root")
    with pytest.raises(ValueError, match="branch 'root' already finished"):
        b.step("root", [], 1, gap_s=0.0, tool=None)
    assert b.build().turns == (b.turns[0],) and b.turns[0].finishes_branch
