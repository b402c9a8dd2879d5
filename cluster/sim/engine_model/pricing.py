"""How an engine model prices one iteration: the twin's rule, shared with the cluster simulator.

An iteration of a chunked-prefill engine (vLLM V1) is one forward pass over its prefill
chunks and its decodes together: `iteration_time` is the measured-grid pricer's time of that
mixed batch (`cluster.hardware.pricer.IterationPricer.time`: prefill chunks of t_uc new
tokens over t_c cached ones, decodes over their contexts, the EP group's tokens for MoE)
plus `IterationOverhead`, what the engine spends outside the profiled operators. The twin's
replay (`replay.batch_pricer`) and the cluster simulator's mixed iterations on collocated
nodes with engine limits (`cluster.sim.mixed`) both price with it.
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
