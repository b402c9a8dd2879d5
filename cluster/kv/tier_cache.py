"""A capacity-bounded tier cache of one node (paper 000 §4.1, §5.3): `TierCache` and `LRUTierCache`.

`TierCache` is one node's L1 (GPU) or L2 (host) with a token capacity. It keeps a lazily
invalidated heap of keys of its `EvictionPolicy`; count changes re-key a block when its
group flips. Every eviction reports the block's branch count and last access (the
`evictions` table). The simulator's GPU tier uses `LRUTierCache` (exact LRU in an
OrderedDict) and its host tier `span_cache.SpanTierCache` (the built-in policies' exact
order kept per span of blocks; `recency_cache.RecencyTierCache` keeps it per block and is
its reference).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable

from cluster.core import BlockHash, Tier
from cluster.kv.eviction import Evicted, EvictionPolicy, LRUEviction


class CacheEntry:
    """A cached block. `stamp` names its live heap item; 0 means it has none (pinned)."""

    __slots__ = ("access", "depth", "pins", "stamp", "tokens")

    def __init__(self, tokens: int, access: float, depth: int) -> None:
        self.tokens = tokens
        self.access = access
        self.depth = depth
        self.pins = 0
        self.stamp = 0


class TierCache:
    """One tier of one node: blocks, token capacity, eviction order (see module docstring)."""

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        policy: EvictionPolicy,
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be > 0, got {capacity_tokens}")
        self.node = node
        self.tier = tier
        self.capacity_tokens = capacity_tokens
        self.policy = policy
        self.count_of = count_of or (lambda h: 0)
        self.entries: dict[BlockHash, CacheEntry] = {}
        self.used_tokens = 0
        self._heap: list[tuple[object, ...]] = []
        self._stamp = 0
        self._zeroed: list[BlockHash] = []  # blocks whose count fell to 0, not yet re-ranked

    def __contains__(self, h: object) -> bool:
        return h in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    def _key(self, h: BlockHash, e: CacheEntry, count: int | None = None) -> tuple[object, ...]:
        if count is None:
            count = self.count_of(h) if self.policy.uses_counts else 0
        return (*self.policy.key(count, e.access), -e.depth)

    def _push(self, h: BlockHash, e: CacheEntry, count: int | None = None) -> None:
        self._stamp += 1
        e.stamp = self._stamp
        heapq.heappush(self._heap, (*self._key(h, e, count), self._stamp, h))
        if len(self._heap) > 4 * len(self.entries) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        heap = [(*self._key(h, e), e.stamp, h) for h, e in self.entries.items() if e.stamp != 0]
        heapq.heapify(heap)
        self._heap = heap

    def insert(
        self, hashes: Iterable[BlockHash], tokens: int, t: float, first_depth: int
    ) -> list[Evicted]:
        """Insert a chain of blocks (depths first_depth, first_depth+1, ...), evicting as needed.

        Blocks already present are touched first, so room for the new ones is never made by
        evicting the chain's own blocks. Returns what was evicted to make room; blocks that
        cannot fit (everything else pinned) are not inserted.
        """
        evicted: list[Evicted] = []
        depth = first_depth
        entries = self.entries
        chain = list(hashes)
        for h in chain:
            e = entries.get(h)
            if e is not None and t > e.access:
                e.access = t  # keys only grow: the heap corrects them lazily at eviction
        for h in chain:
            if h not in entries:
                if self.used_tokens + tokens > self.capacity_tokens:
                    evicted.extend(self.evict(self.used_tokens + tokens - self.capacity_tokens))
                    if self.used_tokens + tokens > self.capacity_tokens:
                        break  # everything left is pinned
                e = entries[h] = CacheEntry(tokens, t, depth)
                self.used_tokens += tokens
                self._push(h, e)
            depth += 1
        return evicted

    def touch(self, hashes: Iterable[BlockHash], t: float) -> None:
        """Update last access. Keys only grow here, so the heap is corrected lazily at eviction."""
        entries = self.entries
        for h in hashes:
            e = entries.get(h)
            if e is not None and t > e.access:
                e.access = t

    def on_count_change(self, h: BlockHash, count: int) -> None:
        """A block's count changed. Dropping to zero lowers its key (decrease-key): the block
        is re-ranked before the next eviction; rising keys are corrected lazily at eviction."""
        if count == 0 and self.policy.uses_counts:
            self._zeroed.append(h)

    def on_counts_zeroed(self, hashes: list[BlockHash]) -> None:
        """Batch form of `on_count_change(h, 0)`."""
        if self.policy.uses_counts:
            self._zeroed.extend(hashes)

    def _rerank_zeroed(self) -> None:
        zeroed, self._zeroed = self._zeroed, []
        entries = self.entries
        count_of = self.count_of
        for h in zeroed:
            e = entries.get(h)
            if e is not None and e.stamp != 0 and count_of(h) == 0:
                self._push(h, e, 0)

    def pin(self, hashes: Iterable[BlockHash]) -> None:
        for h in hashes:
            e = self.entries.get(h)
            if e is not None:
                e.pins += 1

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        for h in hashes:
            e = self.entries.get(h)
            if e is not None and e.pins > 0:
                e.pins -= 1
                if e.pins == 0 and e.stamp == 0:
                    self._push(h, e)  # back into the eviction order

    def remove(self, h: BlockHash) -> bool:
        e = self.entries.pop(h, None)
        if e is None:
            return False
        self.used_tokens -= e.tokens
        return True

    def clear(self) -> list[BlockHash]:
        gone = list(self.entries)
        self.entries.clear()
        self._heap.clear()
        self._zeroed.clear()
        self.used_tokens = 0
        return gone

    def evict(self, need_tokens: int) -> list[Evicted]:
        """Free at least `need_tokens` tokens in policy order, skipping pinned blocks.

        A popped heap item whose key has grown since it was pushed (a touch, or a count that
        became positive) is re-pushed with its current key instead of being evicted.
        """
        if self._zeroed:
            self._rerank_zeroed()
        out: list[Evicted] = []
        freed = 0
        heap = self._heap
        entries = self.entries
        while freed < need_tokens and heap:
            item = heapq.heappop(heap)
            h = int(item[-1])  # type: ignore[call-overload]
            e = entries.get(h)
            if e is None or e.stamp != item[-2]:
                continue  # stale
            current = self._key(h, e)
            if current > item[:-2]:
                self._stamp += 1
                e.stamp = self._stamp
                heapq.heappush(heap, (*current, self._stamp, h))
                continue
            if e.pins:
                e.stamp = 0  # out of the heap while pinned; `unpin` puts it back
                continue
            del entries[h]
            self.used_tokens -= e.tokens
            freed += e.tokens
            out.append(Evicted(h, e.tokens, self.count_of(h), e.access))
        return out

    def check_invariants(self) -> None:
        used = sum(e.tokens for e in self.entries.values())
        if used != self.used_tokens:
            raise AssertionError(f"node {self.node} {self.tier}: used {self.used_tokens} != {used}")
        if used > self.capacity_tokens:
            raise AssertionError(
                f"node {self.node} {self.tier}: over capacity {used} > {self.capacity_tokens}"
            )


class LRUTierCache(TierCache):
    """Exact LRU without a heap: `entries` is kept in recency order (an OrderedDict).

    Used for GPU memory (L1), where every prefill touches its prefix: a touch is one
    `move_to_end` per block instead of a lazily corrected heap entry. A chain is touched
    leaf first, so a parent is always more recent than its children and leaves go first
    (the key (T_b, -depth) of the heap version). Accesses must not go back in time.

    An entry is the block's last access alone (no `CacheEntry`: the order is the
    OrderedDict's, depth is never read, pins are rare): every block of the cache has the
    size of the first block inserted (`block_tokens`), and pins live in a side table.
    """

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        super().__init__(node, tier, capacity_tokens, LRUEviction(), count_of)
        self.entries: OrderedDict[BlockHash, float] = OrderedDict()  # type: ignore[assignment]
        self.block_tokens = 0  # set by the first insert
        self._pins: dict[BlockHash, int] = {}

    def _push(self, h: BlockHash, e: CacheEntry, count: int | None = None) -> None:
        return None  # recency order lives in `entries`

    def insert(
        self, hashes: Iterable[BlockHash], tokens: int, t: float, first_depth: int
    ) -> list[Evicted]:
        if tokens != self.block_tokens:
            if self.block_tokens:
                raise ValueError(
                    f"node {self.node} {self.tier}: blocks of {tokens} tokens in a cache of "
                    f"{self.block_tokens}-token blocks (LRUTierCache holds one block size)"
                )
            if tokens <= 0:
                raise ValueError(f"tokens per block must be > 0, got {tokens}")
            self.block_tokens = tokens
        chain = list(hashes)
        entries = self.entries
        new = [h for h in chain if h not in entries]
        evicted: list[Evicted] = []
        need = self.used_tokens + tokens * len(new) - self.capacity_tokens
        if need > 0:
            for h in reversed(chain):  # the chain's cached blocks are in use: not victims
                if h in entries:
                    entries.move_to_end(h)
            evicted = self.evict(need)
        room = (self.capacity_tokens - self.used_tokens) // tokens
        admitted = set(new[: max(room, 0)])  # the chain's leading new blocks, if space is short
        move = entries.move_to_end
        for h in reversed(chain):
            a = entries.get(h)
            if a is not None:
                if t > a:
                    entries[h] = t
                move(h)
            elif h in admitted:
                entries[h] = t
                self.used_tokens += tokens
        return evicted

    def touch(self, hashes: Iterable[BlockHash], t: float) -> None:
        entries = self.entries
        move = entries.move_to_end
        for h in reversed(list(hashes)):
            a = entries.get(h)
            if a is not None:
                if t > a:
                    entries[h] = t
                move(h)

    def pin(self, hashes: Iterable[BlockHash]) -> None:
        pins = self._pins
        for h in hashes:
            if h in self.entries:
                pins[h] = pins.get(h, 0) + 1

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        pins = self._pins
        for h in hashes:
            k = pins.get(h)
            if k is not None and h in self.entries:
                if k > 1:
                    pins[h] = k - 1
                else:
                    del pins[h]

    def remove(self, h: BlockHash) -> bool:
        if self.entries.pop(h, None) is None:
            return False
        self._pins.pop(h, None)
        self.used_tokens -= self.block_tokens
        return True

    def clear(self) -> list[BlockHash]:
        gone = list(self.entries)
        self.entries.clear()
        self._pins.clear()
        self.used_tokens = 0
        return gone

    def evict(self, need_tokens: int) -> list[Evicted]:
        out: list[Evicted] = []
        freed = 0
        entries = self.entries
        pins = self._pins
        tokens = self.block_tokens
        pinned: list[BlockHash] = []
        while freed < need_tokens and entries:
            h, a = entries.popitem(last=False)
            if pins and h in pins:
                pinned.append(h)
                entries[h] = a  # pinned: keep it, after the others
                if len(pinned) > len(entries):
                    break
                continue
            self.used_tokens -= tokens
            freed += tokens
            out.append(Evicted(h, tokens, self.count_of(h), a))
        return out

    def check_invariants(self) -> None:
        used = len(self.entries) * self.block_tokens
        if used != self.used_tokens:
            raise AssertionError(f"node {self.node} {self.tier}: used {self.used_tokens} != {used}")
        if used > self.capacity_tokens:
            raise AssertionError(
                f"node {self.node} {self.tier}: over capacity {used} > {self.capacity_tokens}"
            )
        if any(h not in self.entries or k <= 0 for h, k in self._pins.items()):
            raise AssertionError(f"node {self.node} {self.tier}: pins of absent blocks")
