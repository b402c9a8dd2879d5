"""Chained block hashes of request contexts, computed incrementally per branch (SPEC §4).

A block holds `block_tokens` tokens; its hash chains its parent's hash with its content, so
equal hashes at a position imply equal prefixes up to it (as SGLang, vLLM and Dynamo key
their prefix caches). Only full blocks are hashed ("path of the full pages", Alg. E.1).

Two content representations share one hash chain:
- token ids (live engines): a block's content is its token ids;
- segments (the simulator): a block's content is the (segment id, start, end) pieces of the
  segments it overlaps, which identifies the same tokens without materializing them.

`ContextHasher` extends a context and hashes only the blocks the appended tokens complete.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Protocol

import numpy as np

from cluster.core import BlockHash


class Segment(Protocol):
    """A run of tokens with an identity (`cluster.workloads.program.Segment`): equal ids mean
    equal tokens, so blocks can be hashed from (segment id, start, end) pieces."""

    @property
    def seg_id(self) -> int: ...

    @property
    def tokens(self) -> int: ...


ROOT_HASH: BlockHash = 0
_MASK = (1 << 64) - 1


def _signed64(x: int) -> int:
    x &= _MASK
    return x - (1 << 64) if x >= 1 << 63 else x


def chain(parent: BlockHash, content: tuple[object, ...]) -> BlockHash:
    """Hash of a block given its parent's hash and its content (a tuple of ints)."""
    # Python's tuple hash of ints is deterministic across processes (no hash
    # randomization for ints); mixing in a constant keeps 0 reserved for the root.
    h = _signed64(hash((parent, content, 0x9E3779B97F4A7C15)))
    return h if h != ROOT_HASH else 1


def chain_path(tag: object, n: int, parent: BlockHash = ROOT_HASH) -> list[BlockHash]:
    """A synthetic chain of `n` blocks below `parent`, block i holding content (tag, i)
    (benchmarks and tests that need distinct, deterministic paths)."""
    out = []
    for i in range(n):
        parent = chain(parent, (tag, i))
        out.append(parent)
    return out


def token_block_hashes(
    token_ids: Sequence[int], block_tokens: int, parent: BlockHash = ROOT_HASH
) -> list[BlockHash]:
    """Hashes of the full blocks of a token sequence."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    out: list[BlockHash] = []
    h = parent
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = chain(h, tuple(token_ids[start : start + block_tokens]))
        out.append(h)
    return out


def prefix_in(path: Sequence[BlockHash], held: Container[BlockHash]) -> int:
    """Leading blocks of `path` found in `held` (a set, dict or cache keyed by block hash).

    Binary search: chained hashes make a holder of block i hold its whole prefix when the
    holder is prefix-closed (radix caches, the ideal cache, routed-request trees).
    """
    n = len(path)
    if n == 0 or path[0] not in held:
        return 0
    if path[n - 1] in held:
        return n
    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if path[mid] in held:
            lo = mid + 1
        else:
            hi = mid
    return lo


class TokenPathCache:
    """Block hashes of live requests' token ids, computed incrementally per branch.

    A request whose input extends its branch's previous input hashes only the blocks its new
    tokens complete; a rewritten context (compaction) rehashes from the first block that
    changed. Token ids are kept per branch as uint32 arrays (4 bytes per token) until the
    branch finishes (`forget`).
    """

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens
        self._branches: dict[str, tuple[np.ndarray, list[BlockHash]]] = {}
        self.blocks_hashed = 0

    def path(self, branch_id: str, token_ids: Sequence[int]) -> list[BlockHash]:
        bt = self.block_tokens
        ids = np.asarray(token_ids, dtype=np.uint32)
        prev = self._branches.get(branch_id)
        keep = 0
        if prev is not None:
            p_ids, p_hashes = prev
            full = min(len(p_hashes), len(ids) // bt)
            if full and np.array_equal(ids[: full * bt], p_ids[: full * bt]):
                keep = full
            elif full:
                # The first block that differs: binary search over whole-block prefixes.
                lo, hi = 0, full
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if np.array_equal(ids[: mid * bt], p_ids[: mid * bt]):
                        lo = mid
                    else:
                        hi = mid - 1
                keep = lo
            hashes = p_hashes[:keep]
        else:
            hashes = []
        parent = hashes[-1] if hashes else ROOT_HASH
        new = token_block_hashes(ids[keep * bt :].tolist(), bt, parent)
        self.blocks_hashed += len(new)
        hashes = hashes + new
        self._branches[branch_id] = (ids, hashes)
        return hashes

    def forget(self, branch_id: str) -> None:
        self._branches.pop(branch_id, None)

    def __len__(self) -> int:
        return len(self._branches)


class ContextHasher:
    """Block hashes of a growing segment context; appending hashes only new full blocks."""

    __slots__ = ("_hashes", "_pieces", "_pieces_tokens", "block_tokens", "segments", "tokens")

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens
        self.segments: list[Segment] = []
        self.tokens = 0
        self._hashes: list[BlockHash] = []
        # Pieces of the current partial block: (seg_id, start, end) within the segment.
        self._pieces: list[tuple[int, int, int]] = []
        self._pieces_tokens = 0

    @property
    def hashes(self) -> list[BlockHash]:
        """Hashes of the full blocks of the context (do not mutate)."""
        return self._hashes

    def copy(self) -> ContextHasher:
        other = ContextHasher(self.block_tokens)
        other.segments = list(self.segments)
        other.tokens = self.tokens
        other._hashes = list(self._hashes)
        other._pieces = list(self._pieces)
        other._pieces_tokens = self._pieces_tokens
        return other

    def extend(self, segments: Iterable[Segment]) -> list[BlockHash]:
        """Append segments; returns the hashes of the newly completed blocks."""
        bt = self.block_tokens
        new: list[BlockHash] = []
        parent = self._hashes[-1] if self._hashes else ROOT_HASH
        pieces = self._pieces
        filled = self._pieces_tokens
        for seg in segments:
            self.segments.append(seg)
            self.tokens += seg.tokens
            pos = 0
            n = seg.tokens
            while pos < n:
                take = min(bt - filled, n - pos)
                pieces.append((seg.seg_id, pos, pos + take))
                filled += take
                pos += take
                if filled == bt:
                    parent = chain(parent, tuple(pieces))
                    new.append(parent)
                    pieces = []
                    filled = 0
        self._pieces = pieces
        self._pieces_tokens = filled
        self._hashes.extend(new)
        return new

    def truncated(self, keep_segments: int) -> ContextHasher:
        """A hasher of the first `keep_segments` segments, reusing their full-block hashes."""
        if keep_segments >= len(self.segments):
            return self.copy()
        other = ContextHasher(self.block_tokens)
        kept = self.segments[:keep_segments]
        kept_tokens = sum(s.tokens for s in kept)
        full = kept_tokens // self.block_tokens
        if full == 0:
            other.extend(kept)
            return other
        # Replay the segments but skip hashing for blocks we already know.
        other._hashes = self._hashes[:full]
        other.segments = []
        other.tokens = 0
        covered = full * self.block_tokens
        pos = 0
        tail: list[Segment] = []
        pieces: list[tuple[int, int, int]] = []
        for seg in kept:
            end = pos + seg.tokens
            if pos >= covered:
                tail.append(seg)
            elif end > covered:  # straddles the last full block: its rest starts a piece
                pieces.append((seg.seg_id, covered - pos, seg.tokens))
            pos = end
            other.segments.append(seg)
            other.tokens += seg.tokens
        other._pieces = pieces
        other._pieces_tokens = sum(e - s for _, s, e in pieces)
        # The tail segments start a fresh piece sequence after the partial piece.
        saved_segments, saved_tokens = other.segments, other.tokens
        other.segments, other.tokens = [], 0
        other.extend(tail)
        other.segments, other.tokens = saved_segments, saved_tokens
        return other
