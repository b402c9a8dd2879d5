"""One iteration's batch under vLLM V1's rules (vllm/v1/core/sched/scheduler.py).

Each step has one token budget, `max_num_batched_tokens`, shared by every request:
1. running requests, in admission order: each asks for its remaining tokens (1 for a
   decode, the rest of its prompt for a chunked prefill, capped by
   `long_prefill_token_threshold` when set) and gets min(that, budget left). When the KV
   blocks for them are not free, the newest running request is preempted (recompute: its
   blocks are freed, it goes back to the front of the waiting queue) until they are, or
   until the request itself was the newest;
2. if nobody was preempted this step, waiting requests FCFS while fewer than
   `max_num_seqs` run and budget is left: a prefill chunk takes what budget is left. With
   `reserve_full_prompt` (vLLM's `scheduler_reserve_full_isl`, on by default) a request is
   admitted only when blocks for all its tokens are free; it allocates only its chunk's.
   A request preempted earlier first takes back the blocks of its prefix that prefix
   caching kept (block_pool) and computes only the rest.
Without `mixed_prefill_decode` (SGLang unless --enable-mixed-chunk) prefill goes first and
alone: an iteration continues the running requests still prefilling and admits waiting
ones (step 2); only when there is no prefill to run do the running requests decode
(step 1, with preemption).
The scheduler decides and allocates; `StepScheduler.finish` applies the iteration's result.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from cluster.sim.engine_model.block_pool import BlockPool, blocks_for
from cluster.sim.engine_model.sequence import EngineRequest


def tokens_granted(wanted: int, budget: int, long_prefill_token_threshold: int = 0) -> int:
    """Tokens a request computes this iteration under vLLM V1's rule: what it still needs,
    capped by `long_prefill_token_threshold` (0: no cap) and by the budget left. The
    cluster simulator's PD nodes take their prefill chunks by the same rule."""
    if 0 < long_prefill_token_threshold < wanted:
        wanted = long_prefill_token_threshold
    return min(wanted, budget)


class ScheduledBatch(NamedTuple):
    """One iteration: (request, tokens computed) in batch order, and who was preempted."""

    entries: list[tuple[EngineRequest, int]]
    preempted: list[EngineRequest]

    @property
    def prefill_chunks(self) -> list[tuple[int, int]]:
        """(t_uc new tokens, t_c tokens already cached) of each prefill chunk."""
        return [(n, r.computed_tokens) for r, n in self.entries if not r.is_decode]

    @property
    def decode_kv(self) -> list[int]:
        """Context each decode reads (its cached tokens plus the one it feeds)."""
        return [r.computed_tokens + 1 for r, _ in self.entries if r.is_decode]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.entries)


class StepScheduler:
    """Waiting queue, running set and KV blocks of one engine (module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        *,
        long_prefill_token_threshold: int = 0,
        reserve_full_prompt: bool = True,
        enable_chunked_prefill: bool = True,
        mixed_prefill_decode: bool = True,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_seqs and max_num_batched_tokens must be >= 1, got {max_num_seqs}, "
                f"{max_num_batched_tokens}"
            )
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.reserve_full_prompt = reserve_full_prompt
        self.enable_chunked_prefill = enable_chunked_prefill
        self.mixed_prefill_decode = mixed_prefill_decode
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []

    def add(self, req: EngineRequest) -> None:
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def _ask(self, req: EngineRequest, budget: int) -> int:
        return tokens_granted(req.new_tokens, budget, self.long_prefill_token_threshold)

    def _preempt_newest(self) -> EngineRequest:
        victim = self.running.pop()
        self.pool.free(victim, preempted=True)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)
        return victim

    def schedule(self) -> ScheduledBatch:
        """The next iteration's batch (module docstring); empty only when idle."""
        budget = self.max_num_batched_tokens
        if not self.mixed_prefill_decode:
            entries = self._continue_prefills(budget)
            self._admit(budget - sum(n for _, n in entries), entries)
            if entries:
                return ScheduledBatch(entries, [])
        entries, preempted = self._schedule_running(budget)
        if not preempted and self.mixed_prefill_decode:
            self._admit(budget - sum(n for _, n in entries), entries)
        return ScheduledBatch(entries, preempted)

    def _schedule_running(
        self, budget: int
    ) -> tuple[list[tuple[EngineRequest, int]], list[EngineRequest]]:
        """Running requests in order, preempting the newest when KV runs out (step 1)."""
        entries: list[tuple[EngineRequest, int]] = []
        preempted: list[EngineRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._ask(req, budget)
            while not self.pool.allocate(req, n):
                preempted.append(self._preempt_newest())
                if preempted[-1] is req:
                    break
            if preempted and preempted[-1] is req:
                break
            entries.append((req, n))
            budget -= n
            i += 1
        return entries, preempted

    def _continue_prefills(self, budget: int) -> list[tuple[EngineRequest, int]]:
        """Prefill-first mode: the next chunks of running requests still prefilling."""
        entries = []
        for req in self.running:
            if budget <= 0:
                break
            if req.is_decode:
                continue
            n = self._ask(req, budget)
            if not self.pool.allocate(req, n):
                break
            entries.append((req, n))
            budget -= n
        return entries

    def _admit(self, budget: int, entries: list[tuple[EngineRequest, int]]) -> None:
        """Waiting requests FCFS into `entries` while seats, budget and blocks last (step 2)."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            bs = self.pool.block_size
            hit = self.pool.cached_prefix_blocks(req)
            left = req.num_tokens - hit * bs
            if not self.enable_chunked_prefill and left > budget:
                break
            n = tokens_granted(left, budget, self.long_prefill_token_threshold)
            # the cached prefix's blocks are still counted free until taken back
            free = self.pool.free_blocks
            if self.reserve_full_prompt and blocks_for(req.num_tokens, bs) > free:
                break
            if blocks_for(hit * bs + n, bs) > free:
                break
            if req.cached_blocks:  # reuse the prefix; what is left is nobody's now
                self.pool.take_cached(req, hit)
                req.computed_tokens = hit * bs
            if not self.pool.allocate(req, n):
                raise AssertionError(f"{req.request_id}: allocation checked above failed")
            self.waiting.popleft()
            self.running.append(req)
            entries.append((req, n))
            budget -= n

    def finish(self, batch: ScheduledBatch, t_end_s: float) -> list[EngineRequest]:
        """Apply an iteration that ended at `t_end_s`; returns the requests it finished."""
        done = []
        for req, n in batch.entries:
            if req.advance(n, t_end_s):
                done.append(req)
        if done:
            ids = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in ids]
            for r in done:
                self.pool.free(r)
        return done

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.running)
        if len(self.running) > self.max_num_seqs:
            raise AssertionError(f"{len(self.running)} running > max_num_seqs {self.max_num_seqs}")
        for r in self.waiting:
            if r.blocks:
                raise AssertionError(f"waiting request {r.request_id} holds {r.blocks} blocks")
