"""KVDirectory's per-node tables against a brute-force model of (node, block) holdings.

Random stores, removals (per tier and whole), clears and count updates, on holdings that
need not be prefix-closed (retention tiers can leave a block without its parent): every
query answers as the model says, with the same binary searches over the same predicates.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.directory import GPU, HOST, KVDirectory, _held_prefix

NODES = (0, 1, 2)
PATH = list(range(101, 113))  # one chain of 12 blocks; ops use its segments
TIERS = ("gpu", "host")
BIT = {"gpu": GPU, "host": HOST}

seg = st.tuples(st.integers(0, 11), st.integers(1, 12)).map(lambda ab: PATH[ab[0] : ab[0] + ab[1]])
op = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(NODES), seg, st.sampled_from(TIERS)),
    st.tuples(st.just("remove"), st.sampled_from(NODES), seg, st.sampled_from((*TIERS, None))),
    st.tuples(st.just("clear"), st.sampled_from(NODES), st.sampled_from((*TIERS, None))),
    st.tuples(st.just("count"), st.sampled_from(NODES), seg, st.sampled_from((1, 2, -1))),
)


def _bisect(n: int, held) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if held(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40), st.lists(seg, min_size=1, max_size=4))
def test_directory_answers_as_the_block_model(ops, paths):
    d = KVDirectory(16)
    zeroed: list[tuple[int, list[int]]] = []
    d.zero_listeners.append(lambda n, hs: zeroed.append((n, list(hs))))
    tiers: dict[tuple[int, int], int] = {}
    counts: dict[tuple[int, int], int] = {}
    for o in ops:
        if o[0] == "store":
            _, n, hs, tier = o
            d.store(n, hs, 0, tier, 1.0)
            for h in hs:
                tiers[(n, h)] = tiers.get((n, h), 0) | BIT[tier]
        elif o[0] in ("remove", "clear"):
            n, tier = o[1], o[-1]
            if o[0] == "remove":
                hs = o[2]
                for h in hs:
                    d.remove(n, h, tier)
            else:
                hs = [h for (m, h) in tiers if m == n]
                d.clear_node(n, tier)
            for h in hs:
                if (n, h) in tiers:
                    bits = tiers[(n, h)] & ~(BIT[tier] if tier else GPU | HOST)
                    if bits:
                        tiers[(n, h)] = bits
                    else:
                        del tiers[(n, h)]
        else:
            _, n, hs, delta = o
            if delta < 0 and any(counts.get((n, h), 0) < 1 for h in hs):
                continue  # a release of what was never counted is refused (tested below)
            zeroed.clear()
            d.add_count(n, hs, delta, 1.0)
            want_zero = []
            for h in hs:
                c = counts.get((n, h), 0) + delta
                if c:
                    counts[(n, h)] = c
                else:
                    del counts[(n, h)]
                    if (n, h) in tiers:
                        want_zero.append(h)
            assert zeroed == ([(n, want_zero)] if want_zero else [])
        d.check_invariants()
    for n in NODES:
        assert d.node_holdings(n) == {h: b for (m, h), b in tiers.items() if m == n}
        assert d.node_counts(n) == {h: c for (m, h), c in counts.items() if m == n}
        assert d.node_blocks(n) == sum(1 for m, _ in tiers if m == n)
        for h in PATH:
            assert d.counts_of(n)[h] == d.count(n, h) == counts.get((n, h), 0)
            for tier in (*TIERS, None):
                mask = BIT[tier] if tier else GPU | HOST
                assert d.holds(n, h, tier) == bool(tiers.get((n, h), 0) & mask)
    for h in PATH:
        assert d.holders_of(h) == {m: b for (m, g), b in tiers.items() if g == h}
    blocks = {h for _, h in tiers} | {h for _, h in counts}
    assert d.stats()["blocks"] == len(blocks)
    assert d.stats()["holdings"] == len(tiers.keys() | counts.keys())
    assert d.stats()["counted_holdings"] == len(counts)
    for p in paths:
        _check_path(d, tiers, p)


def _check_path(d: KVDirectory, tiers: dict[tuple[int, int], int], p: list[int]) -> None:
    per_node = {n: _bisect(len(p), lambda i, n=n: (n, p[i]) in tiers) for n in NODES}
    assert d.prefix_lengths(p, NODES) == per_node
    anywhere = {h for _, h in tiers}
    m = d.longest_prefix(p, NODES)
    assert m.per_node == per_node
    assert m.cluster == _held_prefix(len(p), lambda i: p[i] in anywhere)
    for n in NODES:
        gpu = _held_prefix(per_node[n], lambda i, n=n: bool(tiers.get((n, p[i]), 0) & GPU))
        assert m.gpu_per_node[n] == gpu


def test_bad_releases_are_refused():
    d = KVDirectory(16)
    d.add_count(0, [1, 2], 1, 0.0)
    with pytest.raises(AssertionError, match="block 3 not counted on node 0"):
        d.add_count(0, [1, 3], -1, 0.0)
    with pytest.raises(AssertionError, match="block 2 not counted on node 1"):
        d.add_count(1, [2], -1, 0.0)


def test_a_block_repeated_in_one_store_is_one_holding():
    d = KVDirectory(16)
    d.store(0, [5, 6, 5], 0, "host", 0.0)
    d.store(1, [5], 0, "gpu", 0.0)
    d.check_invariants()  # holder bitmasks exact
    d.remove(0, 5, None)
    assert d.holders_of(5) == {1: GPU} and d.longest_prefix([5], [0, 1]).cluster == 1
    d.remove(1, 5, "gpu")
    assert d.holders_of(5) == {} and d.longest_prefix([5], [0, 1]).cluster == 0
    d.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 30), st.sampled_from(TIERS)),
        max_size=150,
    ),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=20),
    st.data(),
)
def test_prefixes_over_many_sparse_node_ids(stores, candidates, data):
    """Holder bitmasks over more nodes than a machine word, with sparse node ids: each
    candidate's prefix (held, never held, dropped again) equals its own binary search."""
    path = list(range(1, 31))
    d = KVDirectory(16)
    for node, k, tier in stores:
        d.store(node, path[:k], 0, tier, 0.0)
    dropped = data.draw(st.lists(st.sampled_from([n for n, _, _ in stores] or [0]), max_size=5))
    for node in dropped:
        d.clear_node(node, data.draw(st.sampled_from((*TIERS, None))))
    d.check_invariants()
    got = d.prefix_lengths(path, candidates)
    assert got == {n: d._prefix_len(path, n, GPU | HOST) for n in candidates}
    assert list(got) == list(dict.fromkeys(candidates))
    gpu = d.prefix_lengths(path, candidates, GPU)
    assert gpu == {n: d._prefix_len(path, n, GPU) for n in candidates}
