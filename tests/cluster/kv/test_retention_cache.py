"""RetentionCache: reclamation by (1[t < d], v), lazy re-rank at expiry, shared protection,
discard, and the unified pool's pins and reservations (paper 003 §3.4, Eq. 5)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.retention_cache import RetentionCache

BT = 16


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _cache(blocks: int, counts: dict[int, int] | None = None) -> tuple[RetentionCache, Clock]:
    clock = Clock()
    counts = counts or {}
    return RetentionCache(0, "gpu", blocks * BT, "test", clock, lambda h: counts.get(h, 0)), clock


def _chain(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_expired_entries_go_first_then_lower_values_then_deeper_blocks():
    c, clock = _cache(6)
    a, b, x = _chain(100, 2), _chain(200, 2), _chain(300, 2)
    for path in (a, b, x):
        c.insert(path, BT, clock.t, 0)
        clock.t += 1.0
    c.protect(a, owner=1, until=10.0, value=5.0)  # protected, high value
    c.protect(b, owner=2, until=10.0, value=1.0)  # protected, low value
    # x: never decided -> unprotected, value = last access; it goes first, deeper block first.
    assert [e.block_hash for e in c.evict(BT)] == [301]
    assert [e.block_hash for e in c.evict(BT)] == [300]
    # All remaining are protected: protection is a preference, the lower value goes.
    assert [e.block_hash for e in c.evict(2 * BT)] == [201, 200]


def test_protection_expiry_reranks_without_an_event():
    c, clock = _cache(4)
    a, b = _chain(100, 2), _chain(200, 2)
    c.insert(a, BT, 0.0, 0)
    c.insert(b, BT, 5.0, 0)
    c.protect(a, owner=1, until=3.0, value=None)  # protected until t = 3
    clock.t = 1.0
    assert [e.block_hash for e in c.evict(BT)] == [201]  # b is unprotected
    c.insert([201], BT, 1.0, 1)
    clock.t = 4.0  # a's protection lapsed; its last access (0) is older than b's (5)
    assert [e.block_hash for e in c.evict(2 * BT)] == [101, 100]


def test_shared_blocks_keep_the_strongest_protection():
    c, clock = _cache(8)
    shared = _chain(1, 2)
    c.insert([*shared, 10, 11], BT, 0.0, 0)
    c.insert([*shared, 20], BT, 0.0, 0)
    c.protect([*shared, 10, 11], owner=1, until=100.0, value=None)
    c.protect([*shared, 20], owner=2, until=5.0, value=None)  # weaker: keeps owner 1 on shared
    assert c.meta[1][2] == 1 and c.meta[20][2] == 2
    c.release([*shared, 20], owner=2)  # releases only what owner 2 holds
    assert 1 in c.meta and 20 not in c.meta
    clock.t = 1.0
    assert [e.block_hash for e in c.evict(BT)] == [20]


def test_discard_stops_at_pinned_shared_or_foreign_protected_blocks():
    counts = {1: 2}
    c, _clock = _cache(8, counts)
    c.insert([1, 2, 3, 4], BT, 0.0, 0)
    c.protect([3], owner=9, until=50.0, value=None)
    got = c.discard([1, 2, 3, 4], owner=5)
    assert [e.block_hash for e in got] == [4]  # 3 is protected by program 9
    c.release([3], owner=9)
    pinned = c.pin_present([2])
    assert [e.block_hash for e in c.discard([1, 2, 3], owner=5)] == [3]  # 2 is in use
    c.unpin(pinned)
    assert c.discard([1, 2], owner=5)[0].block_hash == 2  # 1 is a shared prefix (count 2)
    assert list(c.entries) == [1]
    c.check_invariants()


def test_reservations_share_the_pool_with_cached_blocks():
    c, _clock = _cache(10)
    c.insert(_chain(100, 6), BT, 0.0, 0)
    pinned = c.pin_present(_chain(100, 2))
    assert c.reservable_tokens == 8 * BT
    assert c.reserve(9 * BT) is None and c.used_tokens == 6 * BT  # does not fit: no change
    evicted = c.reserve(6 * BT)
    assert [e.block_hash for e in evicted] == [105, 104]  # unpinned, deepest first
    assert c.used_tokens + c.reserved_tokens == 10 * BT
    assert c.utilization == (2 + 6) / 10  # pinned blocks and reservation, not the cache
    # A block insert now has to reclaim (only unpinned blocks can go).
    c.insert([200], BT, 1.0, 0)
    assert c.used_tokens + c.reserved_tokens <= 10 * BT
    c.unreserve(6 * BT)
    c.unpin(pinned)
    assert c.pinned_tokens == 0 and c.reservable_tokens == 10 * BT
    c.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "protect", "release", "discard", "pin", "reserve", "tick"]),
            st.integers(0, 5),
            st.integers(1, 4),
            st.floats(0, 20),
        ),
        max_size=60,
    )
)
def test_random_operations_keep_capacity_pins_and_metadata_consistent(ops):
    c, clock = _cache(12)
    pins: list[list[int]] = []
    reserved = 0
    for op, branch, n, x in ops:
        path = [branch * 100 + i for i in range(n)]
        if op == "insert":
            c.insert(path, BT, clock.t, 0)
        elif op == "protect":
            c.protect(path, owner=branch, until=clock.t + x, value=None if n % 2 else x)
        elif op == "release":
            c.release(path, owner=branch)
        elif op == "discard":
            c.discard(path, owner=branch)
        elif op == "pin":
            pins.append(c.pin_present(path))
        elif op == "reserve":
            if c.reserve(n * BT) is not None:
                reserved += n * BT
        else:
            clock.t += x
        c.check_invariants()
        assert c.used_tokens + c.reserved_tokens <= c.pool_tokens
        assert c.reserved_tokens == reserved
        assert all(math.isfinite(m[0]) or m[0] == math.inf for m in c.meta.values())
    for p in pins:
        c.unpin(p)
    c.unreserve(reserved)
    assert c.pinned_tokens == 0
    c.evict(c.pool_tokens)
    assert c.used_tokens == 0  # nothing stays stuck outside the heap
