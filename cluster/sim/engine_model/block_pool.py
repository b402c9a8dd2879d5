"""The KV cache of one engine in blocks of `block_size` tokens (vLLM's paged KV).

A request holds ceil(computed tokens / block_size) blocks; an iteration that computes more
tokens allocates the blocks they need first, and fails (nothing taken) when too few are
free. Free blocks form one queue, evicted from its front (vLLM's free block queue): a
finished request's blocks join at the back. With prefix caching, a preempted request's
blocks join at the back still holding its KV, tail blocks first (vLLM frees in reverse
order), so allocations evict its tail before its prefix; when it is admitted again, the
blocks of its prefix that survived are hits (`take_cached`) and only the rest is
recomputed. The replayed workloads share no prefixes between requests, so only a request's
own preempted KV can hit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cluster.sim.engine_model.sequence import EngineRequest


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(slots=True, eq=False)
class _FreeRun:
    """Consecutive free blocks in the queue; `owner`: whose KV they still hold, if anyone's."""

    owner: EngineRequest | None
    count: int


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV needs >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.free_blocks = num_blocks
        self._free_queue: deque[_FreeRun] = deque([_FreeRun(None, num_blocks)])  # evict left

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def blocks_needed(self, req: EngineRequest, new_tokens: int) -> int:
        """More blocks `req` needs to compute `new_tokens` more tokens."""
        want = blocks_for(req.computed_tokens + new_tokens, self.block_size)
        return max(want - req.blocks, 0)

    def allocate(self, req: EngineRequest, new_tokens: int) -> bool:
        """Give `req` the blocks for `new_tokens` more tokens; False (nothing taken) if short."""
        need = self.blocks_needed(req, new_tokens)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        req.blocks += need
        while need:
            run = self._free_queue[0]
            take = min(need, run.count)
            need -= take
            run.count -= take
            if run.owner is not None:
                run.owner.cached_blocks -= take
            if not run.count:
                self._free_queue.popleft()
        return True

    def free(self, req: EngineRequest, *, preempted: bool = False) -> None:
        """Return `req`'s blocks; a preempted request's keep its KV with prefix caching."""
        if req.blocks:
            keep = preempted and self.prefix_caching
            self._free_queue.append(_FreeRun(req if keep else None, req.blocks))
            if keep:
                req.cached_blocks = req.blocks
        self.free_blocks += req.blocks
        req.blocks = 0

    @property
    def kv_blocks_in_use(self) -> int:
        """Blocks held by requests (a preempted request's kept KV is free: evictable)."""
        return self.used_blocks

    def admission_cost(self, req: EngineRequest, hit: int, tokens: int) -> int:
        """Free blocks an admission up to `tokens` takes; its `hit` cached blocks are free
        blocks too (they leave the free queue when taken back)."""
        return blocks_for(tokens, self.block_size)

    def cached_prefix_blocks(self, req: EngineRequest) -> int:
        """Blocks of `req`'s prefix still cached, leaving at least one token to compute."""
        return min(req.cached_blocks, (req.num_tokens - 1) // self.block_size)

    def take_cached(self, req: EngineRequest, blocks: int) -> None:
        """Reuse `blocks` of `req`'s cached prefix: they leave the free queue, unchanged."""
        if blocks > req.cached_blocks:
            raise ValueError(f"{req.request_id}: {blocks} blocks asked, {req.cached_blocks} cached")
        for i, run in enumerate(self._free_queue):
            if run.owner is req:
                if run.count == blocks:
                    del self._free_queue[i]
                else:  # the rest (beyond the prefix reused) is nobody's now
                    run.owner, run.count = None, run.count - blocks
                break
        req.cached_blocks = 0
        req.blocks += blocks
        self.free_blocks -= blocks

    def check_invariants(self, holders: list[EngineRequest]) -> None:
        held = sum(r.blocks for r in holders)
        queued = sum(run.count for run in self._free_queue)
        if held + self.free_blocks != self.num_blocks or queued != self.free_blocks:
            raise AssertionError(
                f"block pool: {held} held + {self.free_blocks} free ({queued} queued) != "
                f"{self.num_blocks}"
            )
        for run in self._free_queue:
            if run.count < 1 or (run.owner is not None and run.owner.cached_blocks != run.count):
                raise AssertionError(f"free queue run {run} disagrees with its owner")
