"""Replay recorded requests on engine models: one event loop over every DP rank (the twin).

Requests reach their rank at their recorded arrival: the rank that served them when the
run recorded it, else the rank vLLM's DP load balancer would pick at that moment
(`dp_balance.DPBalancer`: lowest 4 * waiting + running in the DP coordinator's 100 ms
snapshots). Each engine iterates while it has work: schedule (`StepScheduler`), price the
batch, advance its clock by that time, apply the result; requests arriving during an
iteration are seen by the next one, as in vLLM's engine loop. An iteration's time is the
pricer's time of the mixed batch (prefill chunks over their cached tokens, decodes over
their contexts) plus `IterationOverhead`: what the engine spends outside the profiled GPU
operators (the scheduler, input preparation, sampling and output processing on the CPU);
the rule is `pricing.iteration_time`, which the cluster simulator's mixed iterations share.

Dense DP ranks are independent engines (vLLM 0.19 runs them apart). The DP ranks of an
MoE model with expert parallelism step together, as vLLM's `DPEngineCoreProc.
run_busy_loop` makes them (vllm/v1/engine/core.py): while any rank has work, every rank
runs a forward pass each step, a rank with nothing scheduled running `execute_dummy_batch`
(one token), because all of them meet in every MoE layer's dispatch and combine; the step
is priced by `pricing.lockstep_time` (each layer as slow as its slowest rank, the MoE block
over the group's tokens). When no rank has work the loop keeps stepping dummy batches until
its finish check, an all-reduce every 32 steps (`_has_global_unfinished_reqs`), sees it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from cluster.core import ConfigError
from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.pricer import IterationPricer
from cluster.sim.engine_model.block_pool import BlockPool, blocks_for
from cluster.sim.engine_model.dp_balance import DPBalancer
from cluster.sim.engine_model.pricing import (
    NO_OVERHEAD,
    IterationOverhead,
    iteration_time,
    lockstep_time,
)
from cluster.sim.engine_model.scheduler import ScheduledBatch, StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's defaults when a run did not record them
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
FINISH_SYNC_STEPS = 32  # vLLM's DP engines check for global completion every 32 steps

Price = Callable[[ScheduledBatch, float], float]
GroupPrice = Callable[[Sequence[ScheduledBatch | None]], float]


class ReplayRequest(NamedTuple):
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    engine: int | None = None  # DP rank that served it; None: vLLM's DP load balancer picks


class EngineReplay(NamedTuple):
    """One engine's replayed requests and how it got there."""

    engine: int
    requests: list[EngineRequest]
    num_iterations: int  # iterations that ran requests
    busy_s: float  # seconds of those iterations
    # (iteration end s, running, waiting, KV blocks used) after each iteration, dummy ones
    # (a DP rank stepping with its group without work) included
    trace: list[tuple[float, int, int, int]]
    dummy_iterations: int = 0

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.requests)

    @property
    def running_mean(self) -> float:
        """Running requests, time-weighted from the first iteration's end to the last's
        (each count holds until the next iteration ends)."""
        if len(self.trace) < 2:
            return float(self.trace[0][1]) if self.trace else 0.0
        area = sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(self.trace))
        span = self.trace[-1][0] - self.trace[0][0]
        return area / span if span > 0 else float(self.trace[-1][1])


class _Rank:
    """The replay state of one engine: its requests in arrival order and what it did."""

    def __init__(self, rank: int, scheduler: StepScheduler):
        self.rank, self.scheduler = rank, scheduler
        self.requests: list[EngineRequest] = []
        self.iterations = self.dummies = self._seen = 0
        self.busy_s = 0.0
        self.trace: list[tuple[float, int, int, int]] = []

    def add(self, r: ReplayRequest) -> None:
        pool = self.scheduler.pool
        need = blocks_for(r.prompt_tokens + r.output_tokens - 1, pool.block_size)
        if need > pool.num_blocks:
            raise ConfigError(
                f"request {r.request_id!r} needs {need} KV blocks ({r.prompt_tokens} + "
                f"{r.output_tokens} tokens); engine {self.rank} has {pool.num_blocks}"
            )
        req = EngineRequest(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
        self.requests.append(req)
        self.scheduler.add(req)

    def counts_at(self, tau: float) -> tuple[int, int]:
        """(waiting, running) after the last iteration ending by `tau` (non-decreasing)."""
        while self._seen < len(self.trace) and self.trace[self._seen][0] <= tau:
            self._seen += 1
        if not self._seen:
            return 0, 0
        _, running, waiting, _ = self.trace[self._seen - 1]
        return waiting, running

    def record(self, t: float) -> None:
        s = self.scheduler
        self.trace.append((t, len(s.running), len(s.waiting), s.pool.used_blocks))

    def result(self) -> EngineReplay:
        return EngineReplay(
            self.rank, self.requests, self.iterations, self.busy_s, self.trace, self.dummies
        )


class _Group:
    """Ranks that iterate together (one rank: an ordinary engine)."""

    def __init__(self, ranks: list[_Rank], price: Price, group_price: GroupPrice | None):
        self.ranks, self.price, self.group_price = ranks, price, group_price
        self.event: float | None = None  # end of the iteration in flight, or a wake-up
        self.batches: list[ScheduledBatch | None] | None = None
        self.dt = 0.0
        self.steps = 0  # vLLM's step_counter of the DP loop

    def wake(self, t: float) -> None:
        if self.event is None:
            self.event = t

    def step(self) -> None:
        """Finish the iteration ending now (if any) and start the next (or go idle)."""
        t = self.event
        assert t is not None
        if self.batches is not None:
            for rank, batch in zip(self.ranks, self.batches, strict=True):
                if batch is None:
                    rank.dummies += 1
                else:
                    rank.iterations += 1
                    rank.busy_s += self.dt
                    rank.scheduler.finish(batch, t)
                rank.record(t)
            self.steps += 1
        busy = [not r.scheduler.idle for r in self.ranks]
        lockstep = self.group_price is not None
        if not any(busy) and (not lockstep or self.steps % FINISH_SYNC_STEPS == 0):
            self.event, self.batches, self.steps = None, None, 0
            return
        self.batches = [
            r.scheduler.schedule() if b else None for r, b in zip(self.ranks, busy, strict=True)
        ]
        for rank, batch in zip(self.ranks, self.batches, strict=True):
            if batch is not None and not batch.entries:  # cannot happen: capacity checked
                raise RuntimeError(f"engine {rank.rank}: nothing schedulable at t={t:.3f}s")
        if self.group_price is not None:
            self.dt = self.group_price(self.batches)
        else:
            (batch,) = self.batches
            assert batch is not None
            self.dt = self.price(batch, float(batch.num_tokens))
        self.event = t + self.dt


def replay_ranks(
    ranks: Sequence[tuple[int, StepScheduler]],
    requests: Sequence[ReplayRequest],
    price: Price,
    group_price: GroupPrice | None = None,
) -> list[EngineReplay]:
    """Replay `requests` (any order) on the engines `ranks` until every one has finished:
    in step, priced by `group_price`, when it is given, else independently by `price`
    (a batch and its tokens). Requests without a rank go where `DPBalancer` sends them."""
    states = [_Rank(rank, sched) for rank, sched in ranks]
    if group_price is not None:
        groups = [_Group(states, price, group_price)]
    else:
        groups = [_Group([s], price, None) for s in states]
    group_of = {id(s): g for g in groups for s in g.ranks}
    balancer = DPBalancer(len(states))
    arrivals = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    i = 0
    while True:
        nxt, t_next = None, math.inf
        for g in groups:
            if g.event is not None and g.event < t_next:
                nxt, t_next = g, g.event
        if i < len(arrivals) and arrivals[i].arrival_s <= t_next:
            r = arrivals[i]
            i += 1
            if r.engine is None:
                rank = balancer.choose(r.arrival_s, lambda k, tau: states[k].counts_at(tau))
            elif 0 <= r.engine < len(states):
                rank = r.engine
            else:
                raise ConfigError(
                    f"request {r.request_id!r} ran on engine {r.engine}; the engine settings "
                    f"have data_parallel_size {len(states)}"
                )
            states[rank].add(r)
            group_of[id(states[rank])].wake(r.arrival_s)
            continue
        if nxt is None:
            break
        nxt.step()
    return [s.result() for s in states]


def replay_engine(
    engine: int,
    requests: Sequence[ReplayRequest],
    scheduler: StepScheduler,
    price: Callable[[ScheduledBatch], float],
) -> EngineReplay:
    """Run one engine over `requests` (any order) until every one has finished."""
    reqs = [r._replace(engine=0) for r in requests]
    (out,) = replay_ranks([(engine, scheduler)], reqs, lambda b, _tokens: price(b))
    return out


def batch_pricer(
    pricer: IterationPricer, overhead: IterationOverhead | None = None
) -> Callable[[ScheduledBatch, float], float]:
    """Seconds of a batch, given the tokens of its EP group (the pricer's `group_tokens`)."""
    over = overhead or NO_OVERHEAD

    def price(batch: ScheduledBatch, group_tokens: float) -> float:
        return iteration_time(pricer, batch.prefill_chunks, batch.decode_kv, group_tokens, over)

    return price


def group_pricer(
    pricer: IterationPricer, overhead: IterationOverhead | None = None, cuda_graph_tokens: int = 0
) -> GroupPrice:
    """Seconds of one step of DP ranks in step (`pricing.lockstep_time`); None: a dummy."""
    over = overhead or NO_OVERHEAD

    def price(batches: Sequence[ScheduledBatch | None]) -> float:
        runs = [None if b is None else (b.prefill_chunks, b.decode_kv) for b in batches]
        return lockstep_time(pricer, runs, over, cuda_graph_tokens)

    return price


def steps_together(settings: EngineSettings, pricer: IterationPricer) -> bool:
    """Whether the DP ranks step together: an MoE model with expert parallelism."""
    dp = settings.data_parallel_size
    return dp > 1 and settings.expert_parallel_size > 1 and pricer.shape.is_moe


def replay(
    requests: Sequence[ReplayRequest],
    settings: EngineSettings,
    kv_blocks: int,
    pricer: IterationPricer,
    overhead: IterationOverhead | None = None,
) -> list[EngineReplay]:
    """Replay `requests` on `settings.data_parallel_size` engines of `kv_blocks` blocks each."""
    ranks = []
    for rank in range(settings.data_parallel_size):
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
        ranks.append((rank, sched))
    together = None
    if steps_together(settings, pricer):
        together = group_pricer(pricer, overhead, settings.cuda_graph_max_batch or 0)
    if settings.data_parallel_size == 1:
        requests = [r._replace(engine=0) if r.engine is None else r for r in requests]
    return replay_ranks(ranks, requests, batch_pricer(pricer, overhead), together)
