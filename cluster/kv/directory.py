"""Cluster-wide KV directory with branch counts (paper 000 §4.3, App. A.3; SPEC §4).

A prefix tree of KV blocks keyed by chained block hashes, as in Dynamo's KV indexer: each
block records its parent and, per node that holds it, the tiers (GPU, host), the last
access time and the branch count R_{b,n} (how many active branches reference the block on
that node; maintained by `BranchTable`). KV events (stored / removed / cleared, with tier)
keep it current. Entries that no node holds and no branch counts are dropped, so memory
tracks the cluster's cached KV, not its history.

Engines name blocks by their own hashes; events that carry token ids are re-keyed onto the
directory's chain (Dynamo does the same), and a per-node table maps engine hashes to
directory hashes for later removals. Simulated engines use directory hashes directly.

Holdings per node are assumed prefix-closed (radix caches evict leaves first), which lets
`longest_prefix` binary-search a request's path per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from cluster.core import BlockHash, KVEvent, KVEventKind, Tier
from cluster.kv.hashing import ROOT_HASH, chain

GPU = 1
HOST = 2
_TIER_BIT = {"gpu": GPU, "host": HOST}


def _held_prefix(n: int, held: Callable[[int], bool]) -> int:
    """Length of the held prefix of n blocks, given a prefix-closed test `held(i)`."""
    if n == 0 or not held(0):
        return 0
    if held(n - 1):
        return n
    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if held(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


class Holding:
    """One node's copy of one block."""

    __slots__ = ("access", "count", "tiers")

    def __init__(self, tiers: int, access: float) -> None:
        self.tiers = tiers
        self.access = access
        self.count = 0


class Block:
    """A directory entry: parent hash, number of tokens and the nodes holding it."""

    __slots__ = ("holders", "parent", "tokens")

    def __init__(self, parent: BlockHash, tokens: int) -> None:
        self.parent = parent
        self.tokens = tokens
        self.holders: dict[int, Holding] = {}


class PrefixMatch(NamedTuple):
    """Longest cached prefix of a path: blocks per node and cluster-wide."""

    per_node: dict[int, int]  # node -> leading blocks of the path it holds (any tier)
    cluster: int  # leading blocks held by some node (each block by any node)
    gpu_per_node: dict[int, int]  # node -> leading blocks it holds in GPU memory


CountListener = Callable[[int, BlockHash, int], None]  # (node, block, new count)
DropListener = Callable[[int, BlockHash, int], None]  # (node, block, count before drop)


class KVDirectory:
    """The cluster-wide prefix tree of KV blocks (see module docstring)."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens
        self.blocks: dict[BlockHash, Block] = {}
        # node -> engine block hash -> directory hash (only for re-keyed live events)
        self._engine_keys: dict[int, dict[BlockHash, BlockHash]] = {}
        self.count_listeners: list[CountListener] = []  # every change of R_{b,n}
        # Called once per update with the blocks whose R_{b,n} dropped to zero (their
        # eviction key fell: branch-aware caches must re-rank them).
        self.zero_listeners: list[Callable[[int, list[BlockHash]], None]] = []
        self.drop_listeners: list[DropListener] = []
        self.num_events = 0

    # ---- KV events -------------------------------------------------------------------
    def apply(self, event: KVEvent) -> None:
        """Apply one KV event (SGLang/vLLM BlockStored, BlockRemoved, AllBlocksCleared)."""
        self.num_events += 1
        if event.kind is KVEventKind.STORED:
            self._stored(event)
        elif event.kind is KVEventKind.REMOVED:
            keys = self._engine_keys.get(event.node_id)
            for h in event.block_hashes:
                if keys is not None:
                    h = keys.pop(h, h)
                self.remove(event.node_id, h, event.tier)
        elif event.kind is KVEventKind.CLEARED:
            self.clear_node(event.node_id, event.tier)
        else:  # pragma: no cover - enum is closed
            raise ValueError(f"unknown KV event kind {event.kind!r}")

    def apply_all(self, events: Iterable[KVEvent]) -> None:
        for e in events:
            self.apply(e)

    def _stored(self, event: KVEvent) -> None:
        tier = event.tier or "gpu"
        tokens = event.block_tokens or self.block_tokens
        parent = event.parent_hash if event.parent_hash is not None else ROOT_HASH
        if event.token_ids is None:
            self.store(event.node_id, event.block_hashes, parent, tier, event.t, tokens)
            return
        # Re-key onto the directory chain from the tokens the engine sent.
        keys = self._engine_keys.setdefault(event.node_id, {})
        dparent = keys.get(parent, parent) if parent != ROOT_HASH else ROOT_HASH
        ids = event.token_ids
        mine: list[BlockHash] = []
        for i, eh in enumerate(event.block_hashes):
            content = tuple(ids[i * tokens : (i + 1) * tokens])
            dparent = chain(dparent, content)
            keys[eh] = dparent
            mine.append(dparent)
        first_parent = keys.get(parent, parent) if parent != ROOT_HASH else ROOT_HASH
        self.store(event.node_id, mine, first_parent, tier, event.t, tokens)

    def store(
        self,
        node: int,
        hashes: Sequence[BlockHash],
        parent: BlockHash,
        tier: Tier,
        t: float,
        block_tokens: int | None = None,
    ) -> None:
        """Record that `node` holds the chain `hashes` (first one's parent `parent`) in `tier`."""
        bit = _TIER_BIT[tier]
        tokens = block_tokens or self.block_tokens
        blocks = self.blocks
        get = blocks.get
        for h in hashes:
            b = get(h)
            if b is None:
                b = blocks[h] = Block(parent, tokens)
                b.holders[node] = Holding(bit, t)
            else:
                b.parent = parent  # a count placeholder learns its parent when stored
                hold = b.holders.get(node)
                if hold is None:
                    b.holders[node] = Holding(bit, t)
                else:
                    hold.tiers |= bit
                    if t > hold.access:
                        hold.access = t
            parent = h

    def remove(self, node: int, h: BlockHash, tier: Tier | None) -> None:
        """`node` dropped block `h` from `tier` (None = every tier)."""
        b = self.blocks.get(h)
        if b is None:
            return
        hold = b.holders.get(node)
        if hold is None:
            return
        if not hold.tiers:
            return
        hold.tiers &= ~(_TIER_BIT[tier] if tier else GPU | HOST)
        if hold.tiers == 0:
            self._drop_holding(node, h, b, hold)

    def clear_node(self, node: int, tier: Tier | None = None) -> None:
        """`node` dropped every block of `tier` (None = all tiers)."""
        for h in [h for h, b in self.blocks.items() if node in b.holders and b.holders[node].tiers]:
            self.remove(node, h, tier)
        if tier is None:
            self._engine_keys.pop(node, None)

    def _drop_holding(self, node: int, h: BlockHash, b: Block, hold: Holding) -> None:
        """The node no longer holds the block in any tier.

        Branch references survive the loss of residency (the holding stays as a
        placeholder while R_{b,n} > 0): the branch still needs the block on that node, and
        its next prefill there re-stores it. Alg. E.2 instead zeroes R_{b,n} and re-adds
        the count at the next placement; both agree once the block is stored again, and
        keeping the reference avoids a reverse index from blocks to branches.
        """
        for listener in self.drop_listeners:
            listener(node, h, hold.count)
        if hold.count == 0:
            del b.holders[node]
            if not b.holders:
                del self.blocks[h]

    # ---- counts (driven by BranchTable) ----------------------------------------------
    def add_count(self, node: int, hashes: Iterable[BlockHash], delta: int, t: float) -> None:
        """R_{b,n} += delta for each block; blocks not (yet) held get a placeholder holding.

        A placement counts the blocks its prefill will add before they are stored
        (Alg. E.1 line 1), so counts may precede the KV event.
        """
        blocks = self.blocks
        listeners = self.count_listeners
        zeros: list[BlockHash] | None = [] if delta < 0 and self.zero_listeners else None
        get = blocks.get
        for h in hashes:
            b = get(h)
            if b is None:
                if delta < 0:
                    raise AssertionError(f"count release of unknown block {h} on node {node}")
                b = blocks[h] = Block(ROOT_HASH, self.block_tokens)
            holders = b.holders
            hold = holders.get(node)
            if hold is None:
                if delta < 0:
                    raise AssertionError(f"count release of block {h} not on node {node}")
                hold = holders[node] = Holding(0, t)
            before = hold.count
            hold.count = after = before + delta
            if after < 0:
                raise AssertionError(f"negative count for block {h} on node {node}")
            if listeners:
                for listener in listeners:
                    listener(node, h, after)
            if after == 0:
                if hold.tiers == 0:
                    del holders[node]
                    if not holders:
                        del blocks[h]
                elif zeros is not None:
                    zeros.append(h)
        if zeros:
            for zl in self.zero_listeners:
                zl(node, zeros)

    def count(self, node: int, h: BlockHash) -> int:
        b = self.blocks.get(h)
        if b is None:
            return 0
        hold = b.holders.get(node)
        return 0 if hold is None else hold.count

    def touch(self, node: int, hashes: Iterable[BlockHash], t: float) -> None:
        """Update last access of the blocks `node` holds."""
        for h in hashes:
            b = self.blocks.get(h)
            if b is not None:
                hold = b.holders.get(node)
                if hold is not None and t > hold.access:
                    hold.access = t

    # ---- queries -------------------------------------------------------------------
    def holds(self, node: int, h: BlockHash, tier: Tier | None = None) -> bool:
        b = self.blocks.get(h)
        if b is None:
            return False
        hold = b.holders.get(node)
        if hold is None:
            return False
        return bool(hold.tiers & (_TIER_BIT[tier] if tier else GPU | HOST))

    def _prefix_len(self, path: Sequence[BlockHash], node: int, mask: int) -> int:
        """Leading blocks of `path` that `node` holds in `mask` tiers (binary search)."""
        blocks = self.blocks

        def held(i: int) -> bool:
            b = blocks.get(path[i])
            if b is None:
                return False
            hold = b.holders.get(node)
            return hold is not None and bool(hold.tiers & mask)

        return _held_prefix(len(path), held)

    def prefix_lengths(
        self, path: Sequence[BlockHash], nodes: Iterable[int], mask: int = GPU | HOST
    ) -> dict[int, int]:
        """Leading blocks of `path` each node holds in `mask` tiers.

        One binary search for all nodes at once: probing block `mid` splits the candidate
        nodes into those holding it (prefix > mid) and the rest (prefix <= mid), so a probe
        costs one directory lookup however many nodes it decides.
        """
        out: dict[int, int] = {}
        blocks = self.blocks
        stack: list[tuple[int, int, list[int]]] = [(0, len(path), list(nodes))]
        while stack:
            lo, hi, ns = stack.pop()
            if lo >= hi:
                for n in ns:
                    out[n] = lo
                continue
            mid = (lo + hi) // 2
            b = blocks.get(path[mid])
            if b is None:
                stack.append((lo, mid, ns))
                continue
            holders = b.holders
            yes: list[int] = []
            no: list[int] = []
            for n in ns:
                hd = holders.get(n)
                (yes if hd is not None and hd.tiers & mask else no).append(n)
            if yes:
                stack.append((mid + 1, hi, yes))
            if no:
                stack.append((lo, mid, no))
        return out

    def longest_prefix(
        self, path: Sequence[BlockHash], nodes: Iterable[int], with_gpu: bool = True
    ) -> PrefixMatch:
        """Longest cached prefix of `path` on each of `nodes` and anywhere in the cluster."""
        nodes = list(nodes)
        per_node = self.prefix_lengths(path, nodes)
        gpu: dict[int, int] = {}
        if with_gpu:
            for n in nodes:
                k = per_node[n]
                gpu[n] = self._prefix_len(path[:k], n, GPU) if k else 0
        return PrefixMatch(per_node, self.cluster_prefix(path), gpu)

    def cluster_prefix(self, path: Sequence[BlockHash]) -> int:
        """Leading blocks of `path` that some node holds (any tier)."""
        blocks = self.blocks

        def held(i: int) -> bool:
            b = blocks.get(path[i])
            return b is not None and any(h.tiers for h in b.holders.values())

        return _held_prefix(len(path), held)

    def holders_of(self, h: BlockHash) -> dict[int, int]:
        """node -> tier bits (1 = GPU, 2 = host) of the nodes holding block `h`."""
        b = self.blocks.get(h)
        return {} if b is None else {n: hd.tiers for n, hd in b.holders.items() if hd.tiers}

    def node_blocks(self, node: int) -> int:
        return sum(1 for b in self.blocks.values() if node in b.holders and b.holders[node].tiers)

    def node_counts(self, node: int) -> dict[BlockHash, int]:
        """R_{b,n} of every block with a nonzero count on `node` (held or placed)."""
        out = {}
        for h, b in self.blocks.items():
            hold = b.holders.get(node)
            if hold is not None and hold.count:
                out[h] = hold.count
        return out

    def stats(self) -> dict[str, float]:
        holdings = sum(len(b.holders) for b in self.blocks.values())
        counted = sum(1 for b in self.blocks.values() for hd in b.holders.values() if hd.count)
        return {
            "blocks": float(len(self.blocks)),
            "holdings": float(holdings),
            "counted_holdings": float(counted),
            "events": float(self.num_events),
        }

    def check_invariants(self) -> None:
        """Counts nonnegative; no empty entries; no holding without tiers and counts."""
        for h, b in self.blocks.items():
            if not b.holders:
                raise AssertionError(f"block {h} has no holders but was kept")
            for n, hd in b.holders.items():
                if hd.count < 0:
                    raise AssertionError(f"block {h} node {n}: negative count {hd.count}")
                if hd.tiers == 0 and hd.count == 0:
                    raise AssertionError(f"block {h} node {n}: empty holding kept")
