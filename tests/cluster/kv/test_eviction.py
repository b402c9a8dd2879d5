"""Tier caches: the heap-ordered cache and the exact-LRU cache agree on LRU order."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.eviction import BranchAwareEviction, LRUEviction
from cluster.kv.hashing import chain_path as _chain
from cluster.kv.tier_cache import LRUTierCache, TierCache

# Operations on chains of blocks: ("insert"|"touch", chain id, length).
ops = st.lists(
    st.tuples(st.sampled_from(["insert", "touch"]), st.integers(0, 5), st.integers(1, 4)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.integers(4, 24))
def test_exact_lru_cache_evicts_like_the_heap_lru(ops, capacity):
    heap = TierCache(0, "gpu", capacity, LRUEviction())
    lru = LRUTierCache(0, "gpu", capacity)
    for t, (kind, cid, n) in enumerate(ops, start=1):
        path = _chain(cid, n)
        if kind == "insert":
            a = heap.insert(path, 1, float(t), 0)
            b = lru.insert(path, 1, float(t), 0)
            assert [e.block_hash for e in a] == [e.block_hash for e in b]
        else:
            heap.touch(path, float(t))
            lru.touch(path, float(t))
        assert set(heap.entries) == set(lru.entries)
        lru.check_invariants()
        # Holdings stay prefix-closed: a leaf goes before its parent.
        for cid2 in range(6):
            p = _chain(cid2, 4)
            held = [h in lru.entries for h in p]
            assert held == sorted(held, reverse=True)


def test_branch_aware_evicts_zero_count_first_then_lru():
    counts = {}
    c = TierCache(0, "host", 4, BranchAwareEviction(), lambda h: counts.get(h, 0))
    a, b = _chain(1, 2), _chain(2, 2)
    c.insert(a, 1, 1.0, 0)
    c.insert(b, 1, 2.0, 0)
    counts.update({h: 1 for h in a})  # the older chain is referenced
    ev = c.insert(_chain(3, 2), 1, 3.0, 0)
    assert [e.block_hash for e in ev] == [
        b[1],
        b[0],
    ]  # the newer, zero-count chain goes, leaf first
    assert all(e.branch_count == 0 for e in ev)


def test_a_chain_longer_than_the_cache_keeps_its_leading_blocks():
    lru = LRUTierCache(0, "gpu", 4)
    p = _chain(7, 6)
    lru.insert(p, 1, 1.0, 0)
    assert list(h in lru.entries for h in p) == [True] * 4 + [False] * 2


def test_lru_pins_keep_blocks_and_one_block_size_per_cache():
    lru = LRUTierCache(0, "gpu", 4)
    a, b = _chain(1, 2), _chain(2, 2)
    lru.insert(a, 1, 1.0, 0)
    lru.insert(b, 1, 2.0, 0)
    lru.pin(a)
    ev = lru.insert(_chain(3, 2), 1, 3.0, 0)  # the pinned, older chain stays
    assert [e.block_hash for e in ev] == [b[1], b[0]] and all(h in lru.entries for h in a)
    assert [e.last_access for e in ev] == [2.0, 2.0]
    lru.check_invariants()
    lru.unpin(a)
    ev = lru.insert(_chain(4, 1), 1, 4.0, 0)
    assert [e.block_hash for e in ev] == [a[1]]  # unpinned: least recent goes first
    assert lru.remove(a[0]) and not lru.remove(a[0]) and lru.used_tokens == 3
    lru.check_invariants()
    with pytest.raises(ValueError, match="blocks of 2 tokens in a cache of 1-token blocks"):
        lru.insert(_chain(5, 1), 2, 5.0, 0)
