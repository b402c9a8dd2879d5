"""A simulated node's KV memory behind one protocol: tiered (GPU + host) or one unified pool.

Paper 000 §4.1-4.2: a node keeps GPU KV (L1, LRU) and host KV (L2, written through,
evicted by the configured policy, §5.3); the host tiers form the shared pool peers fetch
from (`tiered_memory.TieredMemory`). With a retention policy (paper 003 §3.4) both tiers
are `RetentionCache`s keyed by (1[t<d], v). Without a host tier
(`unified_memory.UnifiedMemory`, paper 003's single-engine memory-pressure regime) L1 is
the node's whole KV pool: running calls pin their blocks and reserve their other tokens in
it, and a decode step that cannot get memory preempts a call. This module holds the
`NodeMemory` protocol, the part both share (`KVMemory`) and the cache factories. Every
block stored or removed is published as `cluster.core.KVEvent`s in batches (one per store,
one per eviction batch), the entry live engines feed the control plane through; the same
events make the `kv_events` rows. Evictions are also logged, a batch of rows per eviction
batch (`evictions`).
Everything that differs between the two kinds of memory stays behind the protocol, so the
engine above never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from cluster.core import BlockHash, KVEvent, KVEventKind, Phase, Tier
from cluster.kv.eviction import Evicted, EvictionPolicy
from cluster.kv.hashing import prefix_in
from cluster.kv.recency_cache import RecencyTierCache
from cluster.kv.retention_cache import RetentionCache
from cluster.kv.span_cache import SpanTierCache
from cluster.kv.tier_cache import LRUTierCache, TierCache
from cluster.policies.retention import RetentionDecision
from cluster.sim.buffer import BufferedSink
from cluster.sim.entities import SimRequest

Publish = Callable[[list[KVEvent]], None]
_STORED, _REMOVED, _CLEARED = KVEventKind.STORED, KVEventKind.REMOVED, KVEventKind.CLEARED


class NodeMemory(Protocol):
    """What the engine, the policy planes and the switch logic ask of one node's KV."""

    node_id: int
    l1: TierCache  # GPU memory (the whole KV pool when unified)
    l2: TierCache  # host memory (`l1` itself when unified)
    unified: bool
    cleared_at: float  # when the node's KV last became unreachable (-1: never)

    def host_prefix(self, path: Sequence[BlockHash]) -> int:
        """Leading blocks of `path` the node holds (host memory holds every GPU block)."""
        ...

    def cached_prefix(self, path: Sequence[BlockHash]) -> tuple[int, int]:
        """(leading blocks held in any tier, leading blocks held in GPU memory)."""
        ...

    def touch(self, path: Sequence[BlockHash], local: int, gpu: int, t: float) -> None:
        """A prefill reuses path[:local] (path[:gpu] from GPU memory)."""
        ...

    def store(
        self, path: Sequence[BlockHash], host_from: int, gpu_from: int | None, t: float
    ) -> None:
        """Write path[host_from:] to host memory and path[gpu_from:] to GPU memory (None:
        host only); the blocks before the start indices are already held."""
        ...

    def fetch(self, blocks: Sequence[BlockHash], t: float) -> None:
        """Blocks fetched from peers' host memory arrive in both tiers."""
        ...

    def receive(self, path: Sequence[BlockHash], t: float) -> None:
        """A decode node received a request's KV (written through to its host memory)."""
        ...

    def prefilled(self, req: SimRequest, start: int, t: float) -> None:
        """Prefill ended: the context's blocks from `start` on enter the cache."""
        ...

    def clear(self, t: float) -> None:
        """The node's KV becomes unreachable (relaunch, stranded switch)."""
        ...

    def drop_gpu_cache(self, t: float) -> None:
        """The node turns to decode: GPU memory now holds running requests' KV only."""
        ...

    def on_counts_zeroed(self, hashes: list[BlockHash]) -> None: ...

    def retain(
        self, path: Sequence[BlockHash], owner: int, decision: RetentionDecision, now: float
    ) -> None:
        """Apply a Retention Plane decision to the owner's blocks of `path`."""
        ...

    # ---- running calls -----------------------------------------------------------------
    def fits(self, req: SimRequest, busy: bool) -> bool:
        """Could the call's prefill get memory now (`busy`: some call here holds KV)?"""
        ...

    def admit(self, req: SimRequest, busy: bool, t: float) -> bool:
        """Give the call's prefill its memory; False if it does not fit."""
        ...

    def admit_decode(
        self, joiners: list[SimRequest], running: int, max_batch: int
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        """(joiners that enter the decode batch, joiners that keep waiting)."""
        ...

    def preemption_victim(self, batch: list[SimRequest]) -> SimRequest | None:
        """A running call to preempt before the next decode epoch, or None."""
        ...

    def reserve_epoch(self, batch: list[SimRequest], k: int, t: float) -> int:
        """Memory for up to k decode iterations of `batch`; returns the iterations to run."""
        ...

    def settle_epoch(self, batch: list[SimRequest], iterations: int, t: float) -> None:
        """The epoch ran `iterations`: its tokens now belong to the calls."""
        ...

    def release(self, req: SimRequest) -> None:
        """The call gives its memory back (preempted)."""
        ...

    def end_call(self, req: SimRequest, decoded: bool, t: float) -> None:
        """The call completed (`decoded`: it ran in this node's decode batch)."""
        ...

    def hand_off(self, req: SimRequest, t: float) -> None:
        """The call prefilled here has moved to its decode node (PD: its KV was sent, or it
        has no decode): what this node holds for it as a running call is let go (its
        blocks stay cached)."""
        ...

    # ---- figures -----------------------------------------------------------------------
    def report(self, phase: Phase) -> tuple[int, int, int, int]:
        """(GPU used, GPU capacity, host used, host capacity) for the node's report."""
        ...

    def signal_kv(self, phase: Phase) -> tuple[float, float]:
        """(KV-pool utilization, host utilization) in the planes' signals s(t)."""
        ...

    def signal_tokens(self) -> int:
        """KV tokens running calls hold (the signals of a node a decision concerns)."""
        ...

    def status(self) -> tuple[int, int, int, int]:
        """(GPU used, GPU capacity, host used, host capacity) for a live view."""
        ...


def _scan_prefix(path: Sequence[BlockHash], held: dict[BlockHash, Any]) -> int:
    """Leading blocks of `path` in `held`, without assuming prefix-closed holdings."""
    k = 0
    for h in path:
        if h not in held:
            break
        k += 1
    return k


def stored_runs(
    path: Sequence[BlockHash], start: int, new: list[BlockHash]
) -> list[tuple[BlockHash | None, tuple[BlockHash, ...]]]:
    """`new` (blocks of path[start:] in path order) as runs of consecutive path blocks, each
    with the block before it as its parent: the chains of stored events engines send. Blocks
    the cache already held split a store (a stored row's parent is its block's parent)."""
    if not new:
        return []
    i = path.index(new[0], start)
    n = len(new)
    if list(path[i : i + n]) == new:  # one run: the common case
        return [(path[i - 1] if i else None, tuple(new))]
    fresh = set(new)
    runs: list[tuple[BlockHash | None, tuple[BlockHash, ...]]] = []
    run: list[BlockHash] = []
    parent: BlockHash | None = None
    for j in range(i, len(path)):
        h = path[j]
        if h in fresh:
            if not run:
                parent = path[j - 1] if j else None
            run.append(h)
        elif run:
            runs.append((parent, tuple(run)))
            run = []
    if run:
        runs.append((parent, tuple(run)))
    return runs


def kv_event_rows(events: Iterable[KVEvent]) -> dict[str, list[Any]]:
    """Columns of the `kv_events` table (SPEC §3) for the events: one row per block;
    stored rows chain `parent_hash` from the event's parent; a clear of every tier is one
    row per tier with a NULL hash (as live engines' events are logged)."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("t", "node_id", "tier", "kind", "block_hash", "parent_hash", "num_tokens")
    }
    for ev in events:
        if ev.kind is _CLEARED:
            tiers: tuple[str, ...] = (ev.tier,) if ev.tier else ("gpu", "host")
            n = len(tiers)
            hashes: list[Any] = [None] * n
            parents: list[Any] = [None] * n
            tokens = [0] * n
        else:
            hashes = list(ev.block_hashes)
            n = len(hashes)
            tiers = (ev.tier or "gpu",) * n
            tokens = [ev.block_tokens] * n
            parents = [ev.parent_hash, *hashes[:-1]] if ev.kind is _STORED else [None] * n
        cols["t"].extend([ev.t] * n)
        cols["node_id"].extend([ev.node_id] * n)
        cols["tier"].extend(tiers)
        cols["kind"].extend([ev.kind.value] * n)
        cols["block_hash"].extend(hashes)
        cols["parent_hash"].extend(parents)
        cols["num_tokens"].extend(tokens)
    return cols


def tier_caches(
    node_id: int,
    l1_tokens: int,
    l2_tokens: int,
    policy: EvictionPolicy,
    count_of: Callable[[BlockHash], int],
) -> tuple[TierCache, TierCache]:
    """GPU (exact LRU) and host caches of a node without retention decisions. The built-in
    policies get their exact order per span of blocks on the host tier; a user's policy the
    heap."""
    host = SpanTierCache if RecencyTierCache.orders(policy) else TierCache
    return (
        LRUTierCache(node_id, "gpu", l1_tokens, count_of),
        host(node_id, "host", l2_tokens, policy, count_of),
    )


def retention_caches(
    node_id: int,
    l1_tokens: int,
    l2_tokens: int | None,
    name: str,
    clock: Callable[[], float],
    count_of: Callable[[BlockHash], int],
    on_owner_evicted: Callable[[int, BlockHash], None],
) -> tuple[RetentionCache, RetentionCache]:
    """Tiers keyed by the Retention Plane; one GPU pool when there is no host tier
    (`l2_tokens` None): then both members are that pool."""

    def make(tier: Tier, cap: int) -> RetentionCache:
        c = RetentionCache(node_id, tier, cap, name, clock, count_of)
        c.on_owner_evicted = on_owner_evicted
        return c

    gpu = make("gpu", l1_tokens)
    return (gpu, gpu) if l2_tokens is None else (gpu, make("host", l2_tokens))


class KVMemory:
    """What both kinds share: the caches, prefixes, eviction logging and KV event
    publication. Subclasses implement the rest of `NodeMemory`."""

    def __init__(
        self,
        node_id: int,
        l1: TierCache,
        l2: TierCache,
        block_tokens: int,
        out: BufferedSink,
        publish: Publish,
        exact_prefix: bool,
    ) -> None:
        self.node_id = node_id
        self.l1 = l1
        self.l2 = l2
        self.unified = l1 is l2
        self.bt = block_tokens
        self.out = out
        self.publish = publish
        # Retention decisions can leave a block cached without its parent, so the planes
        # read prefixes with a scan instead of the binary search that assumes closure.
        self._prefix: Callable[[Sequence[BlockHash], Any], int] = (
            _scan_prefix if exact_prefix else prefix_in
        )
        self.cleared_at = -1.0

    def host_prefix(self, path: Sequence[BlockHash]) -> int:
        return self._prefix(path, self.l2.entries)

    def clear(self, t: float) -> None:
        self.l1.clear()
        self.l2.clear()
        self.cleared_at = t
        self.publish([KVEvent(t, self.node_id, _CLEARED, None)])

    def on_counts_zeroed(self, hashes: list[BlockHash]) -> None:
        self.l2.on_counts_zeroed(hashes)

    def touch(self, path: Sequence[BlockHash], local: int, gpu: int, t: float) -> None:
        self.l2.touch(path[:local], t)
        self.l1.touch(path[:gpu], t)

    def drop_gpu_cache(self, t: float) -> None:
        if self.l1.entries:  # its host copies stay in the pool
            gone = self.l1.clear()
            self.publish([KVEvent(t, self.node_id, _REMOVED, "gpu", tuple(gone), None, self.bt)])

    def _retain_in(
        self,
        cache: TierCache,
        tier: Tier,
        path: Sequence[BlockHash],
        owner: int,
        dec: RetentionDecision,
        now: float,
    ) -> None:
        assert isinstance(cache, RetentionCache), "retention decisions need retention tiers"
        if dec.kind == "protect":
            assert dec.until is not None
            cache.protect(path, owner, dec.until, dec.value)
        elif dec.kind == "release":
            cache.release(path, owner)
        else:
            evicted = cache.discard(path, owner)
            if evicted:
                self._evicted(tier, evicted, now)

    def _insert(
        self,
        cache: TierCache,
        tier: Tier,
        path: Sequence[BlockHash],
        start: int,
        t: float,
        events: list[KVEvent],
    ) -> None:
        """Insert path[start:] into `cache`; add its KV events (the removals it caused, then
        the blocks it newly holds) to `events`."""
        hashes = path[start:]
        entries = cache.entries
        new = [h for h in hashes if h not in entries]
        evicted = cache.insert(hashes, self.bt, t, start)
        if evicted:
            gone = set(self._removals(tier, evicted, t, events))
            if not gone.isdisjoint(hashes):
                # The chain reclaimed some of its own blocks on the way in (the rest of the
                # cache ranked higher): a new block reclaimed is not held, a block held
                # before but reclaimed and inserted again is new again.
                fresh = set(new)
                new = [h for h in hashes if h in entries and (h in fresh or h in gone)]
        if new and new[-1] not in entries:  # no room for all (pinned blocks)
            new = [h for h in new if h in entries]
        for parent, run in stored_runs(path, start, new):
            events.append(KVEvent(t, self.node_id, _STORED, tier, run, parent, self.bt))

    def _removals(
        self, tier: Tier, evicted: list[Evicted], t: float, events: list[KVEvent]
    ) -> list[BlockHash]:
        """Log the evicted blocks and add their removal to `events`; returns their hashes."""
        node = self.node_id
        hashes = [ev[0] for ev in evicted]
        if evicted and self.out.wants("evictions"):  # a batch of rows, not one per block
            n = len(evicted)
            cache = self.l2 if tier == "host" else self.l1
            columns: dict[str, Sequence[object]] = {
                "t": [t] * n,
                "node_id": [node] * n,
                "tier": [tier] * n,
                "block_hash": hashes,
                "branch_count": [ev[2] for ev in evicted],
                "last_access": [ev[3] for ev in evicted],
                "policy": [cache.policy.name] * n,
            }
            self.out.emit("evictions", columns)
        if tier == "host":
            # Keep L1 within L2: a block leaving host memory leaves the node.
            remove = self.l1.remove
            gone = [h for h in hashes if remove(h)]
            if gone:
                events.append(KVEvent(t, node, _REMOVED, "gpu", tuple(gone), None, self.bt))
        events.append(KVEvent(t, node, _REMOVED, tier, tuple(hashes), None, self.bt))
        return hashes

    def _evicted(self, tier: Tier, evicted: list[Evicted], t: float) -> None:
        """Blocks reclaimed outside a store (reservations, retention decisions)."""
        events: list[KVEvent] = []
        self._removals(tier, evicted, t, events)
        self.publish(events)
