"""An engine model with vLLM V1 scheduling semantics, priced by measured operator timings.

- `sequence.EngineRequest`: one request's progress (tokens computed, generated, KV blocks);
- `block_pool.BlockPool`: the engine's KV capacity in blocks, allocated as tokens grow;
- `scheduler.StepScheduler`: one iteration's batch under `max_num_seqs` and the token budget
  `max_num_batched_tokens` (running requests first, then waiting ones FCFS, chunked
  prefill), with recompute preemption when KV runs out;
- `replay.replay`: a standalone event loop over one engine per DP rank, each iteration
  priced by `pricing.iteration_time` over `cluster.hardware.pricer.IterationPricer` (the
  twin, `pdlab twin`; the cluster simulator's mixed iterations price the same way); the DP
  ranks of an MoE model with expert parallelism step together (`pricing.lockstep_time`),
  and requests without a recorded rank go where vLLM's DP load balancer would send them
  (`dp_balance.DPBalancer`).
"""

from cluster.sim.engine_model.block_pool import BlockPool
from cluster.sim.engine_model.dp_balance import DPBalancer
from cluster.sim.engine_model.pricing import IterationOverhead, iteration_time, lockstep_time
from cluster.sim.engine_model.replay import (
    EngineReplay,
    ReplayRequest,
    replay,
    replay_engine,
)
from cluster.sim.engine_model.scheduler import ScheduledBatch, StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest

__all__ = [
    "BlockPool",
    "DPBalancer",
    "EngineReplay",
    "EngineRequest",
    "IterationOverhead",
    "ReplayRequest",
    "ScheduledBatch",
    "StepScheduler",
    "iteration_time",
    "lockstep_time",
    "replay",
    "replay_engine",
]
