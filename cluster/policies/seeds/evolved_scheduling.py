"""Evolved scheduling policy (paper 003 Listing 4, Eq. 8)."""

# ruff: noqa: RUF012, RUF046  (the listing verbatim)

import math

from cluster.policies import SchedulingPolicy


# EVOLVE-BLOCK-START
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}
    PREFILL_MS_PER_TOKEN = 0.03
    RESIDENT_MS_PER_TOKEN = 0.10

    def priority(self, pcb, now):
        base = math.sqrt(max(0.0, pcb.attained_service_s)) * 1000.0
        size_term = pcb.context_tokens * self.PREFILL_MS_PER_TOKEN
        kv_bonus = pcb.context_tokens * self.RESIDENT_MS_PER_TOKEN if pcb.kv_protected else 0.0
        return int(round(base + size_term - kv_bonus))


# EVOLVE-BLOCK-END
