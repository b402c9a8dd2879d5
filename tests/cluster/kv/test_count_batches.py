"""Branch counts told a path at a time: the same changes, in the same order, as block by block.

Two directories receive the same stores and count updates: one reports every change of
R_{b,n} to a per-block listener (the reference), the other to a batch listener only (the
fast paths: +1 counted in C, -1 in one loop). The batches, flattened, must be the per-block
stream, the zero-count re-ranks identical and the count tables equal; paths may repeat a
block, where each occurrence sees the count after itself.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.kv.directory import KVDirectory

NODES = (0, 1, 2)
BLOCKS = list(range(201, 209))

path = st.lists(st.sampled_from(BLOCKS), min_size=0, max_size=10)
op = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(NODES), path),
    st.tuples(st.just("count"), st.sampled_from(NODES), path, st.sampled_from((1, -1, 2))),
)


def _pair() -> tuple[KVDirectory, KVDirectory, list, list, list, list]:
    ref, fast = KVDirectory(16), KVDirectory(16)
    per_block: list[tuple[int, int, int]] = []
    batched: list[tuple[int, int, int]] = []
    ref_zero: list[tuple[int, list[int]]] = []
    fast_zero: list[tuple[int, list[int]]] = []
    ref.count_listeners.append(lambda n, h, c: per_block.append((n, h, c)))
    fast.count_batch_listeners.append(
        lambda n, hs, cs: batched.extend((n, h, c) for h, c in zip(hs, cs, strict=True))
    )
    ref.zero_listeners.append(lambda n, hs: ref_zero.append((n, list(hs))))
    fast.zero_listeners.append(lambda n, hs: fast_zero.append((n, list(hs))))
    return ref, fast, per_block, batched, ref_zero, fast_zero


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_batches_are_the_per_block_stream(ops):
    ref, fast, per_block, batched, ref_zero, fast_zero = _pair()
    for o in ops:
        if o[0] == "store":
            _, n, hs = o
            for d in (ref, fast):
                d.store(n, sorted(set(hs)), 0, "host", 1.0)
            continue
        _, n, hs, delta = o
        if delta < 0:
            # release only what is counted (as BranchTable does): one occurrence per block
            have = dict(ref.node_counts(n))
            hs = [h for h in dict.fromkeys(hs) if have.get(h, 0) > 0]
        for d in (ref, fast):
            d.add_count(n, list(hs), delta, 1.0)
        assert batched == per_block
        assert fast_zero == ref_zero
        assert fast.all_counts() == ref.all_counts()


def test_a_repeated_block_sees_each_increment():
    _, fast, _, batched, _, _ = _pair()
    fast.add_count(0, [201, 202, 201, 201], 1, 0.0)
    assert batched == [(0, 201, 1), (0, 202, 1), (0, 201, 2), (0, 201, 3)]


def test_a_release_of_an_uncounted_block_is_refused_with_batches_on():
    _, fast, _, _, _, _ = _pair()
    fast.add_count(0, [201], 1, 0.0)
    with pytest.raises(AssertionError, match="not counted"):
        fast.add_count(0, [201, 202], -1, 0.0)
