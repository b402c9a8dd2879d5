"""`SpanOrder`: the eviction order of a tier kept per span of blocks (paper 000 §5.3).

The order of `recency_cache.RecencyTierCache` (blocks leave in ascending
(1[R_b > 0], T_b, -depth); each group is a *run* in key order plus a *late* heap for blocks
that enter out of order; at equal keys the late heap goes first, by placement sequence),
with a *span* as the unit: consecutive blocks of one chain (each the child of the next)
that share T_b and the group, kept deepest first (key order). A run is a deque of spans;
a late heap holds one item per span, for its head block. `SpanOrder.add` places a chain of
blocks exactly as `RecencyTierCache._place` places them one by one, in two spans at most.

`entries` (block -> span, shared with the cache) names the owner of each block: a block
that leaves its span from the middle leaves a *hole* there, a slot `entries` no longer
names the span for. Spans are never extended after creation, so a slot names one block
for good; `compact` drops what left them.
"""

from __future__ import annotations

import heapq
from collections import deque

from cluster.core import BlockHash


class Span:
    """Blocks `hashes[lo:hi]` (deepest first; slot j has depth depth0 - j) at one T_b in one
    group. In the late heap (`step` != 0) slot j has placement sequence seq0 + step * j."""

    __slots__ = (
        "access",
        "depth0",
        "group",
        "hashes",
        "hi",
        "holes",
        "lo",
        "seq0",
        "step",
        "tokens",
    )

    def __init__(
        self, hashes: list[BlockHash], depth0: int, access: float, group: int, tokens: int
    ) -> None:
        self.hashes = hashes
        self.lo = 0
        self.hi = len(hashes)
        self.depth0 = depth0
        self.access = access
        self.group = group
        self.tokens = tokens
        self.holes = 0  # slots in [lo, hi) whose block left the span
        self.seq0 = 0
        self.step = 0


OUT = Span([], 0, 0.0, -1, 0)  # owner of a block taken out of the order while protected
LateItem = tuple[float, int, int, Span]  # (T_b, -depth, sequence, span) of a span's head


def late_item(s: Span) -> LateItem:
    lo = s.lo
    return (s.access, lo - s.depth0, s.seq0 + s.step * lo, s)


class SpanOrder:
    """Runs and late heaps of the two groups over spans (see module docstring)."""

    def __init__(self, entries: dict[BlockHash, Span]) -> None:
        self.entries = entries
        self.runs: tuple[deque[Span], deque[Span]] = (deque(), deque())
        self.late: tuple[list[LateItem], list[LateItem]] = ([], [])
        self.seq = 0  # placement sequence of late blocks
        self.slots = 0  # slots of the spans still referenced (for compaction)

    def clear(self) -> None:
        for run in self.runs:
            run.clear()
        for late in self.late:
            late.clear()
        self.slots = 0

    def trim_head(self, s: Span) -> bool:
        """Skip holes at the span's head; whether a block is left."""
        entries, hs = self.entries, s.hashes
        lo, hi = s.lo, s.hi
        while lo < hi and entries.get(hs[lo]) is not s:
            lo += 1
            s.holes -= 1
        s.lo = lo
        return lo < hi

    def trim_tail(self, s: Span) -> bool:
        entries, hs = self.entries, s.hashes
        lo, hi = s.lo, s.hi
        while lo < hi and entries.get(hs[hi - 1]) is not s:
            hi -= 1
            s.holes -= 1
        s.hi = hi
        return lo < hi

    def leave(self, s: Span, a: int, b: int) -> None:
        """Owned slots a..b (inclusive, no holes between) leave the span."""
        if b == s.hi - 1:
            s.hi = a
        elif a == s.lo:
            s.lo = b + 1
        else:
            s.holes += b - a + 1

    def last(self, group: int) -> tuple[float, int] | None:
        """Key (T_b, -depth) of the run's last block."""
        run = self.runs[group]
        while run:
            s = run[-1]
            if self.trim_tail(s):
                return s.access, s.hi - 1 - s.depth0
            run.pop()
            self.slots -= len(s.hashes)
        return None

    def add(self, hs: list[BlockHash], depth0: int, access: float, group: int, tokens: int) -> None:
        """Place blocks `hs` (deepest first, depths depth0, depth0 - 1, ...: increasing keys)
        as `RecencyTierCache._place` does one by one: those not above the run's last block
        go to the late heap in order, the rest are appended to the run."""
        n = len(hs)
        k = 0
        last = self.last(group)
        if last is not None:
            la, lnd = last
            if access < la:
                k = n
            elif access == la:
                k = min(max(lnd + depth0 + 1, 0), n)
        entries = self.entries
        if k:
            s = Span(hs[:k] if k < n else hs, depth0, access, group, tokens)
            s.seq0 = self.seq + 1
            s.step = 1
            self.seq += k
            entries.update(dict.fromkeys(s.hashes, s))
            self._push_late(s)
        if k < n:
            s = Span(hs[k:] if k else hs, depth0 - k, access, group, tokens)
            entries.update(dict.fromkeys(s.hashes, s))
            self.runs[group].append(s)
            self.slots += len(s.hashes)

    def add_descending(
        self, hs: list[BlockHash], depth: int, access: float, group: int, tokens: int
    ) -> None:
        """Place blocks `hs` given parent first (depths depth, depth + 1, ...: decreasing
        keys) one by one: the first may join the run, the others go to the late heap."""
        last = self.last(group)
        if last is None or (access, -depth) > last:
            self.add(hs[:1], depth, access, group, tokens)
            hs, depth = hs[1:], depth + 1
        m = len(hs)
        if not m:
            return
        s = Span(hs[::-1], depth + m - 1, access, group, tokens)
        s.seq0 = self.seq + m  # the deepest block was placed last
        s.step = -1
        self.seq += m
        self.entries.update(dict.fromkeys(s.hashes, s))
        self._push_late(s)

    def _push_late(self, s: Span) -> None:
        late = self.late[s.group]
        heapq.heappush(late, late_item(s))
        self.slots += len(s.hashes)

    def compact(self) -> None:
        """Drop what left the spans: rebase every live span on its live slots."""
        slots = 0
        for g in (0, 1):
            run: deque[Span] = deque()
            for s in self.runs[g]:
                if self._rebase(s):
                    run.append(s)
                    slots += len(s.hashes)
            self.runs[g].clear()
            self.runs[g].extend(run)
            late: list[LateItem] = []
            for item in self.late[g]:
                s = item[3]
                if self._rebase(s):
                    late.append(late_item(s))
                    slots += len(s.hashes)
            heapq.heapify(late)
            self.late[g][:] = late
        self.slots = slots

    def _rebase(self, s: Span) -> bool:
        if not (self.trim_head(s) and self.trim_tail(s)):
            return False
        lo = s.lo
        if lo or s.hi < len(s.hashes):
            s.hashes = s.hashes[lo : s.hi]
            s.depth0 -= lo
            s.seq0 += s.step * lo
            s.lo, s.hi = 0, len(s.hashes)
        return True

    def take(self, group: int, limit: int) -> tuple[Span, int, int] | None:
        """Take the front of a group's order out of it: slots j0 < j1 of one span, at most
        `limit`, that `RecencyTierCache._pop` would return one after the other (no other
        block of the group comes between). `give_back` returns the slots not used."""
        entries = self.entries
        late = self.late[group]
        top: LateItem | None = None
        while late:
            item = late[0]
            s = item[3]
            if item[1] + s.depth0 == s.lo and s.lo < s.hi and entries.get(s.hashes[s.lo]) is s:
                top = item
                break
            if self.trim_head(s):
                heapq.heapreplace(late, late_item(s))
            else:
                heapq.heappop(late)
                self.slots -= len(s.hashes)
        run = self.runs[group]
        s0: Span | None = None
        while run:
            s0 = run[0]
            if self.trim_head(s0):
                break
            run.popleft()
            self.slots -= len(s0.hashes)
            s0 = None
        if s0 is not None:
            j = s0.lo
            if top is None or (s0.access, j - s0.depth0) < (top[0], top[1]):
                end = min(j + 1 if s0.holes else s0.hi, j + limit)
                if top is not None and s0.access == top[0]:
                    end = min(end, top[1] + s0.depth0)  # the late top ties or wins from there
                s0.lo = end
                return s0, j, end
        if top is None:
            return None
        # The late top's span (its heap item goes stale: the next `take` re-keys it).
        s = top[3]
        j = s.lo
        end = min(j + 1 if s.holes else s.hi, j + limit)
        nxt = min(late[1:3]) if len(late) > 1 else None  # a bound on the heap's next item
        a, d0, seq0, step = s.access, s.depth0, s.seq0, s.step
        k = j + 1
        while k < end:
            if s0 is not None and (a, k - d0) > (s0.access, s0.lo - s0.depth0):
                break  # the run's head comes first (the late heap wins ties)
            if nxt is not None and (a, k - d0, seq0 + step * k) > nxt[:3]:
                break
            k += 1
        s.lo = k
        return s, j, k

    def give_back(self, s: Span, j: int) -> None:
        """Slots from j on of a span `take` returned go back to the front of the order."""
        s.lo = j

    def check(self) -> dict[BlockHash, Span]:
        """Runs in strictly increasing key order, hole counts exact; returns the owner of
        every block found in a span."""
        placed: dict[BlockHash, Span] = {}
        for g, run in enumerate(self.runs):
            prev: tuple[float, int] | None = None
            for s in run:
                if s.group != g or s.step:
                    raise AssertionError(f"run {g}: span of group {s.group} (step {s.step})")
                prev = self._check_span(s, placed, prev)
        for g, late in enumerate(self.late):
            for item in late:
                s = item[3]
                if s.group != g or not s.step:
                    raise AssertionError(f"late heap {g}: span of group {s.group}")
                self._check_span(s, placed, None)
        return placed

    def _check_span(
        self, s: Span, placed: dict[BlockHash, Span], prev: tuple[float, int] | None
    ) -> tuple[float, int] | None:
        holes = 0
        for j in range(s.lo, s.hi):
            h = s.hashes[j]
            if self.entries.get(h) is not s:
                holes += 1
                continue
            key = (s.access, j - s.depth0)
            if prev is not None and key <= prev:
                raise AssertionError(f"run out of order at block {h}: {key} <= {prev}")
            prev = key
            placed[h] = s
        if holes != s.holes:
            raise AssertionError(f"span holds {holes} holes, counted {s.holes}")
        return prev
