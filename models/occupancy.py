"""Request occupancy and node service rates (paper 000 §5.1, Eq. 3–4).

Prefill (Eq. 3): T_P^req(w) = c0*t_uc/t_bar + c1*t_uc + c2*A + c3*f*t_c
Decode  (Eq. 4): T_D^req(w) = T_D(B) * t_out / (B * t_acc)
mu = 1 / T^req. t_bar is the node's mean new tokens per prefill iteration and f the fraction
of cached tokens it restores from host memory; the planner remeasures both.

With the evidence-chosen forms (models.forms): a prefill floor (knee_tokens) makes each token
of an iteration of t_bar < knee tokens cost c1*knee/t_bar; the roofline's KV read c4 charges
the request's cached prefix and its expert term c5*phi(t_bar) is shared like c0; a decode
context term d3 charges the batch's context, B requests of t_in + t_out/2 tokens each on
average over a decode.

A live engine's loop also spends CPU around every pass (`PassOverhead`, models.overheads'
prefill_pass / decode_pass stages): o0 per pass and o1 per further sequence in it. Eq. 3
then charges o0*t_uc/t_bar (the request's share of its passes, like c0) plus o1 (its own
bookkeeping), Eq. 4 prices each iteration at T_D(B) + o0 + o1*(B - 1). Without overheads
(the default) both are the paper's equations exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from models.iteration import DecodeModel, PrefillModel, phi
from models.work import MeanWork, RequestWork


@dataclass(frozen=True, slots=True)
class PassOverhead:
    """A pass's CPU overhead outside the forward: per_pass_s + per_seq_s * (sequences - 1)."""

    per_pass_s: float = 0.0
    per_seq_s: float = 0.0

    def __bool__(self) -> bool:
        return self.per_pass_s > 0.0 or self.per_seq_s > 0.0

    def at(self, seqs: float) -> float:
        return self.per_pass_s + self.per_seq_s * max(seqs - 1.0, 0.0)


@dataclass(frozen=True, slots=True)
class NodeModel:
    """Fitted models of one node plus its remeasured t_bar and f."""

    prefill: PrefillModel
    decode: DecodeModel
    mean_new_tokens: float = 8192.0  # t_bar
    restore_fraction: float = 0.0  # f
    prefill_overhead: PassOverhead = PassOverhead()
    decode_overhead: PassOverhead = PassOverhead()

    def __post_init__(self) -> None:
        if self.mean_new_tokens <= 0:
            raise ValueError(f"mean_new_tokens (t_bar) must be > 0, got {self.mean_new_tokens}")
        if not 0.0 <= self.restore_fraction <= 1.0:
            raise ValueError(f"restore_fraction (f) must be in [0, 1], got {self.restore_fraction}")

    def remeasured(self, mean_new_tokens: float, restore_fraction: float) -> NodeModel:
        return replace(self, mean_new_tokens=mean_new_tokens, restore_fraction=restore_fraction)

    def prefill_request_time(self, work: RequestWork | MeanWork) -> float:
        """Eq. 3: seconds the request occupies this node in prefill."""
        p = self.prefill
        c1 = p.c1 * max(1.0, p.knee_tokens / self.mean_new_tokens) if p.knee_tokens else p.c1
        t = (
            p.c0 * work.t_uc / self.mean_new_tokens
            + c1 * work.t_uc
            + p.c2 * work.attn_pairs
            + p.c3 * self.restore_fraction * work.t_c
        )
        if p.c4 or p.c5:
            # KV read of the cached prefix; the experts an iteration of t_bar tokens touches,
            # shared by its t_bar tokens like c0.
            experts = float(phi(self.mean_new_tokens, p.top_k, p.num_experts))
            t += p.c4 * work.t_c + p.c5 * experts * work.t_uc / self.mean_new_tokens
        if self.prefill_overhead:
            t += self.prefill_overhead_s(work.t_uc)
        return t

    def prefill_overhead_s(self, t_uc: float) -> float:
        """The request's share of its prefill passes' CPU overhead (module docstring)."""
        o = self.prefill_overhead
        return o.per_pass_s * t_uc / self.mean_new_tokens + o.per_seq_s

    def decode_request_time(self, work: RequestWork | MeanWork, batch_size: float) -> float:
        """Eq. 4: seconds the request occupies this node in decode at batch size B."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        ctx = batch_size * (work.t_in + work.t_out / 2.0) if self.decode.d3 else 0.0
        it = self.decode.iteration_time(batch_size, ctx_tokens=ctx)
        if self.decode_overhead:
            it += self.decode_overhead.at(batch_size)
        return it * work.t_out / (batch_size * work.t_acc)

    def prefill_rate(self, work: RequestWork | MeanWork) -> float:
        """mu_P = 1 / T_P^req (requests per second)."""
        t = self.prefill_request_time(work)
        return float("inf") if t <= 0 else 1.0 / t

    def decode_rate(self, work: RequestWork | MeanWork, batch_size: float) -> float:
        """mu_D = 1 / T_D^req (requests per second)."""
        t = self.decode_request_time(work, batch_size)
        return float("inf") if t <= 0 else 1.0 / t
