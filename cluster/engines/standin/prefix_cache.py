"""A paged prefix cache that hashes and reports blocks like SGLang's radix cache (SPEC §4, §6).

Used by the SGLang stand-in. Block identity follows SGLang 0.5.23
(`mem_cache/cpp_utils/hash_binding.cpp`, `mem_cache/utils.py`, `mem_cache/events.py`):
page i's digest is SHA-256(digest of page i-1, if any || the page's token ids as
little-endian uint32); the published block hash is the first 8 digest bytes read big-endian
as a signed int64 (`hash_str_to_int64`); a root page has parent None. Only full pages are
cached (a paged radix tree stores page-aligned keys). Events are coalesced as SGLang's
`KVCacheEventRecorder.enqueue` does: a BlockStored whose parent is the previous
BlockStored's last hash extends it; consecutive BlockRemoved merge.

Eviction is LRU over unlocked leaf pages (a page is locked while a running request uses
it), as the radix cache evicts leaves by last access. `reset()` drops everything and
records AllBlocksCleared (flush_cache, PD role switch).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.wire.kv_events import (
    SGLangAllBlocksCleared,
    SGLangBlockRemoved,
    SGLangBlockStored,
    SGLangEvent,
)


def page_digest(tokens: Sequence[int], prior: bytes | None) -> bytes:
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.digest()


def digest_to_int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def page_hashes(tokens: Sequence[int], page_size: int) -> list[int]:
    """SGLang's published block hashes of the full pages of `tokens` from the root."""
    out: list[int] = []
    prior: bytes | None = None
    for start in range(0, len(tokens) - page_size + 1, page_size):
        prior = page_digest(tokens[start : start + page_size], prior)
        out.append(digest_to_int64(prior))
    return out


@dataclass(slots=True)
class _Page:
    digest: bytes
    parent: int | None
    tokens: tuple[int, ...]
    children: int = 0
    lock_ref: int = 0
    last_access: float = 0.0


@dataclass(slots=True)
class PrefixCache:
    """Full pages keyed by block hash; `capacity_pages` bounds cached + reserved pages."""

    page_size: int
    capacity_pages: int
    medium: str = "GPU"
    record_events: bool = True
    _pages: dict[int, _Page] = field(default_factory=dict)
    _events: list[SGLangEvent] = field(default_factory=list)
    reserved_pages: int = 0  # pages of running requests not (yet) in the tree

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.capacity_pages <= 0:
            raise ValueError("page_size and capacity_pages must be > 0")

    @property
    def num_pages(self) -> int:
        return len(self._pages)

    @property
    def free_pages(self) -> int:
        return self.capacity_pages - len(self._pages) - self.reserved_pages

    def match(self, tokens: Sequence[int], now: float) -> list[int]:
        """Hashes of the leading full pages of `tokens` that are cached (touches them)."""
        out: list[int] = []
        prior: bytes | None = None
        ps = self.page_size
        for start in range(0, len(tokens) - ps + 1, ps):
            prior = page_digest(tokens[start : start + ps], prior)
            h = digest_to_int64(prior)
            page = self._pages.get(h)
            if page is None:
                break
            page.last_access = now
            out.append(h)
        return out

    def insert(self, tokens: Sequence[int], now: float) -> list[int]:
        """Cache every full page of `tokens`; returns all their hashes (new and old)."""
        out: list[int] = []
        prior: bytes | None = None
        parent: int | None = None
        ps = self.page_size
        for start in range(0, len(tokens) - ps + 1, ps):
            chunk = tuple(tokens[start : start + ps])
            prior = page_digest(chunk, prior)
            h = digest_to_int64(prior)
            page = self._pages.get(h)
            if page is None:
                self._pages[h] = _Page(prior, parent, chunk, last_access=now)
                if parent is not None:
                    self._pages[parent].children += 1
                self._record_store(h, parent, chunk)
            else:
                page.last_access = now
            out.append(h)
            parent = h
        return out

    def lock(self, hashes: Sequence[int], delta: int) -> None:
        for h in hashes:
            page = self._pages.get(h)
            if page is not None:
                page.lock_ref += delta
                if page.lock_ref < 0:
                    raise RuntimeError(f"page {h} unlocked more often than locked")

    def evict(self, num_pages: int) -> int:
        """Evict up to `num_pages` unlocked leaves, least recently used first."""
        evicted = 0
        while evicted < num_pages:
            leaves = [
                (p.last_access, h)
                for h, p in self._pages.items()
                if p.children == 0 and p.lock_ref == 0
            ]
            if not leaves:
                break
            leaves.sort()
            for _, h in leaves[: num_pages - evicted]:
                self._remove(h)
                evicted += 1
        return evicted

    def reset(self) -> None:
        self._pages.clear()
        self.reserved_pages = 0
        if self.record_events:
            self._events.append(SGLangAllBlocksCleared())

    def take_events(self) -> list[SGLangEvent]:
        events, self._events = self._events, []
        return events

    def check_invariants(self) -> None:
        children: dict[int, int] = {}
        for h, p in self._pages.items():
            if p.parent is not None:
                if p.parent not in self._pages:
                    raise AssertionError(f"page {h} has a parent {p.parent} that is not cached")
                children[p.parent] = children.get(p.parent, 0) + 1
            if p.lock_ref < 0:
                raise AssertionError(f"page {h} has lock_ref {p.lock_ref}")
        for h, p in self._pages.items():
            if p.children != children.get(h, 0):
                raise AssertionError(
                    f"page {h} counts {p.children} children, has {children.get(h, 0)}"
                )
        if self.free_pages < 0:
            raise AssertionError(f"cache over capacity: {self.free_pages} free pages")

    def _remove(self, h: int) -> None:
        page = self._pages.pop(h)
        if page.parent is not None:
            self._pages[page.parent].children -= 1
        if not self.record_events:
            return
        tail = self._events[-1] if self._events else None
        if isinstance(tail, SGLangBlockRemoved) and tail.medium == self.medium:
            tail.block_hashes.append(h)
        else:
            self._events.append(SGLangBlockRemoved(block_hashes=[h], medium=self.medium))

    def _record_store(self, h: int, parent: int | None, tokens: tuple[int, ...]) -> None:
        if not self.record_events:
            return
        tail = self._events[-1] if self._events else None
        if (
            isinstance(tail, SGLangBlockStored)
            and tail.medium == self.medium
            and tail.block_size == len(tokens)
            and tail.block_hashes
            and parent == tail.block_hashes[-1]
        ):
            tail.block_hashes.append(h)
            tail.token_ids.extend(tokens)
            return
        self._events.append(
            SGLangBlockStored(
                block_hashes=[h],
                parent_block_hash=parent,
                token_ids=list(tokens),
                block_size=len(tokens),
                lora_id=None,
                medium=self.medium,
            )
        )
