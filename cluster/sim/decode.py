"""Decode epochs of a simulated node (paper 000 §4.1, §5.1 Eq. 2).

Between joins and leaves the decode batch is fixed, so a run of iterations (an epoch) is
computed and logged at once: iteration times come from the hardware profile's ground truth
(with a context-length term and noise the fitted model omits; with engine limits and a
measured-grid pricer, the engine model's price of each iteration), each iteration producing
t_acc tokens per request. When the batch must change (a request's KV arrived, or prefill
work is waiting on a collocated node), the epoch is cut at the boundary of the iteration
in progress. Requests join when the node's KV memory admits them; before an epoch the
memory may name running calls to preempt (the unified pool under pressure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cluster.control.state import NodeReport
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profiles import HardwareProfile
from cluster.sim.buffer import BufferedSink
from cluster.sim.engine_model.pricing import iteration_time
from cluster.sim.entities import DecodeEpoch, SimRequest
from cluster.sim.kernel import DECODE_END, EventKernel
from cluster.sim.node import SimNode


class DecodeStage:
    """Decode epochs of every node. Wired by `cluster.sim.engine.NodeEngine`: `report`
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
        iterations: Callable[[int, int, np.ndarray, np.ndarray], None],
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

    def admit_joins(self, node: SimNode) -> None:
        """Requests whose KV arrived enter the batch (in priority order) as memory admits."""
        if not node.join_queue:
            return
        if not self.fifo:
            node.join_queue.sort(key=SimRequest.sort_key)
        admitted, node.join_queue = node.memory.admit_decode(
            node.join_queue, len(node.decode_batch), self.profile.max_decode_batch
        )
        node.decode_batch.extend(admitted)
        if self.track_waits:
            now = self.kernel.now
            for r in admitted:
                r.decode_wait += now - r.t_joined
            for r in node.join_queue:
                r.decode_refusals += 1

    def _noise(self, n: int) -> np.ndarray:
        s = self.profile.noise
        return np.exp(self.rng.normal(0.0, s, n) - s * s / 2) if s > 0 else np.ones(n)

    def start_epoch(self, node: SimNode) -> None:
        now = self.kernel.now
        k = min(r.decode_left for r in node.decode_batch)
        k = max(1, min(k, 1024))
        mem = node.memory
        victim = mem.preemption_victim(node.decode_batch)
        while victim is not None:
            self.preempt(node, victim)
            victim = mem.preemption_victim(node.decode_batch)
        k = mem.reserve_epoch(node.decode_batch, k, now)
        batch = list(node.decode_batch)
        b = len(batch)
        t_acc = self.profile.t_acc
        ctx0 = float(sum(r.t_in + (r.t_out - 1 - r.decode_left * t_acc) for r in batch))
        ctx = ctx0 + np.arange(k) * b * t_acc
        dur = self._times(batch, ctx) * self._noise(k)
        ends = np.cumsum(dur)
        self.epoch_token += 1
        node.epoch = DecodeEpoch(now, batch, ends, ctx0, node.decode_iter, self.epoch_token)
        self.report(node.report(now, 0.0))
        self.kernel.push(now + float(ends[-1]), DECODE_END, self.end, node, self.epoch_token)

    def _times(self, batch: list[SimRequest], ctx: np.ndarray) -> np.ndarray:
        """Times of the next iterations of `batch` at total contexts `ctx` (no noise): the
        profile's ground truth, or with a pricer the engine model's price of each
        iteration, every decode reading its context plus the token it feeds."""
        if self.pricer is None:
            return self.profile.decode_times(len(batch), ctx)
        t_acc = self.profile.t_acc
        kv = [round(r.t_in + (r.t_out - 1 - r.decode_left * t_acc)) + 1 for r in batch]
        out = np.empty(len(ctx))
        for j in range(len(ctx)):
            step = round(j * t_acc)
            out[j] = iteration_time(self.pricer, (), [c + step for c in kv])
        return out

    def cut_epoch(self, node: SimNode) -> None:
        """End the epoch at the boundary of the iteration in progress."""
        e = node.epoch
        assert e is not None
        done = int(np.searchsorted(e.ends, self.kernel.now - e.start, side="right"))
        keep = min(done + 1, len(e.ends))
        if keep >= len(e.ends):
            return
        e.ends = e.ends[:keep]
        self.epoch_token += 1
        e.token = self.epoch_token
        self.kernel.push(e.start + float(e.ends[-1]), DECODE_END, self.end, node, e.token)

    def end(self, node: SimNode, token: int) -> None:
        e = node.epoch
        if e is None or e.token != token:
            return  # an epoch cut since: its new end is scheduled
        n_it = len(e.ends)
        b = len(e.batch)
        starts = np.concatenate(([0.0], e.ends[:-1])) + e.start
        durs = np.diff(np.concatenate(([0.0], e.ends)))
        ctx = e.ctx0 + np.arange(n_it) * b * self.profile.t_acc
        self.out.emit(
            "decode_iterations",
            {
                "node_id": [node.id] * n_it,
                "iter_id": list(range(e.iter0, e.iter0 + n_it)),
                "t_start": starts.tolist(),
                "duration_s": durs.tolist(),
                "batch_size": [b] * n_it,
                "t_fwd": [self.profile.t_fwd] * n_it,
                "ctx_tokens": ctx.astype(np.int64).tolist(),
            },
        )
        self.iterations(node.id, b, durs, ctx)
        node.decode_iter += n_it
        node.epoch = None
        node.memory.settle_epoch(e.batch, n_it, self.kernel.now)
        still: list[SimRequest] = []
        finished: list[SimRequest] = []
        for r in e.batch:  # the batch only changes at epoch boundaries
            r.decode_left -= n_it
            (finished if r.decode_left <= 0 else still).append(r)
        node.decode_batch = still
        for r in finished:
            self.done(node, r)
        self.schedule(node)
