"""`SpanTierCache`: a host tier whose blocks are stored, touched and evicted per span
(paper 000 §5.3; the order itself is `span_order.SpanOrder`).

The same evictions, in the same order and with the same tie-breaks, as
`recency_cache.RecencyTierCache`, its block-granular reference (a hypothesis test holds
the two to it): blocks leave in ascending (1[R_b > 0], T_b, -depth). A request's path
enters as a few spans (runs of consecutive blocks of one chain sharing T_b and the
group), a touch moves the shallow end of each span it meets (the part on the touched
path) to the end of its run, and a path segment whose branch counts fell to zero is
re-ranked as one span: a path costs one step per span, not one per block. Blocks are
named only in `entries` (block -> its span) and in the spans' lists of hashes.

Only the simulator's usage is supported: `pin` and `unpin` are refused (`insert` protects
the chain's cached blocks itself while it evicts, as the reference's pins do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cluster.core import BlockHash, Tier
from cluster.kv.eviction import Evicted, EvictionPolicy
from cluster.kv.recency_cache import RecencyTierCache
from cluster.kv.span_order import OUT, Span, SpanOrder
from cluster.kv.tier_cache import TierCache


class SpanTierCache(TierCache):
    """See module docstring."""

    compact_slack = (
        4096  # slots of dead spans kept before `SpanOrder.compact` (beyond 2x the blocks)
    )

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        policy: EvictionPolicy,
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        if not RecencyTierCache.orders(policy):
            raise ValueError(
                f"SpanTierCache orders the built-in 'branch' and 'lru' policies only, got "
                f"{policy.name!r} (use TierCache for other policies)"
            )
        super().__init__(node, tier, capacity_tokens, policy, count_of)
        self.entries: dict[BlockHash, Span] = {}  # type: ignore[assignment]
        self._counts = policy.uses_counts
        self.order = SpanOrder(self.entries)

    def _group(self, h: BlockHash) -> int:
        return 1 if self._counts and self.count_of(h) > 0 else 0

    # ---- operations ----------------------------------------------------------------------------
    def insert(
        self, hashes: Iterable[BlockHash], tokens: int, t: float, first_depth: int
    ) -> list[Evicted]:
        if self.order.slots > 2 * len(self.entries) + self.compact_slack:
            self.order.compact()
        chain = list(hashes)
        entries = self.entries
        held = [h for h in chain if h in entries]
        if held:
            new = [(h, first_depth + i) for i, h in enumerate(chain) if h not in entries]
        else:
            new = [(h, first_depth + i) for i, h in enumerate(chain)]
        evicted: list[Evicted] = []
        need = self.used_tokens + tokens * len(new) - self.capacity_tokens
        if need > 0:
            protected: dict[BlockHash, tuple[float, int, int]] = {}
            evicted = self._evict(need, set(held), protected)
            for h in held:  # back into the order, as RecencyTierCache's `unpin` does
                got = protected.get(h)
                if got is not None:
                    self.order.add([h], got[1], got[0], self._group(h), got[2])
            room = (self.capacity_tokens - self.used_tokens) // tokens if tokens else len(new)
            del new[max(room, 0) :]
        if new:
            # Leaf first, in pieces of consecutive depth and one group.
            counts = self._counts
            count_of = self.count_of
            piece: list[BlockHash] = []
            d0 = g0 = -1
            for h, depth in reversed(new):
                g = 1 if counts and count_of(h) > 0 else 0
                if piece and g == g0 and depth == d0 - len(piece):
                    piece.append(h)
                    continue
                if piece:
                    self.order.add(piece, d0, t, g0, tokens)
                piece, d0, g0 = [h], depth, g
            self.order.add(piece, d0, t, g0, tokens)
            self.used_tokens += tokens * len(new)
        if held:
            if held == chain[: len(held)]:
                self.touch(held, t)  # the cached blocks are the chain's prefix
            else:
                self._touch_pieces(chain, held, t)
        return evicted

    def _touch_pieces(self, chain: list[BlockHash], held: list[BlockHash], t: float) -> None:
        """Touch `held` (blocks of `chain`, not one prefix of it) one chain segment at a
        time, leaf-most segment first: the block-by-block order of a touch."""
        cached = set(held)
        segments: list[list[BlockHash]] = []
        run: list[BlockHash] = []
        for h in chain:
            if h in cached:
                run.append(h)
            elif run:
                segments.append(run)
                run = []
        if run:
            segments.append(run)
        for seg in reversed(segments):
            self.touch(seg, t)

    def touch(self, hashes: Iterable[BlockHash], t: float) -> None:
        """Move the blocks of `hashes` (a chain: a path, its prefix or a segment of it) last
        accessed before `t` to the end of their runs, leaf first; a span costs one step."""
        path = hashes if isinstance(hashes, list) else list(hashes)
        entries = self.entries
        pieces: list[tuple[list[BlockHash], int, int, int]] = []  # (blocks, depth0, group, tokens)
        i = len(path) - 1
        while i >= 0:
            h = path[i]
            s = entries.get(h)
            if s is None or s is OUT:
                i -= 1
                continue
            # Slot p + k of the span holds path[i - k] (both are chains), for k <= i.
            if t <= s.access:
                if s.holes:
                    i -= 1
                else:
                    i -= s.hi - s.hashes.index(h, s.lo, s.hi)
                continue
            p = s.hashes.index(h, s.lo, s.hi)
            if s.holes:
                moved = [h]
                self.order.leave(s, p, p)
            else:
                m = min(s.hi - p, i + 1)
                moved = s.hashes[p : p + m]
                self.order.leave(s, p, p + m - 1)
            depth = s.depth0 - p
            last = pieces[-1] if pieces else None
            if (
                last is not None
                and last[2] == s.group
                and last[3] == s.tokens
                and last[1] - len(last[0]) == depth
            ):
                last[0].extend(moved)
            else:
                pieces.append((moved, depth, s.group, s.tokens))
            i -= len(moved)
        for hs, depth0, g, tokens in pieces:
            self.order.add(hs, depth0, t, g, tokens)

    def _rerank_zeroed(self) -> None:
        """Blocks whose count fell to zero enter the zero group at their old T_b, in the
        order they were reported (a released path segment comes parent first)."""
        zeroed, self._zeroed = self._zeroed, []
        entries = self.entries
        count_of = self.count_of
        src: Span | None = None
        first = last = -1
        piece: list[BlockHash] = []
        for h in zeroed:
            s = entries.get(h)
            if s is None or s.group != 1 or count_of(h) != 0:
                continue
            if s is src:
                if last > s.lo and s.hashes[last - 1] == h:
                    last -= 1
                    piece.append(h)
                    continue
                self.order.leave(src, last, first)
                self.order.add_descending(piece, src.depth0 - first, src.access, 0, src.tokens)
                src = None
                s = entries[h]
                if s.group != 1:
                    continue  # reported twice: already re-ranked
            elif src is not None:
                self.order.leave(src, last, first)
                self.order.add_descending(piece, src.depth0 - first, src.access, 0, src.tokens)
            src, piece = s, [h]
            first = last = s.hashes.index(h, s.lo, s.hi)
        if src is not None:
            self.order.leave(src, last, first)
            self.order.add_descending(piece, src.depth0 - first, src.access, 0, src.tokens)

    def pin(self, hashes: Iterable[BlockHash]) -> None:
        raise TypeError("SpanTierCache has no pins (use RecencyTierCache or RetentionCache)")

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        raise TypeError("SpanTierCache has no pins (use RecencyTierCache or RetentionCache)")

    def remove(self, h: BlockHash) -> bool:
        s = self.entries.get(h)
        if s is None:
            return False
        j = s.hashes.index(h, s.lo, s.hi)
        del self.entries[h]
        self.order.leave(s, j, j)
        self.used_tokens -= s.tokens
        return True

    def clear(self) -> list[BlockHash]:
        gone = list(self.entries)
        self.entries.clear()
        self.order.clear()
        self._zeroed.clear()
        self.used_tokens = 0
        return gone

    def evict(self, need_tokens: int) -> list[Evicted]:
        """Free at least `need_tokens` tokens: zero-count blocks first, then counted ones,
        T_b then depth order within each."""
        return self._evict(need_tokens, None, {})

    def _evict(
        self,
        need_tokens: int,
        held: set[BlockHash] | None,
        protected: dict[BlockHash, tuple[float, int, int]],
    ) -> list[Evicted]:
        """`evict`, skipping the blocks of `held`: those popped leave the order and are
        returned in `protected` as (T_b, depth, tokens)."""
        if self._zeroed:
            self._rerank_zeroed()
        out: list[Evicted] = []
        freed = 0
        entries = self.entries
        count_of = self.count_of
        counts = self._counts
        take = self.order.take
        add = self.order.add
        while freed < need_tokens:
            limit = need_tokens - freed  # blocks of at least one token each
            got = take(0, limit) or take(1, limit)
            if got is None:
                break
            s, i, end = got
            hs, g, tokens, access = s.hashes, s.group, s.tokens, s.access
            while i < end:
                h = hs[i]
                i += 1
                if held and h in held:
                    entries[h] = OUT
                    protected[h] = (access, s.depth0 - i + 1, tokens)
                    continue
                c = count_of(h)
                if counts and (c > 0) != (g == 1):
                    add([h], s.depth0 - i + 1, access, 1 if c > 0 else 0, tokens)
                    if g == 1:
                        break  # it entered the zero group, which goes first
                    continue
                del entries[h]
                freed += tokens
                out.append(Evicted(h, tokens, c, access))
                if freed >= need_tokens:
                    break
            if i < end:
                self.order.give_back(s, i)
        self.used_tokens -= freed
        return out

    def check_invariants(self) -> None:
        placed = self.order.check()
        used = 0
        for h, s in self.entries.items():
            if placed.get(h) is not s:
                raise AssertionError(f"block {h} is in no span")
            used += s.tokens
        if used != self.used_tokens:
            raise AssertionError(f"node {self.node} {self.tier}: used {self.used_tokens} != {used}")
        if used > self.capacity_tokens:
            raise AssertionError(
                f"node {self.node} {self.tier}: over capacity {used} > {self.capacity_tokens}"
            )
