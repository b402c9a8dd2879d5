"""The stand-in's paged prefix cache: SGLang's block hashes, event coalescing, LRU eviction."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.engines.standin.prefix_cache import PrefixCache, page_hashes
from cluster.wire.kv_events import (
    SGLangAllBlocksCleared,
    SGLangBlockRemoved,
    SGLangBlockStored,
)


def _reference_hashes(tokens: list[int], page: int) -> list[int]:
    """SGLang's chain spelled out: sha256(prior digest || uint32 LE tokens), hex[:16] as int64."""
    out, prior = [], None
    for start in range(0, len(tokens) - page + 1, page):
        h = hashlib.sha256()
        if prior is not None:
            h.update(bytes.fromhex(prior))
        for t in tokens[start : start + page]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.hexdigest()
        v = int(prior[:16], 16)
        out.append(v - 2**64 if v >= 2**63 else v)
    return out


def test_hashes_match_sglangs_chain_and_skip_partial_pages() -> None:
    tokens = list(range(1000, 1070))
    assert page_hashes(tokens, 16) == _reference_hashes(tokens, 16)
    assert len(page_hashes(tokens, 16)) == 4  # 70 tokens: 4 full pages
    assert page_hashes(tokens[:32], 16) == page_hashes(tokens, 16)[:2]  # prefix property


def test_insert_coalesces_a_chain_and_match_counts_pages() -> None:
    cache = PrefixCache(page_size=4, capacity_pages=100)
    a = list(range(12))
    cache.insert(a, now=1.0)
    cache.insert([*a, 50, 51, 52, 53], now=2.0)
    # Like SGLang's recorder: a store continuing the queued store's chain extends it.
    (event,) = cache.take_events()
    assert event.block_hashes == page_hashes([*a, 50, 51, 52, 53], 4)
    assert event.parent_block_hash is None and event.block_size == 4 and event.medium == "GPU"
    assert event.token_ids == [*a, 50, 51, 52, 53]
    cache.insert([*a, 60, 61, 62, 63], now=2.5)  # a branch: parent is page 3 of `a`
    (branch,) = cache.take_events()
    assert branch.parent_block_hash == page_hashes(a, 4)[-1] and len(branch.block_hashes) == 1
    assert len(cache.match([*a, 50, 51, 52, 53, 9], now=3.0)) == 4
    assert cache.match([99] * 8, now=3.0) == []


def test_eviction_is_lru_over_unlocked_leaves_and_reset_clears() -> None:
    cache = PrefixCache(page_size=2, capacity_pages=100)
    old = cache.insert([1, 2, 3, 4], now=1.0)  # chain of 2 pages
    new = cache.insert([5, 6], now=2.0)
    cache.lock(new, +1)
    cache.take_events()
    assert cache.evict(1) == 1  # the old chain's leaf, not the locked newer page
    assert cache.take_events() == [SGLangBlockRemoved(block_hashes=[old[1]], medium="GPU")]
    assert cache.evict(10) == 1 and cache.num_pages == 1  # then its parent; `new` is locked
    assert cache.take_events() == [SGLangBlockRemoved(block_hashes=[old[0]], medium="GPU")]
    cache.check_invariants()
    cache.reset()
    assert cache.num_pages == 0 and cache.take_events() == [SGLangAllBlocksCleared()]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "evict", "lock"]),
            st.lists(st.integers(0, 3), min_size=0, max_size=12),
        ),
        max_size=40,
    )
)
def test_random_operations_keep_invariants_and_events_replay_the_state(ops) -> None:  # type: ignore[no-untyped-def]
    cache = PrefixCache(page_size=2, capacity_pages=10_000)
    live: set[int] = set()
    locked: list[list[int]] = []
    now = 0.0
    for op, toks in ops:
        now += 1.0
        if op == "insert":
            cache.insert(toks, now)
        elif op == "evict":
            cache.evict(len(toks))
        elif toks:
            hashes = cache.match(toks, now)
            cache.lock(hashes, +1)
            locked.append(hashes)
        cache.check_invariants()
        for e in cache.take_events():  # the directory a consumer rebuilds from events
            if isinstance(e, SGLangBlockStored):
                assert e.parent_block_hash is None or e.parent_block_hash in live
                live.update(e.block_hashes)
            elif isinstance(e, SGLangBlockRemoved):
                assert set(e.block_hashes) <= live
                live.difference_update(e.block_hashes)
    assert live == set(cache._pages)
    for hashes in locked:
        cache.lock(hashes, -1)
    cache.check_invariants()
