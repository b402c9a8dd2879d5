"""Decode epochs of a simulated node (paper 000 §4.1, §5.1 Eq. 2).

Between joins and leaves the decode batch is fixed, so a run of iterations (an epoch) is
computed and logged at once: iteration times come from the hardware profile's ground truth
(with a context-length term and noise the fitted model omits; with engine limits and a
measured-grid pricer, the engine model's price of each iteration), each iteration producing
t_acc tokens per request. When the batch must change (a request's KV arrived, or prefill
work is waiting on a collocated node), the epoch is cut at the boundary of the iteration
in progress. Requests join when the node's KV memory admits them; before an epoch the
memory may name running calls to preempt (the unified pool under pressure). Each node's
batch is a `DecodeBatch` (its clock and columns): an epoch's fewest remaining iterations,
total context and finishers cost no Python loop over the batch, with the same answers.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import mul, sub

import numpy as np

from cluster.control import NodeReport
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profiles import HardwareProfile
from cluster.sim.buffer import BufferedSink
from cluster.sim.decode_batch import DecodeBatch
from cluster.sim.engine_model.pricing import iteration_time
from cluster.sim.entities import DecodeEpoch, SimRequest
from cluster.sim.kernel import DECODE_END, EventKernel
from cluster.sim.node import SimNode
from models.overheads import OverheadSampler


class DecodeStage:
    """Decode epochs of every node. Wired by `cluster.sim.node_engine.NodeEngine`: `report`
    takes the node's state report at each epoch launch, `done(node, req)` when a
    request's last token is out, `preempt(node, req)` for a call the
    memory gives up, `schedule(node)` after each epoch, and
    `iterations(node_id, batch_size, durations_s)` for the warmup fit. With `track_waits`
    (engine limits) each request adds the time it waited to join to `decode_wait`."""

    def __init__(
        self,
        kernel: EventKernel,
        profile: HardwareProfile,
        rng: np.random.Generator,
        out: BufferedSink,
        fifo: bool,
        report: Callable[[NodeReport], None],
        done: Callable[[SimNode, SimRequest], None],
        preempt: Callable[[SimNode, SimRequest], None],
        schedule: Callable[[SimNode], None],
        iterations: Callable[[int, int, Sequence[float], Sequence[float]], None],
        track_waits: bool = False,
        pricer: IterationPricer | None = None,
    ) -> None:
        self.kernel = kernel
        self.profile = profile
        self.rng = rng
        self.out = out
        self.fifo = fifo
        self.report = report
        self.done = done
        self.preempt = preempt
        self.schedule = schedule
        self.iterations = iterations
        self.track_waits = track_waits  # engine limits: time joiners wait for a seat or KV
        self.pricer = pricer  # engine limits with a measured grid: the engine model's prices
        self.epoch_token = 0
        self._base: dict[int, float] = {}  # batch size -> decode_base_s (the profile is fixed)
        self._batches: dict[int, DecodeBatch] = {}  # node id -> its decode batch's columns
        # Serving overheads (models.overheads; None: none): each iteration's CPU overhead,
        # and a joiner's first token reaching the client (`on_joined`, set with it).
        self.overheads: OverheadSampler | None = None
        self.on_joined: Callable[[SimRequest], None] | None = None

    def batch(self, node: SimNode) -> DecodeBatch:
        """The node's decode batch with its clock and columns (rebuilt, keeping every
        request's remaining iterations, if `node.decode_batch` was replaced)."""
        db = self._batches.get(node.id)
        if db is None or not db.holds(node.decode_batch):
            db = self._batches[node.id] = DecodeBatch(node.decode_batch)
        return db

    def leave(self, node: SimNode, req: SimRequest) -> None:
        """`req` leaves the node's decode batch (preempted) with its remaining iterations."""
        self.batch(node).leave(req)

    def advance(self, node: SimNode, batch: list[SimRequest], iterations: int) -> list[SimRequest]:
        """The node's decode batch, which is `batch`, ran `iterations` more: the requests
        with none left leave it and are returned in batch order."""
        db = self.batch(node)
        if db.reqs != batch:
            raise RuntimeError(f"node {node.id}: its decode batch changed during an iteration")
        return db.advance(iterations)

    def admit_joins(self, node: SimNode) -> None:
        """Requests whose KV arrived enter the batch (in priority order) as memory admits."""
        if not node.join_queue:
            return
        if not self.fifo:
            node.join_queue.sort(key=SimRequest.sort_key)
        admitted, node.join_queue = node.memory.admit_decode(
            node.join_queue, len(node.decode_batch), self.profile.max_decode_batch
        )
        self.batch(node).join(admitted)
        if self.on_joined is not None:
            for r in admitted:
                self.on_joined(r)
        if self.track_waits:
            now = self.kernel.now
            for r in admitted:
                r.decode_wait += now - r.t_joined
            for r in node.join_queue:
                r.decode_refusals += 1

    def _noise(self, n: int) -> list[float] | None:
        """The epoch's `n` multiplicative noise draws (None when the profile has none)."""
        s = self.profile.noise
        if s <= 0:
            return None
        z = self.rng.normal(0.0, s, n)
        z -= s * s / 2
        return np.exp(z, out=z).tolist()

    def start_epoch(self, node: SimNode) -> None:
        now = self.kernel.now
        k = max(1, min(self.batch(node).min_left(), 1024))
        mem = node.memory
        victim = mem.preemption_victim(node.decode_batch)
        while victim is not None:
            self.preempt(node, victim)
            victim = mem.preemption_victim(node.decode_batch)
        k = mem.reserve_epoch(node.decode_batch, k, now)
        batch = list(node.decode_batch)
        b = len(batch)
        t_acc = self.profile.t_acc
        ctx0 = self.batch(node).context(t_acc)  # decode_batch.batch_context(batch, t_acc)
        # Epochs are short (a few iterations; at most 1,024): plain floats beat numpy's
        # per-call cost, with the same IEEE operations in the same order (exact).
        ctx = [ctx0 + (j * b) * t_acc for j in range(k)]
        times = self._times(batch, ctx)
        over = self.overheads
        if over is not None:  # each iteration's CPU overhead around its forward
            times = [t + over.draw("decode_pass", b) for t in times]
        noise = self._noise(k)
        ends = list(accumulate(times if noise is None else map(mul, times, noise)))
        self.epoch_token += 1
        node.epoch = DecodeEpoch(now, batch, ends, ctx0, node.decode_iter, self.epoch_token)
        self.report(node.report(now, 0.0))
        self.kernel.push(now + ends[-1], DECODE_END, self.end, node, self.epoch_token)

    def _times(self, batch: list[SimRequest], ctx: list[float]) -> list[float]:
        """Times of the next iterations of `batch` at total contexts `ctx` (no noise): the
        profile's ground truth, or with a pricer the engine model's price of each
        iteration, every decode reading its context plus the token it feeds."""
        if self.pricer is None:
            b = len(batch)
            base = self._base.get(b)
            if base is None:
                base = self._base[b] = self.profile.decode_base_s(b)
            per_token = self.profile.decode_ctx_s_per_token
            return [base + per_token * c for c in ctx]
        t_acc = self.profile.t_acc
        kv = [round(r.t_in + (r.t_out - 1 - r.decode_left * t_acc)) + 1 for r in batch]
        return [
            iteration_time(self.pricer, (), [c + round(j * t_acc) for c in kv])
            for j in range(len(ctx))
        ]

    def cut_epoch(self, node: SimNode) -> None:
        """End the epoch at the boundary of the iteration in progress."""
        e = node.epoch
        assert e is not None
        done = bisect_right(e.ends, self.kernel.now - e.start)
        keep = min(done + 1, len(e.ends))
        if keep >= len(e.ends):
            return
        e.ends = e.ends[:keep]
        self.epoch_token += 1
        e.token = self.epoch_token
        self.kernel.push(e.start + e.ends[-1], DECODE_END, self.end, node, e.token)

    def end(self, node: SimNode, token: int) -> None:
        e = node.epoch
        if e is None or e.token != token:
            return  # an epoch cut since: its new end is scheduled
        ends = e.ends
        n_it = len(ends)
        b = len(e.batch)
        t_acc = self.profile.t_acc
        ctx0 = e.ctx0
        ctx = [ctx0 + (j * b) * t_acc for j in range(n_it)]
        durs = [ends[0], *map(sub, ends[1:], ends)]
        out = self.out
        if out.wants("decode_iterations"):
            start = e.start
            out.emit(
                "decode_iterations",
                {
                    "node_id": [node.id] * n_it,
                    "iter_id": list(range(e.iter0, e.iter0 + n_it)),
                    "t_start": [start, *(start + x for x in ends[:-1])],
                    "duration_s": durs,
                    "batch_size": [b] * n_it,
                    "t_fwd": [self.profile.t_fwd] * n_it,
                    "ctx_tokens": [int(c) for c in ctx],
                },
            )
        self.iterations(node.id, b, durs, ctx)
        node.decode_iter += n_it
        node.epoch = None
        node.worked_t = self.kernel.now
        node.memory.settle_epoch(e.batch, n_it, self.kernel.now)
        # the batch only changes at epoch boundaries: its requests advance n_it iterations
        for r in self.advance(node, e.batch, n_it):
            self.done(node, r)
        self.schedule(node)
