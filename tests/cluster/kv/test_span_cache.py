"""SpanTierCache: the host tier per span, held to its block-granular reference.

A hypothesis test drives `SpanTierCache` and `RecencyTierCache` with the same random
sequences of stores, touches, count changes (with the directory's zero-drop notices),
evictions and removals, on chains that share prefixes and at times that repeat (ties in
T_b), and holds them to the same evictions (block, count, T_b, in order) and the same
cached blocks after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.eviction import BranchAwareEviction, LRUEviction
from cluster.kv.recency_cache import RecencyTierCache
from cluster.kv.span_cache import SpanTierCache
from cluster.kv.tier_cache import TierCache


class Counts:
    """Branch counts along paths, with the directory's zero-drop notification."""

    def __init__(self) -> None:
        self.c: dict[int, int] = {}
        self.caches: list[TierCache] = []

    def __call__(self, h: int) -> int:
        return self.c.get(h, 0)

    def add(self, path: list[int], delta: int, notify: bool = True) -> None:
        if any(self.c.get(h, 0) + delta < 0 for h in path):
            return  # only release what was counted (the test draws blindly)
        zeroed = []
        for h in path:
            self.c[h] = self.c.get(h, 0) + delta
            if self.c[h] == 0:
                zeroed.append(h)
        for cache in self.caches if notify else ():
            cache.on_counts_zeroed(zeroed)


# A small tree of chains: chain c forks from chain c // 2 at block `fork`, so paths share
# prefixes and siblings stored at one time tie in T_b at equal depths.
FORK = 3


def path_of(cid: int, n: int) -> list[int]:
    if cid == 0:
        return [1000 + i for i in range(n)]
    head = path_of(cid // 2, min(n, FORK))
    return head + [1000 * (cid + 1) + i for i in range(len(head), n)]


op = st.tuples(
    st.sampled_from(
        [
            *("insert", "insert", "touch", "touch", "count+", "count-"),
            *("evict", "remove", "clear"),
            "count- unnoticed",  # a drop to zero found only at eviction
        ]
    ),
    st.integers(0, 6),  # chain
    st.integers(1, 9),  # length
    st.integers(0, 3),  # start of the stored or released segment
    st.booleans(),  # advance time
)


def run_both(ops, capacity: int, branch: bool, compact: bool = False) -> None:
    counts = Counts()
    policy = BranchAwareEviction() if branch else LRUEviction()
    ref = RecencyTierCache(0, "host", capacity, policy, counts)
    span = SpanTierCache(0, "host", capacity, policy, counts)
    if compact:
        span.compact_slack = 0  # drop dead spans at every store
    counts.caches = [ref, span]
    t = 0.0
    for kind, cid, n, start, tick in ops:
        t += 1.0 if tick else 0.0
        path = path_of(cid, n)
        start = min(start, n - 1)
        if kind == "insert":
            counts.add(path, 1) if start % 2 else None  # placed (counted) or not
            assert span.insert(path[start:], 1, t, start) == ref.insert(path[start:], 1, t, start)
        elif kind == "touch":
            k = n  # the whole path, cached or not, or its cached prefix (as a prefill)
            if start % 2:
                k = 0
                while k < n and path[k] in ref:
                    k += 1
            ref.touch(path[:k], t)
            span.touch(path[:k], t)
        elif kind == "clear":
            assert sorted(span.clear()) == sorted(ref.clear())
        elif kind == "evict":
            assert span.evict(start + 1) == ref.evict(start + 1)
        elif kind == "remove":
            assert span.remove(path[-1]) == ref.remove(path[-1])
        else:
            counts.add(path[start:], 1 if kind == "count+" else -1, kind != "count- unnoticed")
        assert set(span.entries) == set(ref.entries)
        assert span.used_tokens == ref.used_tokens
        span.check_invariants()
    # Drain: the whole remaining order must agree.
    assert span.evict(capacity) == ref.evict(capacity)


@settings(max_examples=400, deadline=None)
@given(
    ops=st.lists(op, max_size=60),
    capacity=st.integers(3, 30),
    branch=st.booleans(),
    compact=st.booleans(),
)
def test_same_evictions_as_the_block_granular_cache(ops, capacity, branch, compact):
    run_both(ops, capacity, branch, compact)


def test_spans_are_kept_per_path_not_per_block():
    """A path stored and touched whole is one span, whatever its length."""
    c = SpanTierCache(0, "host", 10_000, LRUEviction())
    path = list(range(1, 2001))
    c.insert(path, 1, 1.0, 0)
    c.touch(path, 2.0)
    c.insert([*path, 5000], 1, 3.0, 0)
    live = [s for run in c.order.runs for s in run if s.lo < s.hi]
    assert len(live) <= 2  # the new leaf, then the touched path
    c.check_invariants()


def test_pins_are_refused_with_the_caches_that_have_them_named():
    c = SpanTierCache(0, "host", 4, BranchAwareEviction())
    with pytest.raises(TypeError, match="RecencyTierCache or RetentionCache"):
        c.pin([1])
