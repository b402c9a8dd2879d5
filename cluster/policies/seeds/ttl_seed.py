"""Seed retention policy: TTL, tau = 2 s (paper 003 Listing 1; Continuum)."""

from cluster.policies import RetentionPolicy


# EVOLVE-BLOCK-START
class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def on_turn_complete(self, pcb, request_id, now):
        return ("protect", now + self.TAU_S)

    def on_turn_arrival(self, pcb, now):
        return "release"


# EVOLVE-BLOCK-END
