"""RecencyTierCache: the heap-free exact order for the built-in eviction policies.

Checked two ways: against the lazily corrected heap `TierCache` on the simulator's usage
(prefix-closed chains, counts along paths, time moving forward), and against a brute-force
model of the documented order that sorts every candidate block, with pins, removals and
capacities smaller than a chain.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cluster.kv.eviction import BranchAwareEviction, LRUEviction
from cluster.kv.hashing import chain_path as _chain
from cluster.kv.recency_cache import RecencyTierCache
from cluster.kv.span_cache import SpanTierCache
from cluster.kv.tier_cache import TierCache
from cluster.sim.memory import tier_caches

CHAINS = 4


class Counts:
    """Branch counts along paths, with the directory's zero-drop notification."""

    def __init__(self) -> None:
        self.c: dict[int, int] = {}
        self.caches: list[TierCache] = []

    def __call__(self, h: int) -> int:
        return self.c.get(h, 0)

    def add(self, path: list[int], delta: int) -> None:
        zeroed = []
        for h in path:
            after = self.c.get(h, 0) + delta
            if after < 0:
                return  # only release what was counted (the test draws blindly)
        for h in path:
            self.c[h] = self.c.get(h, 0) + delta
            if self.c[h] == 0:
                zeroed.append(h)
        for cache in self.caches:
            cache.on_counts_zeroed(zeroed)


def ops_of(*kinds: str) -> st.SearchStrategy[tuple[str, int, int]]:
    return st.tuples(st.sampled_from(kinds), st.integers(0, CHAINS - 1), st.integers(1, 5))


op = ops_of("insert", "insert", "touch", "count+", "count-")


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=40), capacity=st.integers(5, 12), branch=st.booleans())
# The heap cache evicted a block of the very chain it was storing again (its leaf, older than
# a peer's block) and stored it back: it now touches the chain's cached blocks first.
@example(
    ops=[("insert", 0, 4), ("count-", 0, 1), ("insert", 1, 2), ("insert", 0, 4)],
    capacity=5,
    branch=True,
)
def test_evicts_exactly_like_the_heap_cache(ops, capacity, branch):
    counts = Counts()
    policy = BranchAwareEviction() if branch else LRUEviction()
    heap = TierCache(0, "host", capacity, policy, counts)
    runs = RecencyTierCache(0, "host", capacity, policy, counts)
    counts.caches = [heap, runs]
    for t, (kind, cid, n) in enumerate(ops, start=1):
        path = _chain(cid, n)
        if kind == "insert":
            # As in the simulator, a placement counts its path before the prefill stores
            # it. (Uncounted new blocks are where the two differ: the heap cache, evicting
            # block by block, may evict the chain's own zero-count blocks and break
            # prefix closure; see the model test for the batch semantics.)
            counts.add(path, 1)
            a = heap.insert(path, 1, float(t), 0)
            b = runs.insert(path, 1, float(t), 0)
            assert a == b
        elif kind == "touch":
            k = sum(1 for h in path if h in heap)  # touch the held prefix, as a prefill does
            heap.touch(path[:k], float(t))
            runs.touch(path[:k], float(t))
        else:
            counts.add(path, 1 if kind == "count+" else -1)
        assert set(heap.entries) == set(runs.entries)
        assert heap.used_tokens == runs.used_tokens
        runs.check_invariants()


class Model:
    """The documented order by brute force: sort every candidate, evict the smallest."""

    def __init__(self, capacity: int, counts: Counts, branch: bool) -> None:
        self.capacity, self.counts, self.branch = capacity, counts, branch
        self.e: dict[int, list[float]] = {}  # h -> [access, depth, pins]

    def key(self, h: int) -> tuple[float, ...]:
        access, depth, _ = self.e[h]
        group = 1.0 if self.branch and self.counts(h) > 0 else 0.0
        return (group, access, -depth)

    def insert(self, path: list[int], t: float) -> list[tuple[int, int, float]]:
        held = [h for h in path if h in self.e]
        for h in held:
            self.e[h][0] = max(self.e[h][0], t)
        new = [(h, i) for i, h in enumerate(path) if h not in self.e]
        out = []
        need = len(self.e) + len(new) - self.capacity
        if need > 0:
            cand = sorted((h for h in self.e if h not in held and self.e[h][2] == 0), key=self.key)
            for h in cand[:need]:
                out.append((h, self.counts(h), self.e.pop(h)[0]))
            new = new[: max(self.capacity - len(self.e), 0)]
        for h, depth in new:
            self.e[h] = [t, depth, 0]
        return out


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.one_of(op, ops_of("pin", "unpin", "remove")),
        max_size=80,
    ),
    capacity=st.integers(1, 12),
    branch=st.booleans(),
)
def test_matches_a_brute_force_model_with_pins_and_removals(ops, capacity, branch):
    counts = Counts()
    runs = RecencyTierCache(
        0, "host", capacity, BranchAwareEviction() if branch else LRUEviction(), counts
    )
    counts.caches = [runs]
    model = Model(capacity, counts, branch)
    for t, (kind, cid, n) in enumerate(ops, start=1):
        path = _chain(cid, n)
        if kind == "insert":
            got = runs.insert(path, 1, float(t), 0)
            want = model.insert(path, float(t))
            assert [(e.block_hash, e.branch_count, e.last_access) for e in got] == want
        elif kind == "touch":
            runs.touch(path, float(t))
            for h in path:
                if h in model.e:
                    model.e[h][0] = max(model.e[h][0], float(t))
        elif kind == "pin":
            runs.pin(path)
            for h in path:
                if h in model.e:
                    model.e[h][2] += 1
        elif kind == "unpin":
            runs.unpin(path)
            for h in path:
                if h in model.e and model.e[h][2] > 0:
                    model.e[h][2] -= 1
        elif kind == "remove":
            assert runs.remove(path[-1]) == (model.e.pop(path[-1], None) is not None)
        else:
            counts.add(path, 1 if kind == "count+" else -1)
        assert set(runs.entries) == set(model.e)
        runs.check_invariants()


def test_a_dead_branch_block_is_evicted_before_newer_zero_count_blocks():
    """A count dropping to zero re-ranks the block by its old T_b (the late heap)."""
    counts = Counts()
    c = RecencyTierCache(0, "host", 4, BranchAwareEviction(), counts)
    counts.caches = [c]
    old, mid, new = _chain(1, 1), _chain(2, 2), _chain(3, 1)
    counts.add(old, 1)
    c.insert(old, 1, 1.0, 0)
    c.insert(mid, 1, 2.0, 0)
    c.insert(_chain(4, 1), 1, 3.0, 0)
    counts.add(old, -1)  # the branch ended: its block keeps T_b = 1
    ev = c.insert(new, 1, 4.0, 0)
    assert [e.block_hash for e in ev] == old
    c.check_invariants()


class Custom:
    name = "custom"
    uses_counts = False

    def key(self, count: int, last_access: float) -> tuple[float, ...]:
        return (last_access,)


def test_other_policies_are_refused_with_the_allowed_ones_named():
    with pytest.raises(ValueError, match="'branch' and 'lru' policies only, got 'custom'"):
        RecencyTierCache(0, "host", 4, Custom())


def test_simulated_nodes_use_its_span_form_for_the_built_in_policies_and_the_heap_otherwise():
    def host(policy: object) -> TierCache:
        return tier_caches(0, 64, 256, policy, lambda h: 0)[1]  # type: ignore[arg-type]

    assert type(host(BranchAwareEviction())) is SpanTierCache
    assert type(host(LRUEviction())) is SpanTierCache
    assert type(host(Custom())) is TierCache
    assert type(host(Custom())) is TierCache


def test_forward_time_inserts_and_touches_only_append():
    """Without count drops every block enters its run in order: the late heap stays empty
    (what makes this cache cheaper than the lazily corrected heap)."""
    counts = Counts()
    c = RecencyTierCache(0, "host", 12, BranchAwareEviction(), counts)
    counts.caches = [c]
    t = 0.0
    for cid in range(CHAINS):
        for n in (2, 4, 5):  # a growing context: its prefill hits the cached prefix,
            t += 1.0  # then stores the whole path when it ends
            path = _chain(cid, n)
            counts.add(path, 1)
            c.touch(path[:2], t)
            c.insert(path, 1, t + 0.5, 0)
    c.check_invariants()
    assert len(c) == 12 and c._late == ([], [])
