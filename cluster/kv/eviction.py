"""KV eviction policies: the order in which a tier gives up blocks (paper 000 §5.3, Alg. E.2
l.16–21).

Policies order blocks by a key, evicting the smallest first:
- branch-aware: (1[R_b > 0], T_b) - blocks no active branch references go first, LRU within
  each group (Evolving Infra's host-memory eviction);
- lru: (T_b,) - the baseline of HiCache / SGLang / Dynamo.
Caches break ties toward deeper blocks, so a node evicts leaves before their parents and
its holdings stay prefix-closed (a radix cache never keeps a child without its parent).
The caches that keep these orders are `tier_cache` (any policy; exact LRU) and
`recency_cache` (the built-in policies without a heap).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from cluster.core import BlockHash, Registry


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
