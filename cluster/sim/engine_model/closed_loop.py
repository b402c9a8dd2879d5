"""A closed loop of clients on engine models: a serving benchmark at fixed concurrency (the twin).

`concurrency` clients each send an ISL-token prompt for OSL tokens and, when it completes,
the next one at once (a benchmark's `--max-concurrency`, ignoring EOS). Engines are
`uniform_engine.UniformEngine`s grouped into `Worker`s; a worker's engines step together
(the DP ranks of an MoE model with expert parallelism meet in every layer's all-to-all, as
in `replay.replay_group`): an iteration takes the slowest engine's time, priced with the
group's tokens. Each client keeps its engine (round-robin over workers, then their DP
ranks).

Aggregated serving: every worker prefills and decodes. Disaggregated (`decode` workers
given): a client's prompt is prefilled on a prefill worker, its KV moves to a decode worker
in `transfer_s`, and the first token counts from when it lands (`first_token_s`), as a PD
router streams it from the decode side; the decode worker then generates the rest.

Workers advance in time order: the one whose next iteration starts first runs it (requests
that arrived during an iteration join the next, as in vLLM's engine loop). Decode-only
stretches run as spans (`UniformEngine.span_steps`), cut where another worker could send
this one a request.

`BenchmarkProtocol` is how the benchmark drew and counted its requests: InferenceX's
(`benchmark_serving.py --num-prompts $((CONC * 10)) --max-concurrency $CONC --request-rate
inf --ignore-eos --random-range-ratio 0.8`) by default: every client starts at t = 0, ten
prompts per client in all, prompt and output lengths uniform in [0.8, 1] x ISL / OSL
(seeded), and the means over every request, the starting burst included.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from cluster.sim.engine_model.uniform_engine import Batch, UniformEngine, UniformRequest

# (chunks [(t_uc, t_c)], decodes, their mean context, the group's tokens) -> seconds
StepPrice = Callable[[list[tuple[int, int]], int, float, float], float]


@dataclass(eq=False)
class Worker:
    """Engines that step together (one per DP rank) and how an iteration is priced."""

    engines: list[UniformEngine]
    price: StepPrice
    clock_s: float = 0.0
    pending: list[tuple[float, int, int, UniformRequest]] = field(default_factory=list)
    iterations: int = 0

    @property
    def busy(self) -> bool:
        return any(not e.idle for e in self.engines)

    def next_time(self) -> float:
        if self.busy:
            return self.clock_s
        return max(self.clock_s, self.pending[0][0]) if self.pending else math.inf

    def deliver(self, t: float) -> None:
        while self.pending and self.pending[0][0] <= t:
            _, _, e, r = heapq.heappop(self.pending)
            self.engines[e].add(r)

    def step_time(self, batches: Sequence[Batch]) -> float:
        group = float(sum(b.tokens for b in batches))
        return max(
            (
                self.price(b.chunk_shapes(), b.decodes, b.mean_ctx, group)
                for b in batches
                if b.tokens
            ),
            default=0.0,
        )

    def decode_time(self, extra_steps: int) -> float:
        """One decode-only iteration `extra_steps` from now."""
        group = float(sum(len(e.decoding) for e in self.engines))
        out = 0.0
        for e in self.engines:
            n = len(e.decoding)
            if n:
                out = max(out, self.price([], n, e.decode_ctx_sum() / n + extra_steps, group))
        return out


@dataclass(frozen=True, slots=True)
class BenchmarkProtocol:
    """How many requests a benchmark sends and how their lengths vary (module docstring)."""

    requests_per_client: int = 10
    length_ratio: float = 0.8  # lengths uniform in [ratio * L, L]; 1.0: fixed
    seed: int = 0

    def lengths(self, n: int, nominal: int) -> list[int]:
        lo = max(1, int(nominal * self.length_ratio))
        if lo >= nominal:
            return [nominal] * n
        rng = np.random.default_rng([self.seed, nominal])
        return [int(x) for x in rng.integers(lo, nominal + 1, size=n)]


INFERENCEX = BenchmarkProtocol()
REPLY_S = 1e-6  # a client's round trip: positive, so its next request misses a started iteration


class ClosedLoopResult(NamedTuple):
    ttft_s: float  # mean over the requests
    tpot_s: float  # mean over the requests of (done - first token) / (output - 1)
    requests: int
    iterations: int
    sim_s: float
    preemptions: int


class _Loop:
    def __init__(
        self,
        concurrency: int,
        prompt_tokens: int,
        output_tokens: int,
        workers: list[Worker],
        decode_workers: list[Worker] | None,
        transfer_s: float,
        protocol: BenchmarkProtocol,
    ):
        self.c = concurrency
        self.workers, self.decoders = workers, decode_workers or []
        self.transfer_s = transfer_s
        self.total = concurrency * protocol.requests_per_client
        self.isl = protocol.lengths(self.total, prompt_tokens)
        self.osl = protocol.lengths(self.total, output_tokens)
        self.issued = 0
        self.seq = 0
        self.done: list[UniformRequest] = []  # in completion order
        self.preemptions = 0

    def _route(self, client: int, pool: list[Worker]) -> tuple[Worker, int]:
        w = pool[client % len(pool)]
        return w, (client // len(pool)) % len(w.engines)

    def send(self, client: int, t: float) -> None:
        if self.issued >= self.total:
            return
        r = UniformRequest(client, t, self.isl[self.issued], self.osl[self.issued])
        self.issued += 1
        self._push(*self._route(client, self.workers), t, r)

    def _push(self, w: Worker, engine: int, t: float, r: UniformRequest) -> None:
        self.seq += 1
        heapq.heappush(w.pending, (t, self.seq, engine, r))

    def _complete(self, r: UniformRequest, t: float) -> None:
        self.done.append(r)
        self.preemptions += r.preemptions
        # The client answers after it has seen the last token; by then the engine, which
        # never waits for a client, has started its next iteration: the new request joins
        # the one after (any positive round trip; REPLY_S stands for it).
        self.send(r.client, t + REPLY_S)

    def _on_iteration(
        self, w: Worker, prefilled: list[UniformRequest], done: list[UniformRequest], t: float
    ) -> None:
        if self.decoders and w in self.workers:
            for r in prefilled:
                if r.done_s is None:
                    r.first_token_s = t + self.transfer_s
                    self._push(*self._route(r.client, self.decoders), t + self.transfer_s, r)
        for r in done:
            self._complete(r, t)

    def _span(self, w: Worker, bound: float) -> bool:
        spans = [e.span_steps() for e in w.engines if not e.idle]
        if not spans or min(spans) < 2:
            return False
        steps = min(spans)
        t0 = w.decode_time(0)
        t1 = w.decode_time(steps - 1)
        total = steps * (t0 + t1) / 2
        if w.clock_s + total > bound:
            steps = int((bound - w.clock_s) / max(t0, 1e-12))
            if steps < 2:
                return False
            total = steps * (t0 + w.decode_time(steps - 1)) / 2
        for e in w.engines:
            if not e.idle:
                e.advance_span(steps)
        w.clock_s += total
        w.iterations += steps
        return True

    def run(self) -> ClosedLoopResult:
        for client in range(self.c):
            self.send(client, 0.0)
        pool = self.workers + self.decoders
        while len(self.done) < self.total:
            w = min(pool, key=Worker.next_time)
            t = w.next_time()
            if math.isinf(t):
                raise RuntimeError("closed loop stalled: no worker has work")
            w.clock_s = t
            w.deliver(t)
            others = [x.next_time() for x in pool if x is not w]
            bound = min([*others, w.pending[0][0] if w.pending else math.inf])
            if self._span(w, bound):
                continue
            batches = [e.schedule() for e in w.engines]
            dt = w.step_time(batches)
            if dt <= 0.0 and not any(b.tokens for b in batches):
                if not w.pending:
                    raise RuntimeError("closed loop stalled: a worker cannot schedule its requests")
                w.clock_s = max(w.clock_s, w.pending[0][0])
                continue
            t_end = t + dt
            w.clock_s = t_end
            w.iterations += 1
            for e, b in zip(w.engines, batches, strict=True):
                prefilled, done = e.finish(b, t_end)
                self._on_iteration(w, prefilled, done, t_end)
        return self._result(pool)

    def _result(self, pool: list[Worker]) -> ClosedLoopResult:
        meas = self.done
        first = [(r, r.first_token_s, r.done_s) for r in meas]
        ttft = sum((f or 0.0) - r.arrival_s for r, f, _ in first) / len(meas)
        tpots = [
            ((d or 0.0) - (f or 0.0)) / (r.output_tokens - 1)
            for r, f, d in first
            if r.output_tokens > 1
        ]
        tpot = sum(tpots) / len(tpots) if tpots else 0.0
        return ClosedLoopResult(
            ttft,
            tpot,
            len(meas),
            sum(w.iterations for w in pool),
            max(w.clock_s for w in pool),
            self.preemptions,
        )


def closed_loop(
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    workers: list[Worker],
    *,
    decode_workers: list[Worker] | None = None,
    transfer_s: float = 0.0,
    protocol: BenchmarkProtocol = INFERENCEX,
) -> ClosedLoopResult:
    """Run the benchmark (module docstring) until every request has completed."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    loop = _Loop(
        concurrency, prompt_tokens, output_tokens, workers, decode_workers, transfer_s, protocol
    )
    return loop.run()
