"""How an engine model prices one iteration: the twin's rule, shared with the cluster simulator.

An iteration of a chunked-prefill engine (vLLM V1) is one forward pass over its prefill
chunks and its decodes together: `iteration_time` is the measured-grid pricer's time of that
mixed batch (`cluster.hardware.pricer.IterationPricer.time`: prefill chunks of t_uc new
tokens over t_c cached ones, decodes over their contexts, the EP group's tokens for MoE)
plus `IterationOverhead`, what the engine spends outside the profiled operators. The twin's
replay (`replay.batch_pricer`) and the cluster simulator's mixed iterations on collocated
nodes with engine limits (`cluster.sim.mixed`) both price with it.

`lockstep_time` prices one iteration of the DP ranks of an MoE model with expert
parallelism (vLLM's DPEngineCoreProc): every rank runs a forward pass (a rank without work
runs vLLM's dummy batch of one token), and the ranks meet in every MoE layer's dispatch and
combine, so each layer lasts as long as its slowest rank: the iteration is
(L - 1) x the slowest rank's layer + the slowest of (its last layer + what follows it:
lm_head, sampler, CPU), with the MoE block of every rank priced over the group's tokens on
the busiest rank (`cluster.hardware.pricer`). A dummy pass is priced as vLLM runs it
(`_dummy_run` of a one-token decode that samples nothing): no lm_head or sampler
(`IterationPricer.dummy_cost`). When every rank's tokens fit the largest
CUDA graph (`cuda_graph_tokens`, vLLM's `coordinate_batch_across_dp`) each rank is padded
to the largest rank's tokens; otherwise (any rank eager) none is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.hardware.pricer import IterationPricer


@dataclass(frozen=True, slots=True)
class IterationOverhead:
    """Seconds per iteration outside the profiled operators: a + b * sequences in the batch."""

    per_iteration_s: float = 0.0
    per_sequence_s: float = 0.0

    def __call__(self, num_sequences: int) -> float:
        return self.per_iteration_s + self.per_sequence_s * num_sequences


NO_OVERHEAD = IterationOverhead()


def iteration_time(
    pricer: IterationPricer,
    prefill_chunks: Sequence[tuple[int, int]],
    decode_kv: Sequence[int],
    group_tokens: float | None = None,
    overhead: IterationOverhead = NO_OVERHEAD,
) -> float:
    """Seconds of one iteration of `prefill_chunks` [(t_uc, t_c), ...] and decodes reading
    `decode_kv` tokens of context each (their cached tokens plus the one each feeds)."""
    cost = pricer.time(prefill_chunks, decode_kv, group_tokens)
    return cost + overhead(len(prefill_chunks) + len(decode_kv))


Batch = tuple[Sequence[tuple[int, int]], Sequence[int]]  # (prefill_chunks, decode_kv)
DUMMY_BATCH: Batch = ((), (1,))  # vLLM's execute_dummy_batch: one token, no context


def lockstep_time(
    pricer: IterationPricer,
    batches: Sequence[Batch | None],
    overhead: IterationOverhead = NO_OVERHEAD,
    cuda_graph_tokens: int = 0,
) -> float:
    """Seconds of one iteration of DP ranks in step, one batch per rank (None: the rank
    has no work and runs the dummy batch); see the module docstring."""
    runs = [DUMMY_BATCH if b is None else b for b in batches]
    tokens = [sum(u for u, _ in c) + len(d) for c, d in runs]
    seqs = [0 if b is None else sum(1 for u, _ in b[0] if u > 0) + len(b[1]) for b in batches]
    widest = max(tokens)
    padded = 0 < widest <= cuda_graph_tokens
    group = float(widest * len(runs) if padded else sum(tokens))
    layers = pricer.shape.num_layers
    per_layer, last = [], []
    for b, (chunks, kv), n, s in zip(batches, runs, tokens, seqs, strict=True):
        n_dense = widest if padded else n
        pad = float(n_dense) if padded else None
        cost = pricer.dummy_cost(group, pad) if b is None else pricer.cost(chunks, kv, group, pad)
        outside = pricer.outside_layers_time(n_dense, s) + overhead(s)
        layer = (cost.total - pricer.outside_layers_time(n_dense, s)) / layers
        per_layer.append(layer)
        last.append(layer + outside)
    return (layers - 1) * max(per_layer) + max(last)
