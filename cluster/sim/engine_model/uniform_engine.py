"""One engine serving identical requests, in aggregate: the step rules of `scheduler.StepScheduler`
at O(1) cost per admission, completion or preemption instead of O(running) per iteration.

A benchmark of fixed ISL and OSL at a fixed concurrency (AIConfigurator's silicon sample,
`pdlab validate silicon`) keeps hundreds of identical requests decoding for thousands of
iterations; `StepScheduler` visits each of them every iteration. `UniformEngine` keeps the
same state aggregated: requests waiting (FCFS), prefilling (admission order) and decoding
(a heap by the iteration they finish in), the decodes' context sum (each decode reads
ISL + g tokens after generating g, so the sum grows by their count per iteration) and the
KV blocks in use. Its rules are the scheduler's (vLLM V1; `mixed` False is SGLang's
prefill-first; `chunked` False admits only whole prompts, TensorRT-LLM's default):

1. decodes first, one token each; when the KV blocks for them are not free, the newest
   running request is preempted (recompute: it prefills its prompt and output again);
2. running prefills continue in admission order within the token budget;
3. waiting requests are admitted FCFS while seats (`max_num_seqs`), budget and KV for their
   prompt (or prompt and output with `reserve_output`, TensorRT-LLM's no-evict policy) last.

`span(limit)` runs iterations where nothing changes but the decodes' contexts (no prefill,
nothing admissible, nobody finishing or out of KV) in one call: their times are priced at
the span's first and last iteration (the grid is linear in the context between its points)
and summed. A decode-only engine (`prefill=False`: a PD decode worker) admits requests
whose KV arrived as decodes. KV in use is counted in blocks as tokens / block size plus half
a block per request (the mean partial block). tests/cluster/sim/test_uniform_engine.py holds
it to `StepScheduler` on the same workloads.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class UniformRequest:
    client: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    generated: int = 0
    computed: int = 0
    prefill_tokens: int = (
        0  # what its (next) prefill computes: the prompt, or more after a preemption
    )
    first_token_s: float | None = None
    done_s: float | None = None
    preemptions: int = 0
    base_ctx: int = 0  # while decoding, its context at iteration j is base_ctx + j
    seq: int = 0  # admission order

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"a request needs >= 1 prompt and output token, got {self.prompt_tokens}, {self.output_tokens}"
            )
        self.prefill_tokens = self.prefill_tokens or self.prompt_tokens


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int = 16
    mixed: bool = True  # prefill chunks ride with decodes (vLLM); False: prefill first (SGLang)
    chunked: bool = True  # False: a prompt is admitted only whole (TensorRT-LLM default)
    reserve_output: bool = False  # KV for prompt + output reserved at admission


class Batch:
    """One iteration: prefill chunks (request, tokens) and how many decodes at what mean context."""

    __slots__ = ("chunks", "decodes", "mean_ctx", "preempted")

    def __init__(self) -> None:
        self.chunks: list[tuple[UniformRequest, int]] = []
        self.decodes = 0
        self.mean_ctx = 0.0
        self.preempted = 0

    @property
    def tokens(self) -> int:
        return self.decodes + sum(n for _, n in self.chunks)

    def chunk_shapes(self) -> list[tuple[int, int]]:
        """(t_uc new tokens, t_c cached tokens) of each chunk, as the pricer takes them."""
        return [(n, r.computed) for r, n in self.chunks]


class UniformEngine:
    """The aggregated state of one engine (module docstring)."""

    def __init__(self, limits: EngineLimits, *, prefill: bool = True, decode: bool = True):
        if limits.max_num_seqs > limits.max_num_batched_tokens:
            raise ValueError("max_num_seqs above the token budget: decodes would not all fit")
        self.lim = limits
        self.prefill_role, self.decode_role = prefill, decode
        self.waiting: deque[UniformRequest] = deque()
        self.prefilling: list[UniformRequest] = []
        self.finishing: list[tuple[int, int, UniformRequest]] = []  # heap (last it, seq, req)
        self.decoding: dict[int, UniformRequest] = {}  # by admission order
        self.it = 0  # decode iterations run: a decode's context grows by one per iteration
        self.ctx_base_sum = 0
        self.prefill_kv = 0  # KV tokens of the prefilling requests
        self.reserved = 0  # KV tokens reserved (reserve_output)
        self.seq = 0
        self.iterations = 0

    # -- state ----------------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.decoding)

    def decode_ctx_sum(self) -> int:
        return self.ctx_base_sum + len(self.decoding) * self.it

    def _blocks(self, tokens: float, requests: int) -> float:
        bs = self.lim.block_size
        return tokens / bs + (0.5 * requests if bs > 1 else 0.0)

    def kv_used_blocks(self, growth: int = 0) -> float:
        if self.lim.reserve_output:
            return self._blocks(self.reserved, self.running)
        return self._blocks(self.prefill_kv + self.decode_ctx_sum() + growth, self.running)

    def _need_blocks(self, r: UniformRequest, tokens: int) -> float:
        return self._blocks(tokens + (r.output_tokens if self.lim.reserve_output else 0), 1)

    def add(self, r: UniformRequest) -> None:
        """A request arrives (at a decode-only engine: its KV arrived; it decodes next)."""
        self.waiting.append(r)

    # -- the decode set ----------------------------------------------------------------
    def _start_decode(self, r: UniformRequest) -> None:
        """`r` (which has generated `r.generated` tokens) decodes from the next iteration on."""
        r.base_ctx = r.prompt_tokens + r.generated - self.it
        last = self.it + (r.output_tokens - r.generated) - 1
        heapq.heappush(self.finishing, (last, r.seq, r))
        self.decoding[r.seq] = r
        self.ctx_base_sum += r.base_ctx

    def _leave_decode(self, r: UniformRequest) -> None:
        del self.decoding[r.seq]
        self.ctx_base_sum -= r.base_ctx
        if self.lim.reserve_output:
            self.reserved -= r.prefill_tokens + r.output_tokens

    def _preempt_newest(self) -> None:
        if self.prefilling:
            victim = self.prefilling.pop()
            self.prefill_kv -= victim.computed
            if self.lim.reserve_output:
                self.reserved -= victim.prefill_tokens + victim.output_tokens
        else:
            victim = self.decoding[max(self.decoding)]
            victim.generated = victim.base_ctx + self.it - victim.prompt_tokens
            self._leave_decode(victim)  # its heap entry is skipped when it surfaces
        victim.computed = 0
        victim.prefill_tokens = victim.prompt_tokens + victim.generated
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    # -- one iteration -----------------------------------------------------------------
    def schedule(self) -> Batch:
        """The next iteration's batch (module docstring); empty when idle."""
        b = Batch()
        if not self.prefill_role:
            self.admit_decodes()
        budget = self.lim.max_num_batched_tokens
        prefill_first = (
            not self.lim.mixed and self.prefill_role and bool(self.prefilling or self._admissible())
        )
        if not prefill_first and self.decoding:
            while self.decoding and self.kv_used_blocks(len(self.decoding)) > self.lim.kv_blocks:
                self._preempt_newest()
                b.preempted += 1
            b.decodes = len(self.decoding)
            if b.decodes:
                b.mean_ctx = self.decode_ctx_sum() / b.decodes
            budget -= b.decodes
        if not self.prefill_role:
            return b
        for r in self.prefilling:
            if budget <= 0:
                break
            n = min(r.prefill_tokens - r.computed, budget)
            b.chunks.append((r, n))
            budget -= n
        if not b.preempted and (self.lim.mixed or prefill_first):
            self._admit(budget, b)
        return b

    def _admissible(self) -> bool:
        if not self.waiting or self.running >= self.lim.max_num_seqs:
            return False
        r = self.waiting[0]
        return self.kv_used_blocks() + self._need_blocks(r, r.prefill_tokens) <= self.lim.kv_blocks

    def _admit(self, budget: int, b: Batch) -> None:
        while self.waiting and budget > 0 and self._admissible():
            r = self.waiting[0]
            left = r.prefill_tokens - r.computed
            if not self.lim.chunked and left > budget:
                break
            self.waiting.popleft()
            self.seq += 1
            r.seq = self.seq
            self.prefilling.append(r)
            if self.lim.reserve_output:
                self.reserved += r.prefill_tokens + r.output_tokens
            n = min(left, budget)
            b.chunks.append((r, n))
            budget -= n

    def admit_decodes(self) -> None:
        """A decode-only engine takes arrived requests while seats and KV last."""
        while self.waiting and self.running < self.lim.max_num_seqs:
            r = self.waiting[0]
            need = self._need_blocks(r, r.prompt_tokens + r.generated)
            if self.kv_used_blocks() + need > self.lim.kv_blocks and self.decoding:
                break
            self.waiting.popleft()
            self.seq += 1
            r.seq = self.seq
            if self.lim.reserve_output:
                self.reserved += r.prefill_tokens + r.output_tokens
            self._start_decode(r)

    def finish(self, b: Batch, t_end: float) -> tuple[list[UniformRequest], list[UniformRequest]]:
        """Apply an iteration that ended at `t_end`: (prefills completed, requests done)."""
        prefilled: list[UniformRequest] = []
        done: list[UniformRequest] = []
        self.iterations += 1
        for r, n in b.chunks:
            r.computed += n
            self.prefill_kv += n
        if b.decodes:
            self.it += 1
            while self.finishing and self.finishing[0][0] < self.it:
                _, seq, r = heapq.heappop(self.finishing)
                if self.decoding.get(seq) is not r:
                    continue  # preempted since
                r.generated = r.output_tokens
                r.done_s = t_end
                self._leave_decode(r)
                done.append(r)
        still = []
        for r in self.prefilling:
            if r.computed < r.prefill_tokens:
                still.append(r)
                continue
            self.prefill_kv -= r.computed
            r.generated += 1
            if r.first_token_s is None:
                r.first_token_s = t_end
            prefilled.append(r)
            if r.generated >= r.output_tokens or not self.decode_role:
                if self.lim.reserve_output:
                    self.reserved -= r.prefill_tokens + r.output_tokens
                if r.generated >= r.output_tokens:
                    r.done_s = t_end
                    done.append(r)
            else:
                self._start_decode(r)
        self.prefilling = still
        return prefilled, done

    # -- decode-only spans ---------------------------------------------------------------
    def span_steps(self) -> int:
        """Decode iterations from now that change nothing but the contexts (0: none)."""
        if self.prefilling or not self.decoding:
            return 0
        if self.waiting:
            if self.prefill_role and self._admissible():
                return 0
            if not self.prefill_role and self.running < self.lim.max_num_seqs:
                return 0
        while (
            self.finishing and self.decoding.get(self.finishing[0][1]) is not self.finishing[0][2]
        ):
            heapq.heappop(self.finishing)
        steps = self.finishing[0][0] - self.it
        if not self.lim.reserve_output:
            free = self.lim.kv_blocks - self.kv_used_blocks()
            steps = min(steps, int(free * self.lim.block_size / len(self.decoding)) - 1)
        return max(steps, 0)

    def advance_span(self, steps: int) -> None:
        """Run `steps` decode-only iterations (nobody finishes or runs out of KV in them)."""
        self.it += steps
        self.iterations += steps
