"""The memory manager's side of the Retention Plane (paper 003 §3.4, Eq. 5).

`RetentionCache` is a `TierCache` whose blocks are reclaimed in ascending
(1[now < d], v, -depth): expired or unprotected blocks first, lower values next, deeper
blocks before their parents (so holdings stay prefix-closed along one path). Each block
carries the last retention decision that concerns it as (d, v, owner program); a block
shared by several programs keeps the strongest protection: a program's decision never
weakens protection another program holds. v = None means "last access" (LRU).

The key depends on time, so when a protection expires the block's heap item must be
re-ranked (a decrease-key): deadlines are kept in a heap and drained lazily before each
reclamation, which orders reclamation exactly as if an event re-ranked each block at its
deadline (the key only matters when something is reclaimed).

For the GPU-only memory-pressure regime (one engine, no host tier, paper 003 §4 RTX cell)
the cache is the whole KV pool: running calls pin the blocks of their context and
`reserve` tokens that are not (yet) blocks - uncached prompt tokens being prefilled and
generated tokens - so cached, running and reserved KV share one capacity, as in vLLM.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence

from cluster.core import BlockHash, Tier
from cluster.kv.eviction import Evicted
from cluster.kv.tier_cache import CacheEntry, TierCache


class PlaneKey:
    """Stands in for the `EvictionPolicy` of a TierCache (its name labels evictions)."""

    uses_counts = False

    def __init__(self, name: str) -> None:
        self.name = name

    def key(self, count: int, last_access: float) -> tuple[float, ...]:
        return (0.0, last_access)


class RetentionCache(TierCache):
    """See module docstring. `clock()` is the simulated time."""

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        name: str,
        clock: Callable[[], float],
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        super().__init__(node, tier, capacity_tokens, PlaneKey(name), count_of)
        self.clock = clock
        self.meta: dict[BlockHash, tuple[float, float | None, int]] = {}  # d, v, owner
        self._expiry: list[tuple[float, int, BlockHash]] = []
        self._seq = 0
        self.pool_tokens = capacity_tokens
        self.reserved_tokens = 0
        self.pinned_tokens = 0
        # Called with (owner, block) when a block some program decided on is reclaimed.
        self.on_owner_evicted: Callable[[int, BlockHash], None] | None = None

    # ---- keys ---------------------------------------------------------------------------
    def _key(self, h: BlockHash, e: CacheEntry, count: int | None = None) -> tuple[object, ...]:
        m = self.meta.get(h)
        if m is None:
            return (0.0, e.access, -e.depth)
        d, v, _ = m
        return (1.0 if self.clock() < d else 0.0, e.access if v is None else v, -e.depth)

    def _rerank(self, h: BlockHash, e: CacheEntry) -> None:
        if e.stamp != 0:  # pinned blocks out of the heap are re-keyed when unpinned
            self._push(h, e)

    def _drain_expired(self) -> None:
        now = self.clock()
        ex = self._expiry
        meta, entries = self.meta, self.entries
        while ex and ex[0][0] <= now:
            d, _, h = heapq.heappop(ex)
            m = meta.get(h)
            e = entries.get(h)
            if m is not None and e is not None and m[0] == d:
                self._rerank(h, e)

    # ---- decisions ----------------------------------------------------------------------
    def protect(
        self, hashes: Iterable[BlockHash], owner: int, until: float, value: float | None
    ) -> None:
        now = self.clock()
        meta, entries = self.meta, self.entries
        for h in hashes:
            e = entries.get(h)
            if e is None:
                continue
            m = meta.get(h)
            if m is not None and m[2] != owner and m[0] > now and m[0] > until:
                continue  # another program protects it longer: the max protection stands
            meta[h] = (until, value, owner)
            self._rerank(h, e)
            if until > now and math.isfinite(until):
                self._seq += 1
                heapq.heappush(self._expiry, (until, self._seq, h))

    def release(self, hashes: Iterable[BlockHash], owner: int) -> None:
        meta, entries = self.meta, self.entries
        for h in hashes:
            m = meta.get(h)
            if m is not None and m[2] == owner:
                del meta[h]
                e = entries.get(h)
                if e is not None:
                    self._rerank(h, e)

    def discard(self, path: Sequence[BlockHash], owner: int) -> list[Evicted]:
        """Evict the program's blocks of `path` now, deepest first, stopping at the first
        block that is in use (pinned), protected by another program, or counted by another
        branch (a shared prefix), so the holdings stay prefix-closed."""
        now = self.clock()
        meta, entries = self.meta, self.entries
        out: list[Evicted] = []
        for h in reversed(path):
            e = entries.get(h)
            if e is None:
                continue
            m = meta.get(h)
            count = self.count_of(h)
            if e.pins or count > 1 or (m is not None and m[2] != owner and m[0] > now):
                break
            meta.pop(h, None)
            del entries[h]
            self.used_tokens -= e.tokens
            out.append(Evicted(h, e.tokens, count, e.access))
        return out

    # ---- reclamation ----------------------------------------------------------------------
    def evict(self, need_tokens: int) -> list[Evicted]:
        self._drain_expired()
        out = super().evict(need_tokens)
        meta = self.meta
        listener = self.on_owner_evicted
        for ev in out:
            m = meta.pop(ev.block_hash, None)
            if m is not None and listener is not None:
                listener(m[2], ev.block_hash)
        return out

    def remove(self, h: BlockHash) -> bool:
        e = self.entries.get(h)
        if e is not None and e.pins:
            self.pinned_tokens -= e.tokens
        self.meta.pop(h, None)
        return super().remove(h)

    def clear(self) -> list[BlockHash]:
        self.meta.clear()
        self._expiry.clear()
        self.pinned_tokens = 0
        return super().clear()

    # ---- running calls: pins and reservations ---------------------------------------------
    def pin_present(self, hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Pin the blocks of `hashes` that are cached; returns them (to unpin exactly)."""
        entries = self.entries
        got = []
        for h in hashes:
            e = entries.get(h)
            if e is not None:
                if e.pins == 0:
                    self.pinned_tokens += e.tokens
                e.pins += 1
                got.append(h)
        return got

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        entries = self.entries
        for h in hashes:
            e = entries.get(h)
            if e is not None and e.pins > 0:
                e.pins -= 1
                if e.pins == 0:
                    self.pinned_tokens -= e.tokens
                    if e.stamp == 0:
                        self._push(h, e)

    def pin(self, hashes: Iterable[BlockHash]) -> None:
        self.pin_present(hashes)

    @property
    def reservable_tokens(self) -> int:
        """Tokens a reservation can get by reclaiming every unpinned block."""
        return self.pool_tokens - self.reserved_tokens - self.pinned_tokens

    @property
    def utilization(self) -> float:
        """KV in use by running calls (pinned blocks and reservations) over the pool, as
        vLLM reports it: cached blocks no call uses count as free (they are reclaimable)."""
        return (self.pinned_tokens + self.reserved_tokens) / self.pool_tokens

    def reserve(self, tokens: int, force: bool = False) -> list[Evicted] | None:
        """Reserve pool tokens outside the block cache, reclaiming unpinned blocks in key
        order; None (nothing changed) if they cannot fit and `force` is False."""
        if tokens <= 0:
            return []
        if not force and tokens > self.reservable_tokens:
            return None
        over = self.used_tokens + self.reserved_tokens + tokens - self.pool_tokens
        out = self.evict(over) if over > 0 else []
        self.reserved_tokens += tokens
        self.capacity_tokens = max(self.pool_tokens - self.reserved_tokens, 0)
        return out

    def unreserve(self, tokens: int) -> None:
        if tokens <= 0:
            return
        if tokens > self.reserved_tokens:
            raise AssertionError(
                f"node {self.node}: unreserve {tokens} > reserved {self.reserved_tokens}"
            )
        self.reserved_tokens -= tokens
        self.capacity_tokens = self.pool_tokens - self.reserved_tokens

    def check_invariants(self) -> None:
        used = sum(e.tokens for e in self.entries.values())
        if used != self.used_tokens:
            raise AssertionError(f"node {self.node} {self.tier}: used {self.used_tokens} != {used}")
        pinned = sum(e.tokens for e in self.entries.values() if e.pins)
        if pinned != self.pinned_tokens:
            raise AssertionError(
                f"node {self.node} {self.tier}: pinned {self.pinned_tokens} != {pinned}"
            )
        if self.reserved_tokens < 0:
            raise AssertionError(f"node {self.node}: negative reservation {self.reserved_tokens}")
        if stale := set(self.meta) - set(self.entries):
            raise AssertionError(f"node {self.node}: retention metadata for absent blocks {stale}")
