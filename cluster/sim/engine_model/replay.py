"""Replay recorded requests on engine models: a standalone event loop per engine (the twin).

Each engine (a DP rank) runs independently, except the DP ranks of an MoE model with
expert parallelism, which step together (`replay_group`): requests join an engine's
waiting queue at their recorded arrival (or, without a recorded rank, round-robin in
arrival order), and the engine iterates while it has work: schedule (`StepScheduler`), price the batch, advance the
clock by that time, apply the result. Requests arriving during an iteration are seen by the
next one, as in vLLM's engine loop. An iteration's time is the pricer's time of the mixed
batch (prefill chunks over their cached tokens, decodes over their contexts) plus
`IterationOverhead`: what the engine spends outside the profiled GPU operators (the
scheduler, input preparation, sampling and output processing on the CPU); the rule is
`pricing.iteration_time`, which the cluster simulator's mixed iterations share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from cluster.core import ConfigError
from cluster.hardware.engine import EngineSettings
from cluster.hardware.pricer import IterationPricer
from cluster.sim.engine_model.block_pool import BlockPool, blocks_for
from cluster.sim.engine_model.pricing import NO_OVERHEAD, IterationOverhead, iteration_time
from cluster.sim.engine_model.scheduler import ScheduledBatch, StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's defaults when a run did not record them
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class ReplayRequest(NamedTuple):
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    engine: int | None = None  # DP rank that served it; None: round-robin


class EngineReplay(NamedTuple):
    """One engine's replayed requests and how it got there."""

    engine: int
    requests: list[EngineRequest]
    num_iterations: int
    busy_s: float
    # (iteration end s, running, waiting, KV blocks used) after each iteration
    trace: list[tuple[float, int, int, int]]

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.requests)


class _Engine:
    """The replay state of one engine: its requests in arrival order and what it did."""

    def __init__(self, rank: int, requests: Sequence[ReplayRequest], scheduler: StepScheduler):
        capacity, bs = scheduler.pool.num_blocks, scheduler.pool.block_size
        self.rank, self.scheduler = rank, scheduler
        self.live: list[EngineRequest] = []
        for r in sorted(requests, key=lambda r: (r.arrival_s, r.request_id)):
            need = blocks_for(r.prompt_tokens + r.output_tokens - 1, bs)
            if need > capacity:
                raise ConfigError(
                    f"request {r.request_id!r} needs {need} KV blocks ({r.prompt_tokens} + "
                    f"{r.output_tokens} tokens); engine {rank} has {capacity}"
                )
            self.live.append(
                EngineRequest(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
            )
        self.next = self.iterations = 0
        self.busy_s = 0.0
        self.trace: list[tuple[float, int, int, int]] = []

    def admit_until(self, t: float) -> None:
        while self.next < len(self.live) and self.live[self.next].arrival_s <= t:
            self.scheduler.add(self.live[self.next])
            self.next += 1

    def next_arrival(self) -> float | None:
        return self.live[self.next].arrival_s if self.next < len(self.live) else None

    def result(self) -> EngineReplay:
        return EngineReplay(self.rank, self.live, self.iterations, self.busy_s, self.trace)


def replay_group(
    engines: Sequence[tuple[int, Sequence[ReplayRequest], StepScheduler]],
    price: Callable[[ScheduledBatch, float], float],
) -> list[EngineReplay]:
    """Run engines that step together until every request has finished.

    Each iteration, every engine with work schedules its batch; the iteration takes the
    slowest batch's time, priced with `group_tokens` = all engines' tokens (the EP group's),
    and ends for all of them at once: vLLM's DP ranks of an MoE model with expert
    parallelism meet in every layer's all-to-all. One engine alone is an ordinary engine.
    """
    group = [_Engine(rank, reqs, sched) for rank, reqs, sched in engines]
    arrivals = [a for e in group if (a := e.next_arrival()) is not None]
    t = min(arrivals, default=0.0)
    while True:
        for e in group:
            e.admit_until(t)
        active = [e for e in group if not e.scheduler.idle]
        if not active:
            pending = [a for e in group if (a := e.next_arrival()) is not None]
            if not pending:
                break
            t = min(pending)
            continue
        batches = [e.scheduler.schedule() for e in active]
        for e, batch in zip(active, batches, strict=True):
            if not batch.entries:  # cannot happen with the capacity check of _Engine
                raise RuntimeError(f"engine {e.rank}: nothing schedulable at t={t:.3f}s")
        tokens = float(sum(b.num_tokens for b in batches))
        dt = max(price(b, tokens) for b in batches)
        t += dt
        for e, batch in zip(active, batches, strict=True):
            e.busy_s += dt
            e.iterations += 1
            e.scheduler.finish(batch, t)
            s = e.scheduler
            e.trace.append((t, len(s.running), len(s.waiting), s.pool.used_blocks))
    return [e.result() for e in group]


def replay_engine(
    engine: int,
    requests: Sequence[ReplayRequest],
    scheduler: StepScheduler,
    price: Callable[[ScheduledBatch], float],
) -> EngineReplay:
    """Run one engine over `requests` (any order) until every one has finished."""
    (out,) = replay_group([(engine, requests, scheduler)], lambda b, _tokens: price(b))
    return out


def batch_pricer(
    pricer: IterationPricer, overhead: IterationOverhead | None = None
) -> Callable[[ScheduledBatch, float], float]:
    """Seconds of a batch, given the tokens of its EP group (the pricer's `group_tokens`)."""
    over = overhead or NO_OVERHEAD

    def price(batch: ScheduledBatch, group_tokens: float) -> float:
        return iteration_time(pricer, batch.prefill_chunks, batch.decode_kv, group_tokens, over)

    return price


def replay(
    requests: Sequence[ReplayRequest],
    settings: EngineSettings,
    kv_blocks: int,
    pricer: IterationPricer,
    overhead: IterationOverhead | None = None,
) -> list[EngineReplay]:
    """Replay `requests` on `settings.data_parallel_size` engines of `kv_blocks` blocks each."""
    dp = settings.data_parallel_size
    by_engine: list[list[ReplayRequest]] = [[] for _ in range(dp)]
    rr = 0
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.request_id)):
        if r.engine is None:
            by_engine[rr % dp].append(r)
            rr += 1
        elif not 0 <= r.engine < dp:
            raise ConfigError(
                f"request {r.request_id!r} ran on engine {r.engine}; the engine settings have "
                f"data_parallel_size {dp}"
            )
        else:
            by_engine[r.engine].append(r)
    price = batch_pricer(pricer, overhead)
    engines = []
    for rank, reqs in enumerate(by_engine):
        sched = StepScheduler(
            BlockPool(
                kv_blocks, settings.block_size, prefix_caching=settings.enable_prefix_caching
            ),
            settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            long_prefill_token_threshold=settings.long_prefill_token_threshold or 0,
            reserve_full_prompt=settings.reserve_full_prompt is not False,
            enable_chunked_prefill=settings.enable_chunked_prefill,
            mixed_prefill_decode=settings.mixed_prefill_decode,
        )
        engines.append((rank, reqs, sched))
    lockstep = dp > 1 and settings.expert_parallel_size > 1 and pricer.shape.is_moe
    if lockstep:
        return replay_group(engines, price)
    return [replay_group([e], price)[0] for e in engines]
