"""Which page holds which block: the engine's two-tier prefix cache (paper 000 §4.2, §5.3).

Blocks are full pages keyed by the chained hashes of `cluster.kv.hashing` (the directory's
own chain, so the engine's KV events need no re-keying). A block may hold a device page
(L1), a host page (L2), or both. Running requests hold references (`ref`) on the device
pages of their prefix; unreferenced blocks stay cached until evicted.

- Write-through (HiCache, as §4.2 has both phases do): a block is copied to the host tier
  as soon as it is cached on the device, so a device eviction loses nothing that fits in
  host memory, and a role switch or a later request on this node finds it there. The copy
  is skipped when its parent is not on the host, which keeps the host tier prefix-closed.
- Restore: a prefix hit that continues in the host tier is copied back into new device
  pages before the request's first chunk (its tokens are the pass's t_rst).
- Eviction: leaves first in each tier (holdings stay prefix-closed, as a radix cache's),
  ordered by the control plane's policy (`cluster.kv.eviction`: "lru", or "branch" with
  the branch counts R_b it sends), deeper blocks first on ties.

Device pages are also lent to requests as private pages (partial pages, duplicates) and
reserved for their future output; `available` pages are free and unreserved. Every change
is recorded as an SGLang KV event (medium "GPU" or "CPU_PINNED"), coalesced as SGLang's
`KVCacheEventRecorder` does.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from cluster.core import BlockHash
from cluster.kv.eviction import EVICTION_POLICIES, EvictionPolicy
from cluster.wire.kv_events import (
    SGLangAllBlocksCleared,
    SGLangBlockRemoved,
    SGLangBlockStored,
    SGLangEvent,
)

GPU, HOST = "GPU", "CPU_PINNED"


class Block:
    """One cached block: its chain position, its pages and who uses it."""

    __slots__ = (
        "depth",
        "gpu_children",
        "hash",
        "host_children",
        "host_page",
        "last_access",
        "page",
        "parent",
        "ref",
        "tokens",
    )

    def __init__(self, h: BlockHash, parent: Block | None, tokens: tuple[int, ...]) -> None:
        self.hash = h
        self.parent = parent
        self.tokens = tokens
        self.depth: int = 1 if parent is None else parent.depth + 1
        self.page: int | None = None
        self.host_page: int | None = None
        self.ref = 0
        self.gpu_children = 0
        self.host_children = 0
        self.last_access = 0.0


class PrefixCache:
    """Device and host pages of one engine, the blocks they hold, and the KV events."""

    def __init__(
        self, page_size: int, gpu_pages: int, host_pages: int, policy: str = "lru"
    ) -> None:
        self.page_size = page_size
        self.gpu_pages = gpu_pages
        self.host_pages = host_pages
        self.blocks: dict[BlockHash, Block] = {}
        self._free: deque[int] = deque(range(gpu_pages))
        self._free_host: deque[int] = deque(range(host_pages))
        self.reserved = 0  # device pages promised to running requests' future tokens
        self.private = 0  # device pages lent to requests and held by no block
        self.policy: EvictionPolicy = EVICTION_POLICIES.create(policy)
        self.counts: dict[BlockHash, int] = {}  # branch counts R_b from the control plane
        self.num_evicted = {GPU: 0, HOST: 0}
        self.num_written_through = 0
        self.num_restored = 0
        self._events: list[SGLangEvent] = []

    # ---- views ----------------------------------------------------------------------------
    @property
    def available(self) -> int:
        return len(self._free) - self.reserved

    @property
    def gpu_used_pages(self) -> int:
        return self.gpu_pages - len(self._free)

    @property
    def host_used_pages(self) -> int:
        return self.host_pages - len(self._free_host)

    @property
    def cached_gpu_blocks(self) -> int:
        return sum(1 for b in self.blocks.values() if b.page is not None)

    def set_policy(
        self, name: str, counts: Mapping[BlockHash, int] | None = None, replace: bool = False
    ) -> None:
        """Choose the eviction order (raises ConfigError naming the policies on a miss);
        `counts` merge into the branch counts held (a count <= 0 forgets its block), or
        replace them all with `replace`."""
        self.policy = EVICTION_POLICIES.create(name)
        if replace:
            self.counts = {}
        if counts is not None:
            for h, c in counts.items():
                if c > 0:
                    self.counts[h] = c
                else:
                    self.counts.pop(h, None)

    # ---- lookups and references -------------------------------------------------------------
    def match(self, hashes: Sequence[BlockHash], now: float) -> tuple[list[Block], list[Block]]:
        """The leading blocks of `hashes` cached on the device, then those only on the host."""
        gpu: list[Block] = []
        host: list[Block] = []
        for h in hashes:
            b = self.blocks.get(h)
            if b is None:
                break
            if b.page is not None and not host:
                gpu.append(b)
            elif b.page is None and b.host_page is not None:
                host.append(b)
            else:
                break
            b.last_access = now
        return gpu, host

    def acquire(self, blocks: Iterable[Block]) -> None:
        for b in blocks:
            b.ref += 1

    def release(self, blocks: Iterable[Block], now: float) -> None:
        for b in blocks:
            if b.ref <= 0:
                raise RuntimeError(f"block {b.hash} released more often than acquired")
            b.ref -= 1
            b.last_access = now

    # ---- device pages -----------------------------------------------------------------------
    def lend(self, now_pages: int, later_pages: int, now: float) -> list[int] | None:
        """Lend `now_pages` private pages and reserve `later_pages`, evicting if needed;
        None (nothing changed) when the device tier cannot hold them."""
        need = now_pages + later_pages
        if self.available < need:
            self.evict(GPU, need - self.available, now)
        if self.available < need:
            return None
        self.private += now_pages
        self.reserved += later_pages
        return [self._free.popleft() for _ in range(now_pages)]

    def take_reserved(self) -> int:
        if self.reserved <= 0:
            raise RuntimeError("no reserved page left to take")
        self.reserved -= 1
        self.private += 1
        return self._free.popleft()

    def unreserve(self, n: int) -> None:
        self.reserved -= n

    def give_back(self, pages: Sequence[int]) -> None:
        """Private pages back to the free list."""
        self.private -= len(pages)
        self._free.extend(pages)

    # ---- caching ----------------------------------------------------------------------------
    def register(
        self, h: BlockHash, parent: BlockHash | None, tokens: Sequence[int], page: int, now: float
    ) -> Block | None:
        """A request's full private page becomes block `h`, referenced once by the caller.

        None when `h` already has a device page, or when its parent has none (the request
        kept the parent's page private because another request cached that block first,
        and that copy was evicted since): the caller keeps its page private.
        """
        b = self.blocks.get(h)
        if b is not None and b.page is not None:
            return None
        p = None
        if parent is not None:
            p = self.blocks.get(parent)
            if p is None or p.page is None:
                return None  # caching it would break the device tier's prefix closure
        if b is None:
            b = self.blocks[h] = Block(h, p, tuple(tokens))
        self.private -= 1
        self._attach(b, page, now)
        b.ref += 1
        return b

    def restore(self, blocks: Sequence[Block], now: float) -> list[tuple[int, int]] | None:
        """Give host-only `blocks` device pages (referenced once by the caller); returns the
        (host page, device page) copies to make, or None when the device tier is full."""
        pages = self.lend(len(blocks), 0, now)
        if pages is None:
            return None
        self.private -= len(pages)
        copies = []
        for b, p in zip(blocks, pages, strict=True):
            self._attach(b, p, now)
            b.ref += 1
            copies.append((b.host_page, p))
        self.num_restored += len(blocks)
        return copies  # type: ignore[return-value]

    def write_through(self, blocks: Sequence[Block], now: float) -> list[tuple[int, int]]:
        """Give device blocks host copies; returns the (device page, host page) copies."""
        copies: list[tuple[int, int]] = []
        for b in blocks:
            if b.host_page is not None or b.page is None or not self.host_pages:
                continue
            if not self._free_host:
                self.evict(HOST, 1, now)
            if (b.parent is not None and b.parent.host_page is None) or not self._free_host:
                continue  # the host tier stays prefix-closed
            b.host_page = self._free_host.popleft()
            if b.parent is not None:
                b.parent.host_children += 1
            self._record_store(b, HOST)
            copies.append((b.page, b.host_page))
        self.num_written_through += len(copies)
        return copies

    def evict(self, medium: str, n: int, now: float) -> int:
        """Drop up to `n` unreferenced leaf blocks of one tier, in the policy's order."""

        def evictable(b: Block) -> bool:
            if medium == GPU:
                return b.page is not None and b.ref == 0 and b.gpu_children == 0
            return b.host_page is not None and b.host_children == 0

        # A heap of the current leaves; a parent joins when its last child goes, so a
        # referenced leaf never goes before an unreferenced parent exposed on the way.
        # Ties break by a sequence number unique in the heap (never by comparing blocks).
        seq = itertools.count()
        heap = [(self._order(b), next(seq), b) for b in self.blocks.values() if evictable(b)]
        heapq.heapify(heap)
        done = 0
        while done < n and heap:
            _, _, b = heapq.heappop(heap)
            parent = b.parent
            self._drop(b, medium)
            done += 1
            if parent is not None and evictable(parent):
                heapq.heappush(heap, (self._order(parent), next(seq), parent))
        self.num_evicted[medium] += done
        return done

    def reset(self) -> None:
        """Drop every block of both tiers (flush_cache; only with no request running)."""
        if self.private or self.reserved or any(b.ref for b in self.blocks.values()):
            raise RuntimeError("cannot reset the prefix cache while requests hold pages")
        self.blocks.clear()
        self._free = deque(range(self.gpu_pages))
        self._free_host = deque(range(self.host_pages))
        self._events.append(SGLangAllBlocksCleared())

    def take_events(self) -> list[SGLangEvent]:
        events, self._events = self._events, []
        return events

    def check_invariants(self) -> None:
        gpu_children: dict[BlockHash, int] = {}
        host_children: dict[BlockHash, int] = {}
        pages: list[int] = []
        host_pages: list[int] = []
        for h, b in self.blocks.items():
            if b.page is None and b.host_page is None:
                raise AssertionError(f"block {h} holds no page in either tier")
            if b.ref < 0 or (b.ref and b.page is None):
                raise AssertionError(f"block {h} has ref {b.ref} and page {b.page}")
            p = b.parent
            if p is not None and self.blocks.get(p.hash) is not p:
                raise AssertionError(f"block {h}'s parent {p.hash} is not cached")
            if b.page is not None:
                pages.append(b.page)
                if p is not None:
                    if p.page is None:
                        raise AssertionError(f"block {h} is on the device, its parent is not")
                    gpu_children[p.hash] = gpu_children.get(p.hash, 0) + 1
            if b.host_page is not None:
                host_pages.append(b.host_page)
                if p is not None:
                    if p.host_page is None:
                        raise AssertionError(f"block {h} is on the host, its parent is not")
                    host_children[p.hash] = host_children.get(p.hash, 0) + 1
        for h, b in self.blocks.items():
            if (b.gpu_children, b.host_children) != (
                gpu_children.get(h, 0),
                host_children.get(h, 0),
            ):
                raise AssertionError(f"block {h} miscounts its children")
        if len(set(pages) | set(self._free)) != len(pages) + len(self._free):
            raise AssertionError("a device page is both cached and free")
        if len(pages) + len(self._free) + self.private != self.gpu_pages:
            raise AssertionError("device pages are lost or double-counted")
        if len(set(host_pages)) + len(self._free_host) != self.host_pages:
            raise AssertionError("host pages are lost or double-counted")
        if self.reserved < 0 or self.available < 0:
            raise AssertionError(f"reserved {self.reserved} of {len(self._free)} free pages")

    # ---- internals --------------------------------------------------------------------------
    def _attach(self, b: Block, page: int, now: float) -> None:
        b.page = page
        b.last_access = now
        if b.parent is not None:
            b.parent.gpu_children += 1
        self._record_store(b, GPU)

    def _order(self, b: Block) -> tuple[object, ...]:
        count = self.counts.get(b.hash, 0) if self.policy.uses_counts else 0
        return (*self.policy.key(count, b.last_access), -b.depth)

    def _drop(self, b: Block, medium: str) -> None:
        if medium == GPU:
            self._free.append(b.page)  # type: ignore[arg-type]
            b.page = None
            if b.parent is not None:
                b.parent.gpu_children -= 1
        else:
            self._free_host.append(b.host_page)  # type: ignore[arg-type]
            b.host_page = None
            if b.parent is not None:
                b.parent.host_children -= 1
        if b.page is None and b.host_page is None:
            del self.blocks[b.hash]
        tail = self._events[-1] if self._events else None
        if isinstance(tail, SGLangBlockRemoved) and tail.medium == medium:
            tail.block_hashes.append(b.hash)
        else:
            self._events.append(SGLangBlockRemoved(block_hashes=[b.hash], medium=medium))

    def _record_store(self, b: Block, medium: str) -> None:
        parent = None if b.parent is None else b.parent.hash
        tail = self._events[-1] if self._events else None
        if (
            isinstance(tail, SGLangBlockStored)
            and tail.medium == medium
            and tail.block_hashes
            and parent == tail.block_hashes[-1]
        ):
            tail.block_hashes.append(b.hash)
            tail.token_ids.extend(b.tokens)
            return
        self._events.append(
            SGLangBlockStored(
                block_hashes=[b.hash],
                parent_block_hash=parent,
                token_ids=list(b.tokens),
                block_size=self.page_size,
                lora_id=None,
                medium=medium,
            )
        )
