"""`RecencyTierCache`: the built-in eviction orders kept exactly without a heap (paper 000 §5.3).

Block-granular: the reference `span_cache.SpanTierCache` (the simulator's host tier) is
held to, evicting the same blocks in the same order."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable

from cluster.core import BlockHash, Tier
from cluster.kv.eviction import BranchAwareEviction, Evicted, EvictionPolicy, LRUEviction
from cluster.kv.tier_cache import CacheEntry, TierCache


class _RunEntry(CacheEntry):
    """An entry of `RecencyTierCache`: `stamp` is 0 in its group's run, a heap sequence
    number when it sits in the group's late heap, -1 when it is out of the order (pinned)."""

    __slots__ = ("group",)

    def __init__(self, tokens: int, access: float, depth: int, group: int) -> None:
        super().__init__(tokens, access, depth)
        self.group = group


_OUT = -1


class RecencyTierCache(TierCache):
    """Exact eviction order for the built-in policies, without a lazily corrected heap.

    Branch-aware eviction orders blocks by (1[R_b > 0], T_b, -depth); LRU is the same with
    one group. Each group is kept as a *run*, an OrderedDict in key order, plus a small
    *late* heap for blocks that enter out of order. Simulated time only moves forward, so
    a touch or an insert at `now` appends to its run (a chain goes leaf first, so a parent
    follows its children); only a block whose count drops to zero enters the zero group
    with an old T_b, and that block goes to the late heap. Eviction takes the smaller of the
    run's head and the heap's top. The lazy `TierCache` heap instead re-pushes a block at
    every count drop and every stale pop and keeps 2-3x more items than blocks; this keeps
    at most one live position per block.

    As in `TierCache`, a count that drops to zero is re-ranked before the next eviction
    (`on_counts_zeroed`); a count that becomes positive is found when the block reaches
    the head of the zero group, and the block moves to the positive group.

    `insert` evicts once for the whole chain, before adding it (its cached blocks are held
    back meanwhile), then adds the chain's leading new blocks that fit.
    """

    @staticmethod
    def orders(policy: EvictionPolicy) -> bool:
        """Whether this cache can keep `policy`'s order (the built-in policies)."""
        return type(policy) in (BranchAwareEviction, LRUEviction)

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        policy: EvictionPolicy,
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        if not self.orders(policy):
            raise ValueError(
                f"RecencyTierCache orders the built-in 'branch' and 'lru' policies only, got "
                f"{policy.name!r} (use TierCache for other policies)"
            )
        super().__init__(node, tier, capacity_tokens, policy, count_of)
        self.entries: dict[BlockHash, _RunEntry] = {}  # type: ignore[assignment]
        self._counts = policy.uses_counts
        self._runs: tuple[OrderedDict[BlockHash, _RunEntry], ...] = (OrderedDict(), OrderedDict())
        self._late: tuple[list[tuple[float, int, int, BlockHash]], ...] = ([], [])
        self._seq = 0

    # ---- positions ------------------------------------------------------------------------
    def _place(self, h: BlockHash, e: _RunEntry) -> None:
        run = self._runs[e.group]
        if run:
            last = run[next(reversed(run))]
            if e.access < last.access or (e.access == last.access and e.depth >= last.depth):
                self._seq += 1
                e.stamp = self._seq
                late = self._late[e.group]
                heapq.heappush(late, (e.access, -e.depth, self._seq, h))
                if len(late) > len(self.entries) + 64:
                    self._compact(e.group)
                return
        run[h] = e
        e.stamp = 0

    def _unplace(self, h: BlockHash, e: _RunEntry) -> None:
        if e.stamp == 0:
            del self._runs[e.group][h]
        e.stamp = _OUT  # a late heap item of it is now stale

    def _compact(self, group: int) -> None:
        entries = self.entries
        late = [
            it
            for it in self._late[group]
            if (e := entries.get(it[3])) is not None and e.stamp == it[2] and e.group == group
        ]
        heapq.heapify(late)
        self._late[group][:] = late

    def _pop(self, group: int) -> tuple[BlockHash, _RunEntry] | None:
        """Take the smallest block of a group out of the order (its stamp becomes -1)."""
        run, late = self._runs[group], self._late[group]
        entries = self.entries
        while late:
            top = late[0]
            e = entries.get(top[3])
            if e is not None and e.stamp == top[2]:
                break
            heapq.heappop(late)
        if late:
            top = late[0]
            if run:
                h0 = next(iter(run))
                e0 = run[h0]
                if e0.access < top[0] or (e0.access == top[0] and -e0.depth < top[1]):
                    del run[h0]
                    e0.stamp = _OUT
                    return h0, e0
            heapq.heappop(late)
            h = top[3]
            e = entries[h]
            e.stamp = _OUT
            return h, e
        if run:
            h, e = run.popitem(last=False)
            e.stamp = _OUT
            return h, e
        return None

    def _group(self, h: BlockHash) -> int:
        return 1 if self._counts and self.count_of(h) > 0 else 0

    # ---- operations -------------------------------------------------------------------------
    def insert(
        self, hashes: Iterable[BlockHash], tokens: int, t: float, first_depth: int
    ) -> list[Evicted]:
        chain = list(hashes)
        entries = self.entries
        new: list[tuple[BlockHash, int]] = []
        held: list[BlockHash] = []
        for i, h in enumerate(chain):
            if h in entries:
                held.append(h)
            else:
                new.append((h, first_depth + i))
        evicted: list[Evicted] = []
        need = self.used_tokens + tokens * len(new) - self.capacity_tokens
        if need > 0:
            self.pin(held)  # the chain's cached blocks are in use: not victims
            evicted = self.evict(need)
            self.unpin(held)
            room = (self.capacity_tokens - self.used_tokens) // tokens if tokens else len(new)
            del new[max(room, 0) :]  # the chain's leading new blocks, if space is short
        # Leaf first, then the cached blocks above them: at one time t that is key order,
        # so everything appends to its run.
        for h, depth in reversed(new):
            e = entries[h] = _RunEntry(tokens, t, depth, self._group(h))
            self._place(h, e)
        self.used_tokens += tokens * len(new)
        if held:
            self.touch(held, t)
        return evicted

    def touch(self, hashes: Iterable[BlockHash], t: float) -> None:
        entries = self.entries
        for h in reversed(list(hashes)):
            e = entries.get(h)
            if e is not None and t > e.access:
                e.access = t
                if e.stamp != _OUT:
                    self._unplace(h, e)
                    self._place(h, e)

    def _rerank_zeroed(self) -> None:
        zeroed, self._zeroed = self._zeroed, []
        entries = self.entries
        count_of = self.count_of
        for h in zeroed:
            e = entries.get(h)
            if e is not None and e.group == 1 and e.stamp != _OUT and count_of(h) == 0:
                self._unplace(h, e)
                e.group = 0
                self._place(h, e)

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        entries = self.entries
        for h in hashes:
            e = entries.get(h)
            if e is not None and e.pins > 0:
                e.pins -= 1
                if e.pins == 0 and e.stamp == _OUT:
                    e.group = self._group(h)
                    self._place(h, e)

    def remove(self, h: BlockHash) -> bool:
        e = self.entries.pop(h, None)
        if e is None:
            return False
        if e.stamp == 0:
            del self._runs[e.group][h]
        self.used_tokens -= e.tokens
        return True

    def clear(self) -> list[BlockHash]:
        gone = list(self.entries)
        self.entries.clear()
        for run in self._runs:
            run.clear()
        for late in self._late:
            late.clear()
        self._zeroed.clear()
        self.used_tokens = 0
        return gone

    def evict(self, need_tokens: int) -> list[Evicted]:
        """Free at least `need_tokens` tokens: zero-count blocks first, then counted ones,
        T_b then depth order within each; pinned blocks are skipped (and leave the order
        until unpinned)."""
        if self._zeroed:
            self._rerank_zeroed()
        out: list[Evicted] = []
        freed = 0
        entries = self.entries
        count_of = self.count_of
        counts = self._counts
        while freed < need_tokens:
            got = self._pop(0) or self._pop(1)
            if got is None:
                break
            h, e = got
            if e.pins:
                continue  # out of the order while pinned; `unpin` puts it back
            c = count_of(h)
            if counts and (c > 0) != (e.group == 1):
                e.group = 1 if c > 0 else 0  # a count rose (or fell while out): regroup
                self._place(h, e)
                continue
            del entries[h]
            self.used_tokens -= e.tokens
            freed += e.tokens
            out.append(Evicted(h, e.tokens, c, e.access))
        return out

    def check_invariants(self) -> None:
        super().check_invariants()
        seen = 0
        for g, run in enumerate(self._runs):
            prev: tuple[float, int] | None = None
            for h, e in run.items():
                if self.entries.get(h) is not e or e.stamp != 0 or e.group != g:
                    raise AssertionError(f"run {g}: block {h} misplaced")
                key = (e.access, -e.depth)
                if prev is not None and key <= prev:
                    raise AssertionError(f"run {g} out of order at block {h}: {key} <= {prev}")
                prev = key
            seen += len(run)
        live = {
            it[3]
            for late in self._late
            for it in late
            if (x := self.entries.get(it[3])) is not None and x.stamp == it[2]
        }
        seen += len(live)
        placed = sum(1 for e in self.entries.values() if e.stamp != _OUT)
        if seen != placed:
            raise AssertionError(f"{placed} blocks placed but {seen} found in runs and heaps")
