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
from typing import Any, NamedTuple, Protocol

from cluster.sim.engine_model.block_pool import BlockPool
from cluster.sim.engine_model.sequence import EngineRequest


def tokens_granted(wanted: int, budget: int, long_prefill_token_threshold: int = 0) -> int:
    """Tokens a request computes this iteration under vLLM V1's rule: what it still needs,
    capped by `long_prefill_token_threshold` (0: no cap) and by the budget left. The
    cluster simulator's PD nodes take their prefill chunks by the same rule."""
    if 0 < long_prefill_token_threshold < wanted:
        wanted = long_prefill_token_threshold
    return min(wanted, budget)


class ScheduledBatch(NamedTuple):
    """One iteration: (request, tokens computed) in batch order, who was preempted, and the
    seconds spent loading prefixes from a shared pool before the forward pass."""

    entries: list[tuple[EngineRequest, int]]
    preempted: list[EngineRequest]
    load_s: float = 0.0

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


class KVConnector(Protocol):
    """A second KV tier (vLLM's KV connector, e.g. LMCache): prefix tokens it holds beyond
    the engine's own cache, and the seconds loading them takes (shared_pool)."""

    def lookup(self, req: EngineRequest, local_tokens: int) -> int: ...

    def load_seconds(self, tokens: int) -> float: ...


class PrefixStats:
    """vLLM's prefix-cache counters: prompt tokens queried at admission, tokens found in the
    engine's own cache, tokens found in the connector (external)."""

    __slots__ = ("external_hits", "local_hits", "queries", "requests")

    def __init__(self) -> None:
        self.requests = self.queries = self.local_hits = self.external_hits = 0


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
        connector: KVConnector | None = None,
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
        self.connector = connector
        self.stats = PrefixStats()
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._load_s = 0.0

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
        self._load_s = 0.0
        if not self.mixed_prefill_decode:
            entries = self._continue_prefills(budget)
            self._admit(budget - sum(n for _, n in entries), entries)
            if entries:
                return ScheduledBatch(entries, [], self._load_s)
        entries, preempted = self._schedule_running(budget)
        if not preempted and self.mixed_prefill_decode:
            self._admit(budget - sum(n for _, n in entries), entries)
        return ScheduledBatch(entries, preempted, self._load_s)

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
        """Waiting requests FCFS into `entries` while seats, budget and blocks last (step 2).

        A request starts from its cached prefix: blocks of this engine's cache
        (`pool.cached_prefix_blocks`), then tokens whose KV arrives from elsewhere (a PD
        peer's, already sent; or the connector's, loaded in this iteration)."""
        pool: Any = self.pool
        bs = pool.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hit = pool.cached_prefix_blocks(req)
            local = hit * bs
            ext = max(min(req.remote_kv_tokens, req.num_tokens - 1) - local, 0)
            from_connector = 0
            if not ext and self.connector is not None:
                from_connector = ext = self.connector.lookup(req, local)
            start = local + ext
            left = req.num_tokens - start
            if not self.enable_chunked_prefill and left > budget:
                break
            n = tokens_granted(left, budget, self.long_prefill_token_threshold)
            # cached blocks still in the free queue leave it when taken
            free = pool.free_blocks
            if self.reserve_full_prompt and pool.admission_cost(req, hit, req.num_tokens) > free:
                break
            if pool.admission_cost(req, hit, start + n) > free:
                break
            if hit or req.cached_blocks:  # what is left of a preempted run is nobody's now
                pool.take_cached(req, hit)
            req.computed_tokens = start
            if not pool.allocate(req, n):
                raise AssertionError(f"{req.request_id}: allocation checked above failed")
            if req.num_preemptions == 0:
                self.stats.requests += 1
                self.stats.queries += req.num_tokens
                self.stats.local_hits += local
                self.stats.external_hits += ext
                req.local_hit_tokens, req.external_hit_tokens = local, ext
            if from_connector and self.connector is not None:
                self._load_s += self.connector.load_seconds(from_connector)
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
