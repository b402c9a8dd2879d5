"""Chained block hashes, computed incrementally per branch (issue #3 item 7)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.hashing import ContextHasher, TokenPathCache, prefix_in, token_block_hashes
from cluster.workloads.program import Segment

segments = st.lists(
    st.builds(Segment, st.integers(1, 50), st.integers(1, 40)), min_size=1, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(segs=segments, cut=st.integers(0, 12), bt=st.sampled_from([1, 4, 16]))
def test_context_hasher_incremental_equals_from_scratch(segs, cut, bt):
    whole = ContextHasher(bt)
    whole.extend(segs)
    pieces = ContextHasher(bt)
    new = []
    for s in segs:
        new += pieces.extend([s])
    assert pieces.hashes == whole.hashes == new  # only newly completed blocks come back
    assert len(whole.hashes) == sum(s.tokens for s in segs) // bt
    # A compaction keeps leading segments: the same hashes as hashing them afresh.
    k = min(cut, len(segs))
    kept = whole.truncated(k)
    fresh = ContextHasher(bt)
    fresh.extend(segs[:k])
    assert kept.hashes == fresh.hashes and kept.tokens == fresh.tokens
    kept.extend([Segment(99, 7)])
    fresh.extend([Segment(99, 7)])
    assert kept.hashes == fresh.hashes


@settings(max_examples=200, deadline=None)
@given(
    base=st.lists(st.integers(0, 5), min_size=0, max_size=60),
    extra=st.lists(st.integers(0, 5), max_size=30),
    cut=st.integers(0, 60),
)
def test_token_path_cache_hashes_only_what_changed(base, extra, cut):
    bt = 4
    cache = TokenPathCache(bt)
    assert cache.path("b", base) == token_block_hashes(base, bt)
    before = cache.blocks_hashed
    appended = base + extra
    assert cache.path("b", appended) == token_block_hashes(appended, bt)
    # Appending hashes only the blocks the new tokens complete.
    assert cache.blocks_hashed - before == len(appended) // bt - len(base) // bt
    rewritten = [*appended[:cut], 7, 7, 7]  # a compaction rewrites the tail
    assert cache.path("b", rewritten) == token_block_hashes(rewritten, bt)
    cache.forget("b")
    assert len(cache) == 0


def test_chained_hashes_share_exactly_the_common_prefix():
    a = token_block_hashes(list(range(40)), 8)
    b = token_block_hashes(list(range(20)) + [99] * 20, 8)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert prefix_in(b, set(a)) == 2
    assert prefix_in(a, set(a)) == 5 and prefix_in([], set(a)) == 0
