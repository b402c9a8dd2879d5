"""The torch engine's two-tier prefix cache on its own (paper 000 §4.2; SPEC §9).

A request keeps a full page private when another request cached the same block first; if
that other copy is evicted before the request's next page fills, the next page cannot be
cached (its parent has no device page) and stays private too — it must not fail the pass.
Eviction orders blocks by the policy's key with a unique tie-break (both seen failing a
live cluster's prefill engine under 32 cc agents).
"""

from __future__ import annotations

from cluster.engines.torch.prefix_cache import PrefixCache
from cluster.kv.hashing import token_block_hashes


def test_a_page_whose_parent_copy_was_evicted_stays_private() -> None:
    cache = PrefixCache(page_size=4, gpu_pages=8, host_pages=0)
    toks = list(range(1, 9))
    h0, h1 = token_block_hashes(toks, 4)
    # Request A caches block 0 and finishes.
    (pa,) = cache.lend(1, 0, now=0.0) or []
    a0 = cache.register(h0, None, toks[:4], pa, now=0.0)
    assert a0 is not None
    cache.release([a0], now=0.0)
    # Request B computed the same page privately: A's copy wins, B keeps its page.
    pb0, pb1 = cache.lend(2, 0, now=1.0) or []
    assert cache.register(h0, None, toks[:4], pb0, now=1.0) is None
    # A's unreferenced copy is evicted before B's second page fills.
    assert cache.evict("GPU", 1, now=2.0) == 1 and h0 not in cache.blocks
    assert cache.register(h1, h0, toks[4:], pb1, now=3.0) is None
    cache.give_back([pb0, pb1])
    cache.check_invariants()
    assert cache.available == 8 and not cache.blocks


def test_eviction_ties_never_compare_blocks() -> None:
    """A parent exposed during eviction may tie in order with a leaf queued at the start;
    the tie-break must still order them (it used to reuse a leaf's sequence number)."""
    cache = PrefixCache(page_size=4, gpu_pages=8, host_pages=0)
    x, a1, a2, b1 = (token_block_hashes(list(range(k, k + 8)), 4) for k in (1, 20, 20, 40))

    def cache_block(h: int, parent: int | None, keep: bool) -> None:
        (page,) = cache.lend(1, 0, now=5.0) or []
        b = cache.register(h, parent, [0, 0, 0, 0], page, now=5.0)
        assert b is not None
        if not keep:
            cache.release([b], now=5.0)

    cache_block(x[0], None, keep=True)  # referenced: not evictable, but it takes index 0
    cache_block(a1[0], None, keep=False)
    cache_block(a2[1], a1[0], keep=False)
    cache_block(b1[0], None, keep=False)
    assert cache.evict("GPU", 3, now=6.0) == 3
    assert list(cache.blocks) == [x[0]]
    cache.check_invariants()
