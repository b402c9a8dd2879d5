"""Cluster-wide KV directory with branch counts (paper 000 §4.3, App. A.3; SPEC §4).

A prefix tree of KV blocks keyed by chained block hashes, as in Dynamo's KV indexer (a
block's hash names its parent's, so the tree needs no parent links): per node, which
blocks it holds in which tiers (GPU, host), and the branch counts R_{b,n} (how many active
branches reference the block on that node; maintained by `BranchTable`). KV events
(stored / removed / cleared, with tier) keep it current. Both are per-node tables of
plain ints (block -> tier bits, block -> count), holding only nonzero values: a block no
node holds and no branch counts takes no memory, and a count that precedes its block's
KV event (or outlives it) is one table entry. Memory tracks the cluster's cached KV, not
its history.

Engines name blocks by their own hashes; events that carry token ids are re-keyed onto the
directory's chain (Dynamo does the same), and a per-node table maps engine hashes to
directory hashes for later removals. Simulated engines use directory hashes directly.

Holdings per node are assumed prefix-closed (radix caches evict leaves first), which lets
`longest_prefix` binary-search a request's path for all candidate nodes at once; a
per-block bitmask of the nodes holding it splits the candidates with one AND per probe.
"""

from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from cluster.core import BlockHash, KVEvent, KVEventKind, Tier
from cluster.kv.counts import CountListener, Counts, add_each, increment, release
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


class PrefixMatch(NamedTuple):
    """Longest cached prefix of a path: blocks per node and cluster-wide."""

    per_node: dict[int, int]  # node -> leading blocks of the path it holds (any tier)
    cluster: int  # leading blocks held by some node (each block by any node)
    gpu_per_node: dict[int, int]  # node -> leading blocks it holds in GPU memory


# (node, blocks, their new counts in the same order): one call per count update of a path
CountBatchListener = Callable[[int, list[BlockHash], list[int]], None]
DropListener = Callable[[int, BlockHash, int], None]  # (node, block, count before drop)


class KVDirectory:
    """The cluster-wide prefix tree of KV blocks (see module docstring)."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens
        # node -> block -> tier bits (GPU | HOST) of the blocks it holds (bits never 0)
        self._tiers: dict[int, dict[BlockHash, int]] = {}
        # node -> block -> R_{b,n} of the blocks with a nonzero count there
        self._counts: dict[int, Counts] = {}
        # block -> bitmask of the nodes holding it in some tier (blocks no node holds:
        # absent); a node's bit is `_node_bit[node]`, given on its first store. The router's
        # prefix search splits candidate sets with one AND per probe instead of a lookup in
        # each candidate node's table.
        self._held: dict[BlockHash, int] = {}
        self._node_bit: dict[int, int] = {}
        self._bit_node: list[int] = []  # bit position -> node
        # node -> engine block hash -> directory hash (only for re-keyed live events)
        self._engine_keys: dict[int, dict[BlockHash, BlockHash]] = {}
        self.count_listeners: list[CountListener] = []  # every change of R_{b,n}
        # The same changes a path at a time (telemetry's branch_counts rows as one batch):
        # the same blocks and counts, in the same order, as `count_listeners` sees them.
        self.count_batch_listeners: list[CountBatchListener] = []
        # Called once per update with the blocks whose R_{b,n} dropped to zero (their
        # eviction key fell: branch-aware caches must re-rank them).
        self.zero_listeners: list[Callable[[int, list[BlockHash]], None]] = []
        self.drop_listeners: list[DropListener] = []
        self.num_events = 0

    def _node_tiers(self, node: int) -> dict[BlockHash, int]:
        d = self._tiers.get(node)
        if d is None:
            d = self._tiers[node] = {}
        return d

    def _bit(self, node: int) -> int:
        b = self._node_bit.get(node)
        if b is None:
            b = self._node_bit[node] = 1 << len(self._bit_node)
            self._bit_node.append(node)
        return b

    def counts_of(self, node: int) -> Counts:
        """The node's live count table (block -> R_{b,n}; `table[h]` is 0 when absent):
        its `__getitem__` is the caches' `count_of`. Read it, never write it."""
        c = self._counts.get(node)
        if c is None:
            c = self._counts[node] = Counts()
        return c

    # ---- KV events -------------------------------------------------------------------
    def apply(self, event: KVEvent) -> None:
        """Apply one KV event (SGLang/vLLM BlockStored, BlockRemoved, AllBlocksCleared)."""
        self.num_events += 1
        if event.kind is KVEventKind.STORED:
            self._stored(event)
        elif event.kind is KVEventKind.REMOVED:
            keys = self._engine_keys.get(event.node_id)
            if keys is None:
                self.remove_all(event.node_id, event.block_hashes, event.tier)
                return
            for h in event.block_hashes:
                self.remove(event.node_id, keys.pop(h, h), event.tier)
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
        """Record that `node` holds the chain `hashes` (first one's parent `parent`) in `tier`.

        The chain is implied by the chained hashes, so neither the parent nor the time is
        kept (nothing reads them: the caches keep each block's last access)."""
        bit = _TIER_BIT[tier]
        tiers = self._node_tiers(node)
        new = [h for h in hashes if h not in tiers]
        if len(new) < len(hashes):  # some held already (in the other tier, or re-stored)
            for h in hashes:
                bits = tiers.get(h)
                if bits is not None and not bits & bit:
                    tiers[h] = bits | bit
        if new:
            fresh = dict.fromkeys(new, bit)  # in order, as one by one (a repeat once)
            tiers.update(fresh)
            held = self._held
            nb = self._bit(node)
            get = held.get
            for h in fresh:
                m = get(h)
                held[h] = nb if m is None else m | nb

    def remove(self, node: int, h: BlockHash, tier: Tier | None) -> None:
        """`node` dropped block `h` from `tier` (None = every tier)."""
        tiers = self._tiers.get(node)
        if not tiers:
            return
        bits = tiers.get(h)
        if bits is None:
            return
        bits &= ~(_TIER_BIT[tier] if tier else GPU | HOST)
        if bits:
            tiers[h] = bits
        else:
            del tiers[h]
            self._unheld(node, h)
            if self.drop_listeners:
                self._dropped(node, h)

    def remove_all(self, node: int, hashes: Iterable[BlockHash], tier: Tier | None) -> None:
        """`remove` of each block of `hashes`, in order."""
        tiers = self._tiers.get(node)
        if not tiers:
            return
        keep = ~(_TIER_BIT[tier] if tier else GPU | HOST)
        get = tiers.get
        held = self._held
        nb = self._node_bit[node]  # a node with a table has stored, so has its bit
        drops = self.drop_listeners
        for h in hashes:
            bits = get(h)
            if bits is None:
                continue
            bits &= keep
            if bits:
                tiers[h] = bits
            else:
                del tiers[h]
                m = held[h] ^ nb
                if m:
                    held[h] = m
                else:
                    del held[h]
                if drops:
                    self._dropped(node, h)

    def clear_node(self, node: int, tier: Tier | None = None) -> None:
        """`node` dropped every block of `tier` (None = all tiers), in the order it stored
        them first."""
        tiers = self._tiers.get(node)
        if tiers:
            self.remove_all(node, list(tiers), tier)
        if tier is None:
            self._engine_keys.pop(node, None)

    def _unheld(self, node: int, h: BlockHash) -> None:
        m = self._held[h] ^ self._node_bit[node]
        if m:
            self._held[h] = m
        else:
            del self._held[h]

    def _dropped(self, node: int, h: BlockHash) -> None:
        """The node no longer holds the block in any tier.

        Branch references survive the loss of residency (the count stays while
        R_{b,n} > 0): the branch still needs the block on that node, and its next prefill
        there re-stores it. Alg. E.2 instead zeroes R_{b,n} and re-adds the count at the
        next placement; both agree once the block is stored again, and keeping the
        reference avoids a reverse index from blocks to branches.
        """
        c = self._counts.get(node)
        count = c.get(h, 0) if c is not None else 0
        for listener in self.drop_listeners:
            listener(node, h, count)

    # ---- counts (driven by BranchTable) ----------------------------------------------
    def add_count(self, node: int, hashes: Iterable[BlockHash], delta: int, t: float) -> None:
        """R_{b,n} += delta for each block; blocks not (yet) held are counted all the same.

        A placement counts the blocks its prefill will add before they are stored
        (Alg. E.1 line 1), so counts may precede the KV event.
        """
        counts = self.counts_of(node)
        batch = self.count_batch_listeners
        if self.count_listeners or delta not in (1, -1):
            blocks, afters, zero = add_each(node, counts, hashes, delta, self.count_listeners)
        elif delta == 1:
            if not batch:
                _count_elements(counts, hashes)  # counts[h] = counts.get(h, 0) + 1, in C
                return
            blocks = hashes if isinstance(hashes, list) else list(hashes)
            afters = increment(counts, blocks)
            zero = []
        else:
            blocks, afters, zero = release(node, counts, hashes, bool(batch))
        for bl in batch:
            bl(node, blocks, afters)
        if zero and self.zero_listeners:
            tiers = self._tiers.get(node)
            zeros = [h for h in zero if h in tiers] if tiers else None
            if zeros:
                for zl in self.zero_listeners:
                    zl(node, zeros)

    def count(self, node: int, h: BlockHash) -> int:
        c = self._counts.get(node)
        return 0 if c is None else c.get(h, 0)

    def touch(self, node: int, hashes: Iterable[BlockHash], t: float) -> None:
        """A use of the blocks `node` holds: nothing to record (see `store`)."""
        return None

    # ---- queries -------------------------------------------------------------------
    def holds(self, node: int, h: BlockHash, tier: Tier | None = None) -> bool:
        tiers = self._tiers.get(node)
        if not tiers:
            return False
        return bool(tiers.get(h, 0) & (_TIER_BIT[tier] if tier else GPU | HOST))

    def _prefix_len(self, path: Sequence[BlockHash], node: int, mask: int) -> int:
        """Leading blocks of `path` that `node` holds in `mask` tiers (binary search)."""
        get = (self._tiers.get(node) or {}).get
        return _held_prefix(len(path), lambda i: bool(get(path[i], 0) & mask))

    def prefix_lengths(
        self, path: Sequence[BlockHash], nodes: Iterable[int], mask: int = GPU | HOST
    ) -> dict[int, int]:
        """Leading blocks of `path` each node holds in `mask` tiers.

        One binary search for all nodes at once: probing block `mid` splits the candidate
        nodes into those holding it (prefix > mid) and the rest (prefix <= mid) — for any
        tier, one AND of the candidates' bitmask with the block's holders.
        """
        nodes = list(nodes)
        if mask != GPU | HOST:
            return {n: self._prefix_len(path, n, mask) for n in nodes}
        node_bit = self._node_bit
        cand = 0
        for n in nodes:
            cand |= node_bit.get(n, 0)
        found: dict[int, int] = {}  # node bit -> prefix length
        held = self._held
        stack = [(0, len(path), cand)] if cand else []
        while stack:
            lo, hi, m = stack.pop()
            if lo >= hi:
                while m:
                    low = m & -m
                    found[low] = lo
                    m ^= low
                continue
            mid = (lo + hi) // 2
            yes = m & held.get(path[mid], 0)
            if yes:
                stack.append((mid + 1, hi, yes))
                if yes != m:
                    stack.append((lo, mid, m ^ yes))
            else:
                stack.append((lo, mid, m))
        out: dict[int, int] = {}
        for n in nodes:
            b = node_bit.get(n)
            out[n] = 0 if b is None else found[b]
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
        held = self._held
        return _held_prefix(len(path), lambda i: path[i] in held)

    def holders_of(self, h: BlockHash) -> dict[int, int]:
        """node -> tier bits (1 = GPU, 2 = host) of the nodes holding block `h`."""
        m = self._held.get(h, 0)
        out: dict[int, int] = {}
        while m:
            low = m & -m
            n = self._bit_node[low.bit_length() - 1]
            out[n] = self._tiers[n][h]
            m ^= low
        return out

    def node_holdings(self, node: int) -> dict[BlockHash, int]:
        """block -> tier bits of every block `node` holds."""
        return dict(self._tiers.get(node) or {})

    def node_blocks(self, node: int) -> int:
        return len(self._tiers.get(node) or ())

    def node_counts(self, node: int) -> dict[BlockHash, int]:
        """R_{b,n} of every block with a nonzero count on `node` (held or placed)."""
        return dict(self._counts.get(node) or {})

    def all_counts(self) -> dict[tuple[int, BlockHash], int]:
        """(node, block) -> R_{b,n} of every nonzero count."""
        return {(n, h): c for n, cs in self._counts.items() for h, c in cs.items()}

    def stats(self) -> dict[str, float]:
        blocks: set[BlockHash] = set(self._held)
        holdings = counted = 0
        for n in self._tiers.keys() | self._counts.keys():
            tiers: dict[BlockHash, int] = self._tiers.get(n) or {}
            counts: dict[BlockHash, int] = self._counts.get(n) or {}
            blocks.update(counts)
            holdings += len(tiers) + sum(1 for h in counts if h not in tiers)
            counted += len(counts)
        return {
            "blocks": float(len(blocks)),
            "holdings": float(holdings),
            "counted_holdings": float(counted),
            "events": float(self.num_events),
        }

    def check_invariants(self) -> None:
        """Counts positive; tier bits nonzero; holder bitmasks exact."""
        for n, cs in self._counts.items():
            for h, c in cs.items():
                if c <= 0:
                    raise AssertionError(f"block {h} node {n}: count {c} kept")
        for n, tiers in self._tiers.items():
            for h, bits in tiers.items():
                if not bits & (GPU | HOST) or bits & ~(GPU | HOST):
                    raise AssertionError(f"block {h} node {n}: tier bits {bits}")
        held: dict[BlockHash, int] = {}
        for n, tiers in self._tiers.items():
            b = self._node_bit[n] if tiers else 0  # a node holding blocks has a bit
            for h in tiers:
                held[h] = held.get(h, 0) | b
        if held != self._held:
            raise AssertionError("per-block holder bitmasks differ from the nodes' tables")
