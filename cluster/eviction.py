"""KV eviction policies and a capacity-bounded tier cache (paper 000 §5.3, Alg. E.2 l.16–21).

Policies order blocks by a key, evicting the smallest first:
- branch-aware: (1[R_b > 0], T_b) - blocks no active branch references go first, LRU within
  each group (Evolving Infra's host-memory eviction);
- lru: (T_b,) - the baseline of HiCache / SGLang / Dynamo.
Ties break toward deeper blocks, so a node evicts leaves before their parents and its
holdings stay prefix-closed (a radix cache never keeps a child without its parent).

`TierCache` is one node's L1 (GPU) or L2 (host) with a token capacity. It keeps a lazily
invalidated heap of keys; count changes re-key a block when its group flips. Every eviction
reports the block's branch count and last access (the `evictions` table). It serves any
`EvictionPolicy`; the simulator's GPU tier uses `LRUTierCache` (exact LRU in an
OrderedDict) and its host tier `RecencyTierCache` (the built-in policies' exact order in
recency runs, which keeps about a fifth less memory than the heap at 96 nodes).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from cluster.core import BlockHash, Registry, Tier


class EvictionPolicy(Protocol):
    """Orders blocks for eviction; does not modify any state."""

    name: str
    uses_counts: bool

    def key(self, count: int, last_access: float) -> tuple[float, ...]:
        """Smaller keys are evicted first."""
        ...


class BranchAwareEviction:
    name = "branch"
    uses_counts = True

    def key(self, count: int, last_access: float) -> tuple[float, ...]:
        return (1.0 if count > 0 else 0.0, last_access)


class LRUEviction:
    name = "lru"
    uses_counts = False

    def key(self, count: int, last_access: float) -> tuple[float, ...]:
        return (last_access,)


EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy")
EVICTION_POLICIES.register("branch")(BranchAwareEviction)
EVICTION_POLICIES.register("lru")(LRUEviction)


class Evicted(NamedTuple):
    block_hash: BlockHash
    tokens: int
    branch_count: int
    last_access: float


class _Entry:
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
        self.entries: dict[BlockHash, _Entry] = {}
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

    def _key(self, h: BlockHash, e: _Entry, count: int | None = None) -> tuple[object, ...]:
        if count is None:
            count = self.count_of(h) if self.policy.uses_counts else 0
        return (*self.policy.key(count, e.access), -e.depth)

    def _push(self, h: BlockHash, e: _Entry, count: int | None = None) -> None:
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

        Blocks already present are touched. Returns what was evicted to make room; blocks
        that cannot fit (everything else pinned) are not inserted.
        """
        evicted: list[Evicted] = []
        depth = first_depth
        entries = self.entries
        for h in hashes:
            e = entries.get(h)
            if e is not None:
                if t > e.access:
                    e.access = t
            else:
                if self.used_tokens + tokens > self.capacity_tokens:
                    evicted.extend(self.evict(self.used_tokens + tokens - self.capacity_tokens))
                    if self.used_tokens + tokens > self.capacity_tokens:
                        break  # everything left is pinned
                e = entries[h] = _Entry(tokens, t, depth)
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
    """

    def __init__(
        self,
        node: int,
        tier: Tier,
        capacity_tokens: int,
        count_of: Callable[[BlockHash], int] | None = None,
    ) -> None:
        super().__init__(node, tier, capacity_tokens, LRUEviction(), count_of)
        self.entries: OrderedDict[BlockHash, _Entry] = OrderedDict()

    def _push(self, h: BlockHash, e: _Entry, count: int | None = None) -> None:
        return None  # recency order lives in `entries`

    def insert(
        self, hashes: Iterable[BlockHash], tokens: int, t: float, first_depth: int
    ) -> list[Evicted]:
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
        room = (self.capacity_tokens - self.used_tokens) // tokens if tokens else len(new)
        admitted = set(new[: max(room, 0)])  # the chain's leading new blocks, if space is short
        depth = first_depth + len(chain) - 1
        for h in reversed(chain):
            e = entries.get(h)
            if e is not None:
                if t > e.access:
                    e.access = t
                entries.move_to_end(h)
            elif h in admitted:
                entries[h] = _Entry(tokens, t, depth)
                self.used_tokens += tokens
            depth -= 1
        return evicted

    def touch(self, hashes: Iterable[BlockHash], t: float) -> None:
        entries = self.entries
        for h in reversed(list(hashes)):
            e = entries.get(h)
            if e is not None:
                if t > e.access:
                    e.access = t
                entries.move_to_end(h)

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        for h in hashes:
            e = self.entries.get(h)
            if e is not None and e.pins > 0:
                e.pins -= 1

    def clear(self) -> list[BlockHash]:
        gone = list(self.entries)
        self.entries.clear()
        self.used_tokens = 0
        return gone

    def evict(self, need_tokens: int) -> list[Evicted]:
        out: list[Evicted] = []
        freed = 0
        entries = self.entries
        pinned: list[BlockHash] = []
        while freed < need_tokens and entries:
            h, e = entries.popitem(last=False)
            if e.pins:
                pinned.append(h)
                entries[h] = e  # pinned: keep it, after the others
                if len(pinned) > len(entries):
                    break
                continue
            self.used_tokens -= e.tokens
            freed += e.tokens
            out.append(Evicted(h, e.tokens, self.count_of(h), e.access))
        return out


class _RunEntry(_Entry):
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
