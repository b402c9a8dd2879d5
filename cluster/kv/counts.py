"""One node's branch-count table R_{b,n} and its updates (paper 000 §4.3, Alg. E.1/E.2).

`KVDirectory.add_count` applies a path's +1 or -1 here and tells its listeners: telemetry's
`branch_counts` rows are one batch per path (the blocks and their new counts in path
order), the same rows, in the same order, as one call per block gave. Blocks whose count
fell to zero are returned for the branch-aware caches' re-rank.
"""

from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable
from itertools import repeat

from cluster.core import BlockHash

CountListener = Callable[[int, BlockHash, int], None]  # (node, block, new count)


class Counts(dict[BlockHash, int]):
    """One node's branch counts R_{b,n} > 0; an absent block counts 0 (`counts[h]`)."""

    __slots__ = ()

    def __missing__(self, h: BlockHash) -> int:
        return 0


def increment(counts: Counts, blocks: list[BlockHash]) -> list[int]:
    """+1 on each block, in C; returns each block's count after its own increment."""
    befores = list(map(counts.get, blocks, repeat(0, len(blocks))))
    _count_elements(counts, blocks)
    afters = list(map(counts.__getitem__, blocks))
    if sum(afters) - sum(befores) == len(blocks):
        return afters
    # A block twice in the path: each occurrence sees the count after itself.
    seen: dict[BlockHash, int] = {}
    afters = []
    for h, b in zip(blocks, befores, strict=True):
        seen[h] = v = seen.get(h, b) + 1
        afters.append(v)
    return afters


def release(
    node: int, counts: Counts, hashes: Iterable[BlockHash], logged: bool
) -> tuple[list[BlockHash], list[int], list[BlockHash]]:
    """-1 on each block: (the blocks, their counts after, when `logged`; the blocks whose
    count reached zero)."""
    get = counts.get
    zero: list[BlockHash] = []
    if not logged:
        for h in hashes:
            c = get(h, 0)
            if c > 1:
                counts[h] = c - 1
            elif c == 1:
                del counts[h]
                zero.append(h)
            else:
                raise AssertionError(f"count release of block {h} not counted on node {node}")
        return [], [], zero
    blocks = hashes if isinstance(hashes, list) else list(hashes)
    afters: list[int] = []
    put = afters.append
    for h in blocks:
        c = get(h, 0)
        if c > 1:
            counts[h] = c - 1
            put(c - 1)
        elif c == 1:
            del counts[h]
            zero.append(h)
            put(0)
        else:
            raise AssertionError(f"count release of block {h} not counted on node {node}")
    return blocks, afters, zero


def add_each(
    node: int,
    counts: Counts,
    hashes: Iterable[BlockHash],
    delta: int,
    listeners: list[CountListener],
) -> tuple[list[BlockHash], list[int], list[BlockHash]]:
    """`delta` on each block, one at a time, calling the per-block listeners before each
    write: (the blocks, their counts after, the blocks whose count reached zero)."""
    blocks: list[BlockHash] = []
    afters: list[int] = []
    zero: list[BlockHash] = []
    get = counts.get
    for h in hashes:
        before = get(h)
        if before is None:
            if delta < 0:
                raise AssertionError(f"count release of block {h} not counted on node {node}")
            before = 0
        after = before + delta
        if after < 0:
            raise AssertionError(f"negative count for block {h} on node {node}")
        for listener in listeners:
            listener(node, h, after)
        blocks.append(h)
        afters.append(after)
        if after:
            counts[h] = after
        elif before:
            del counts[h]
            zero.append(h)
    return blocks, afters, zero
