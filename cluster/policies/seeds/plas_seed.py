"""Seed scheduling policy: PLAS (paper 003 Listing 3; Autellix)."""

# ruff: noqa: RUF012, RUF046  (the listing verbatim)

from cluster.policies import SchedulingPolicy


# EVOLVE-BLOCK-START
class EvolvedScheduling(SchedulingPolicy):
    engine_args = {"scheduling_policy": "priority"}

    def priority(self, pcb, now):
        return int(round(pcb.attained_service_s * 1000.0))


# EVOLVE-BLOCK-END
