"""vLLM V1's prefix cache: KV blocks keyed by chained hashes of their tokens, shared by requests.

`HashedBlockPool` keeps the interface of `block_pool.BlockPool` (what `StepScheduler` calls)
with the block-level semantics of vLLM V1's `BlockPool` + `KVCacheManager`
(vllm/v1/core/block_pool.py, kv_cache_manager.py):
- a request's full blocks are identified by `EngineRequest.block_hashes`, the chained hashes
  of its prompt and output token ids in `block_size` blocks (cluster.kv.hashing);
- when the scheduler allocates slots up to token p, every block of the request filled by
  then gets its hash registered (vLLM caches full blocks at scheduling time), so requests
  admitted later hit them;
- admission looks up the longest prefix of the request's hashes held by any block (in use
  or free), leaving at least one token to compute; those blocks gain a reference, and a
  free one leaves the free queue ("touch");
- free blocks form one queue, allocated from its front; taking a block that still holds a
  hash evicts it from the cache. A finished (or preempted) request returns its blocks tail
  first, so its prefix is evicted last.

`kv_blocks_in_use` is what vLLM 0.13 reported as KV cache usage on the A6000 runs of
LLMServingSim's artifact: blocks held by requests plus free blocks still holding cached KV
(its figure 7 run ends at 60.5% with no request running: 8,380 of 13,843 blocks, the
8,379 distinct full blocks of the workload's prompts and outputs).
"""

from __future__ import annotations

from collections import OrderedDict

from cluster.sim.engine_model.block_pool import blocks_for
from cluster.sim.engine_model.sequence import EngineRequest


class HashedBlockPool:
    """Blocks with reference counts and hashes, one LRU free queue (module docstring)."""

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV needs >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # hash -> block holding it
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._free_hashed = 0
        self._owned: dict[int, list[int]] = {}  # id(request) -> its block ids, in order
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def kv_blocks_in_use(self) -> int:
        """Blocks held by requests plus free blocks still holding cached KV."""
        return self.used_blocks + self._free_hashed

    def blocks_needed(self, req: EngineRequest, new_tokens: int) -> int:
        want = blocks_for(req.computed_tokens + new_tokens, self.block_size)
        return max(want - req.blocks, 0)

    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)
        h = self._hash[block]
        if h is not None:  # evict: the block is reused for other tokens
            self._free_hashed -= 1
            self._hash[block] = None
            if self._cached.get(h) == block:
                del self._cached[h]
            self.evictions += 1
        self._ref[block] = 1
        return block

    def _register(self, req: EngineRequest, upto_tokens: int) -> None:
        """Hash every block of `req` full by token `upto_tokens` (vLLM's cache_blocks)."""
        ids = self._owned.get(id(req))
        if not ids:
            return
        full = min(upto_tokens // self.block_size, len(req.block_hashes), len(ids))
        for j in range(req.hashed_blocks, full):
            b, h = ids[j], req.block_hashes[j]
            if self._hash[b] is None:
                self._hash[b] = h
                self._cached.setdefault(h, b)
        req.hashed_blocks = max(req.hashed_blocks, full)

    def allocate(self, req: EngineRequest, new_tokens: int) -> bool:
        need = self.blocks_needed(req, new_tokens)
        if need > len(self._free):
            return False
        ids = self._owned.setdefault(id(req), [])
        for _ in range(need):
            ids.append(self._take())
        req.blocks += need
        self._register(req, req.computed_tokens + new_tokens)
        return True

    def free(self, req: EngineRequest, *, preempted: bool = False) -> None:
        """Drop `req`'s references; blocks reaching 0 join the free queue tail first."""
        ids = self._owned.pop(id(req), [])
        for b in reversed(ids):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is not None:
                    self._free_hashed += 1
        req.blocks = 0
        req.hashed_blocks = 0

    def cached_prefix_blocks(self, req: EngineRequest) -> int:
        """Leading blocks of `req` cached anywhere, leaving at least one token to compute."""
        limit = min((req.num_tokens - 1) // self.block_size, len(req.block_hashes))
        n = 0
        while n < limit and req.block_hashes[n] in self._cached:
            n += 1
        return n

    def admission_cost(self, req: EngineRequest, hit: int, tokens: int) -> int:
        """Free-queue blocks an admission with `hit` cached blocks up to `tokens` takes."""
        touched = sum(1 for h in req.block_hashes[:hit] if self._ref[self._cached[h]] == 0)
        return touched + max(blocks_for(tokens, self.block_size) - hit, 0)

    def take_cached(self, req: EngineRequest, blocks: int) -> None:
        """Reference the first `blocks` cached blocks of `req` (touch: leave the free queue)."""
        ids = self._owned.setdefault(id(req), [])
        if ids:
            raise ValueError(f"{req.request_id}: takes cached blocks while holding {len(ids)}")
        for h in req.block_hashes[:blocks]:
            b = self._cached[h]
            if self._ref[b] == 0:
                del self._free[b]
                self._free_hashed -= 1
            self._ref[b] += 1
            ids.append(b)
        req.blocks += blocks
        req.hashed_blocks = blocks

    def check_invariants(self, holders: list[EngineRequest]) -> None:
        refs = [0] * self.num_blocks
        for r in holders:
            for b in self._owned.get(id(r), []):
                refs[b] += 1
            if r.blocks != len(self._owned.get(id(r), [])):
                raise AssertionError(f"{r.request_id}: {r.blocks} blocks counted, ids disagree")
        if refs != self._ref:
            raise AssertionError("block pool: reference counts disagree with the holders")
        free = {b for b in range(self.num_blocks) if self._ref[b] == 0}
        if free != set(self._free):
            raise AssertionError("block pool: the free queue is not the unreferenced blocks")
        hashed = sum(1 for b in self._free if self._hash[b] is not None)
        if hashed != self._free_hashed:
            raise AssertionError(
                f"block pool: {hashed} hashed free blocks, counted {self._free_hashed}"
            )
        for h, b in self._cached.items():
            if self._hash[b] != h:
                raise AssertionError(
                    f"block pool: cache maps {h} to block {b} holding {self._hash[b]}"
                )
