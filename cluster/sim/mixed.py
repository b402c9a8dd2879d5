"""vLLM V1's mixed iterations on a collocated node with engine limits (SPEC §5, §9).

A vLLM V1 engine runs one kind of iteration: every running decode feeds its next token
and prefill chunks fill what is left of the token budget, in one forward pass. With engine
limits (`SimConfig.engine_limits`) a collocated node does the same: `MixedStage.start`
takes the node's decode batch (requests whose KV joined, up to `max_num_seqs` seats, one
token each; the newest preempted first while the next token's KV does not fit) and then
the prefill chunks `PrefillStage.select` gives within the budget the decodes left
(`tokens_granted`, seats for new sequences; no new admissions in an iteration that
preempted, as vLLM). The iteration is priced as one: with a measured-grid pricer (an
imported profile; the node's other iterations are priced by it too) by the twin's rule, `cluster.sim.engine_model.pricing.iteration_time`,
over each chunk (t_uc, t_c) and each decode's context; otherwise by the profile's
`mixed_time` (Eq. 1 + Eq. 2 sharing one constant). When it ends the decodes advance one
iteration (their KV grows, the last token ends a request) and the chunks advance their
prefills (a prefill that ends gives the first token, and the request decodes from the
next iteration).

Telemetry (SPEC §3): a mixed iteration logs one `prefill_iterations` row (its chunks, with
their `prefill_iteration_requests`) and one `decode_iterations` row (its decodes), both
with the iteration's start and whole duration, each with the node's own iteration counter;
the warmup fit hears both. Iterations without prefill work stay decode epochs
(`DecodeStage`), cut as soon as a prefill may start.
"""

from __future__ import annotations

from cluster.hardware.profiles import HardwareProfile
from cluster.sim.decode import DecodeStage
from cluster.sim.engine_model.pricing import iteration_time
from cluster.sim.entities import SimRequest
from cluster.sim.kernel import PREFILL_END, EventKernel
from cluster.sim.node import SimNode
from cluster.sim.prefill import Chunk, PrefillStage, sums


class MixedStage:
    """Mixed iterations of collocated nodes (module docstring), built by
    `cluster.sim.node_engine.NodeEngine` over its prefill and decode stages, whose callbacks
    (`finished`, `done`, `preempt`, `schedule`, the fit's) it uses."""

    def __init__(
        self,
        kernel: EventKernel,
        profile: HardwareProfile,
        prefill: PrefillStage,
        decode: DecodeStage,
    ) -> None:
        self.kernel = kernel
        self.profile = profile
        self.prefill = prefill
        self.decode = decode
        self.iterations = 0  # mixed iterations with both chunks and decodes

    def contexts(self, decodes: list[SimRequest]) -> list[int]:
        """Tokens of KV each decode holds before this iteration's token."""
        t_acc = self.profile.t_acc
        return [round(r.t_in + (r.t_out - 1 - r.decode_left * t_acc)) for r in decodes]

    def price(self, chunks: list[Chunk], ctx: list[int]) -> float:
        """Seconds of one iteration of `chunks` and decodes over contexts `ctx` (no noise)."""
        pricer = self.prefill.pricer
        if pricer is not None:
            # each decode reads its cached tokens plus the one it feeds (engine_model)
            return iteration_time(pricer, [(b[1], b[4]) for b in chunks], [c + 1 for c in ctx])
        sum_uc, sum_a, sum_rst, sum_c = sums(chunks)
        return self.profile.mixed_time(sum_uc, sum_a, sum_rst, sum_c, len(ctx), float(sum(ctx)))

    def start(self, node: SimNode) -> bool:
        """Launch the node's next iteration with its decodes and prefill chunks; False
        (nothing launched) when no chunk may run: the caller runs a decode epoch."""
        now = self.kernel.now
        mem = node.memory
        preempted = False
        victim = mem.preemption_victim(node.decode_batch) if node.decode_batch else None
        while victim is not None:
            self.decode.preempt(node, victim)
            preempted = True
            victim = mem.preemption_victim(node.decode_batch)
        chunks, exposed = self.prefill.select(node, admit=not preempted)
        if not chunks:
            return False
        decodes = list(node.decode_batch)
        if decodes:
            mem.reserve_epoch(decodes, 1, now)
            self.iterations += 1
        ctx = self.contexts(decodes)
        dur = self.price(chunks, ctx) * self.prefill._noise() + exposed
        self.prefill.launch(node, chunks, dur)
        if decodes:
            self._log_decode(node, now, dur, len(decodes), sum(ctx))
        self.kernel.push(now + dur, PREFILL_END, self.end, node, chunks, decodes)
        return True

    def _log_decode(self, node: SimNode, now: float, dur: float, b: int, ctx: int) -> None:
        self.decode.out.emit(
            "decode_iterations",
            {
                "node_id": [node.id],
                "iter_id": [node.decode_iter],
                "t_start": [now],
                "duration_s": [dur],
                "batch_size": [b],
                "t_fwd": [self.profile.t_fwd],
                "ctx_tokens": [ctx],
            },
        )
        node.decode_iter += 1
        self.decode.iterations(node.id, b, [dur], [float(ctx)])

    def end(self, node: SimNode, chunks: list[Chunk], decodes: list[SimRequest]) -> None:
        """The iteration ended: decodes advance a token, chunks their prefills; the node
        stays busy until every request is settled, then schedules its next iteration."""
        finished: list[SimRequest] = []
        if decodes:
            node.memory.settle_epoch(decodes, 1, self.kernel.now)
            finished = self.decode.advance(node, decodes, 1)
        prefilled = self.prefill.advance(node, chunks)
        for r in finished:
            self.decode.done(node, r)
        for r in prefilled:
            self.prefill.finished(node, r)
        node.busy = False
        self.prefill.schedule(node)
