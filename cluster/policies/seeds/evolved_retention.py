"""Evolved retention policy (paper 003 Listing 2, Eq. 7)."""

from cluster.policies import RetentionPolicy


# EVOLVE-BLOCK-START
class EvolvedRetention(RetentionPolicy):
    TAU_S = 2.0

    def __init__(self):
        self.gap_ema = {}

    def on_turn_complete(self, pcb, request_id, now):
        est = self.gap_ema.get(pcb.tool_name, self.TAU_S)
        scale = max(0.5, pcb.context_tokens / 20000.0)
        tau = est * scale
        u = self.signals.kv_utilization
        if u is not None:
            tau *= max(0.3, 1.0 - u)
        return ("protect", now + tau)

    def on_turn_arrival(self, pcb, now):
        g = pcb.gap_elapsed_s(now)
        if g is not None and pcb.tool_name is not None:
            p = self.gap_ema.get(pcb.tool_name)
            self.gap_ema[pcb.tool_name] = g if p is None else 0.8 * p + 0.2 * g
        return "release"


# EVOLVE-BLOCK-END
