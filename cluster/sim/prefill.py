"""Chunked prefill of a simulated node with continuous batching (paper 000 §4.1, §5.1).

Each iteration takes up to `chunk_tokens` (8,192) uncached tokens: first the requests whose
prefill is under way, then queued requests whose fetched KV has arrived, in queue order. A
request's first chunk settles its cached prefix (local GPU and host memory, plus what was
fetched) and binds its decode node (`ControlPlane.bind_decode`). The iteration time is the
hardware profile's ground truth of Eq. 1 (sum t_uc, sum A, sum t_rst) with multiplicative
noise; with engine limits and a profile that has a measured-grid pricer (`pdlab profile
import`), the engine model's price of the chunks (`engine_model.pricing.iteration_time`). Requests whose last chunk ran are handed to `finished`; the stage reports the node's
state to the control plane at every iteration launch. With `max_num_seqs` (engine limits)
a node's running sequences (prefilling, decoding or about to decode) never exceed it: new
requests wait in the queue for a seat; and the node's running decodes take their tokens
from the budget first (vLLM V1's order; only a collocated node, or a decode node
recomputing a preempted request, has any). Chunks follow the engine model's rule
(`cluster.sim.engine_model.scheduler.tokens_granted`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cluster.control import ControlPlane, RouteRequest
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profiles import HardwareProfile
from cluster.sim.buffer import BufferedSink
from cluster.sim.engine_model.pricing import iteration_time
from cluster.sim.engine_model.scheduler import tokens_granted
from cluster.sim.entities import SimRequest
from cluster.sim.kernel import PREFILL_END, EventKernel
from cluster.sim.node import SimNode
from models.overheads import OverheadSampler

# (request, uncached tokens taken, attention pairs A, restored tokens t_rst, cached context)
Chunk = tuple[SimRequest, int, float, int, int]


def sums(batch: list[Chunk]) -> tuple[int, float, int, int]:
    """(sum t_uc, sum A, sum t_rst, sum t_c) over a batch's chunks."""
    return (
        sum(b[1] for b in batch),
        sum(b[2] for b in batch),
        sum(b[3] for b in batch),
        sum(b[4] for b in batch),
    )


class PrefillStage:
    """Prefill iterations of every node. Wired by `cluster.sim.node_engine.NodeEngine`:
    `finished(node, req)` when a request's prefill ends, `schedule(node)` after each
    iteration and `iteration(node_id, sum_uc, sum_a, sum_rst, duration_s)` for the warmup
    fit; a request's first chunk is recorded on its program's PCB."""

    def __init__(
        self,
        kernel: EventKernel,
        cp: ControlPlane,
        profile: HardwareProfile,
        rng: np.random.Generator,
        out: BufferedSink,
        nodes: dict[int, SimNode],
        queue_wait: dict[int, list[float]],
        finished: Callable[[SimNode, SimRequest], None],
        schedule: Callable[[SimNode], None],
        iteration: Callable[[int, float, float, float, float, float], None],
        max_num_seqs: int | None = None,
        limits: bool = False,
        pricer: IterationPricer | None = None,
    ) -> None:
        self.kernel = kernel
        self.cp = cp
        self.profile = profile
        self.rng = rng
        self.out = out
        self.nodes = nodes
        self.queue_wait = queue_wait
        self.finished = finished
        self.schedule = schedule
        self.iteration = iteration
        self.bt = profile.block_tokens
        self.max_num_seqs = max_num_seqs
        self.limits = limits  # engine limits: decodes share the budget, seats are counted
        self.pricer = pricer  # engine limits with a measured grid: the engine model's prices
        self.seat_waits = 0  # iterations that left a ready request queued for want of a seat
        # Serving overheads (models.overheads; None: none): an idle node's wake-up before
        # an iteration, and each iteration's CPU overhead after its forward.
        self.overheads: OverheadSampler | None = None

    def _room(self, node: SimNode) -> tuple[int, int]:
        """(prefill token budget, seats for new sequences) of the node's next iteration."""
        budget = self.profile.chunk_tokens
        if not self.limits:
            return budget, 1 << 62
        if node.decode_batch:
            budget -= math.ceil(len(node.decode_batch) * self.profile.t_fwd)
        if self.max_num_seqs is None:
            return budget, 1 << 62
        running = len(node.prefilling) + len(node.decode_batch) + len(node.join_queue)
        return budget, self.max_num_seqs - running

    def ready(self, node: SimNode) -> bool:
        """A prefill iteration could start now: one is under way, or the first queued
        request whose KV has arrived (in priority order) gets memory."""
        if self.limits:
            budget, seats = self._room(node)
            if budget <= 0 or (seats <= 0 and not node.prefilling):
                return False
        if node.prefilling:
            return True
        now = self.kernel.now
        for r in node.queue:
            if r.fetch_ready_t <= now:
                return node.memory.fits(r, node.holds_kv())
        return False

    def _noise(self) -> float:
        s = self.profile.noise
        return float(np.exp(self.rng.normal(0.0, s) - s * s / 2)) if s > 0 else 1.0

    def begin_request(self, node: SimNode, req: SimRequest) -> float:
        """A request's first chunk starts: settle its cached prefix; returns exposed fetch time."""
        bt = self.bt
        now = self.kernel.now
        mem = node.memory
        exposed = 0.0
        if self.cp.config.kv_fetch == "sync" and req.fetch_tokens:
            exposed = self.profile.fetch_time(req.fetch_tokens)
            mem.fetch(req.path[: req.route_t_c // bt], now)
        local, gpu = mem.cached_prefix(req.path)
        t_c = min(local * bt, max(req.t_in - 1, 0))
        req.t_c = t_c
        req.t_uc = req.t_in - t_c
        req.t_rst = min(max(local - gpu, 0) * bt, t_c)
        req.gpu_blocks = gpu
        if local:
            mem.touch(req.path, local, gpu, now)
        if req.recompute:
            # Re-prefill after preemption: the tokens generated so far are recomputed too;
            # the call keeps its first start, its decode binding and its queueing record.
            req.t_uc += math.ceil(req.generated)
            return exposed
        req.t_prefill_start = now
        req.run.pcb.record_prefill_start(node.id)
        if req.measured:
            self.queue_wait[node.id].append(now - req.t_routed)
        rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, now)
        d = self.cp.bind_decode(rr, node.id, req.t_in + req.t_out)
        req.decode_node = d
        if d != node.id:
            self.nodes[d].inbound += 1
        return exposed

    def start(self, node: SimNode) -> None:
        """Launch the node's next prefill iteration (if it has work that may start)."""
        batch, exposed = self.select(node)
        if not batch:
            return
        total = sums(batch)
        if self.pricer is not None:
            base = iteration_time(self.pricer, [(b[1], b[4]) for b in batch], ())
        else:
            base = self.profile.prefill_time(*total)
        dur = base * self._noise() + exposed
        over = self.overheads
        if over is None:
            self.launch(node, batch, dur, total)
            self.kernel.push(self.kernel.now + dur, PREFILL_END, self.end, node, batch)
            return
        # A live engine that was idle wakes up and schedules first (`prefill_wait`); after
        # the forward its loop spends the pass's CPU overhead before it can run another.
        if node.worked_t < self.kernel.now:
            dur += over.draw("prefill_wait", row=batch[0][0].overhead_row)
        after = over.draw("prefill_pass", len(batch))
        self.launch(node, batch, dur, total)
        self.kernel.push(self.kernel.now + dur, PREFILL_END, self.end, node, batch, after)

    def select(self, node: SimNode, admit: bool = True) -> tuple[list[Chunk], float]:
        """The chunks of the node's next iteration (those under way first, then queued
        requests that may start, unless not `admit`) and the fetch time they expose."""
        now = self.kernel.now
        budget, seats = self._room(node)
        batch: list[Chunk] = []
        exposed = 0.0
        for req in node.prefilling:
            if budget <= 0:
                break
            take = tokens_granted(req.t_uc - req.done_uc, budget)
            ctx = req.t_c + req.done_uc
            batch.append((req, take, take * ctx + take * (take + 1) / 2.0, 0, ctx))
            budget -= take
        if admit and budget > 0 and node.queue:
            mem = node.memory
            keep: list[SimRequest] = []
            blocked = False  # a call that does not get memory stops admission (vLLM)
            for req in node.queue:
                if budget <= 0 or req.fetch_ready_t > now or blocked:
                    keep.append(req)
                    continue
                if seats <= 0:  # no seat: it and those after it wait (max_num_seqs)
                    self.seat_waits += 1
                    blocked = True
                    keep.append(req)
                    continue
                if not mem.admit(req, node.holds_kv(), now):
                    blocked = True
                    keep.append(req)
                    continue
                exposed += self.begin_request(node, req)
                take = tokens_granted(req.t_uc, budget)
                seats -= 1
                ctx = req.t_c
                batch.append((req, take, take * ctx + take * (take + 1) / 2.0, req.t_rst, ctx))
                node.prefilling.append(req)
                budget -= take
            node.queue = keep
        return batch, exposed

    def launch(
        self,
        node: SimNode,
        batch: list[Chunk],
        dur: float,
        total: tuple[int, float, int, int] | None = None,
    ) -> None:
        """An iteration of `batch` lasting `dur` starts: the node is busy, the row is logged,
        the fit and the control plane hear of it (`total`: the batch's `sums`, if known).
        The caller schedules its end."""
        now = self.kernel.now
        sum_uc, sum_a, sum_rst, sum_c = total or sums(batch)
        node.busy = True
        it = node.prefill_iter
        node.prefill_iter += 1
        self._log(node.id, it, now, dur, batch, sum_uc, sum_a, sum_rst, sum_c)
        self.iteration(node.id, sum_uc, sum_a, sum_rst, dur, sum_c)
        first_cached = sum(b[4] for b in batch if b[0].done_uc == 0)
        cp = self.cp
        cp.on_prefill_iteration(node.id, now, sum_uc, first_cached, sum_rst)
        prefill_time = cp.view.prefill_time
        remaining = dur + sum(
            prefill_time(node.id, r.t_uc - r.done_uc - take, r.t_c + r.done_uc + take)
            for r, take, *_ in batch
            if r.t_uc - r.done_uc - take > 0
        )
        cp.on_report(node.report(now, remaining))
        for req, _take, a, *_ in batch:
            req.attn_pairs += a

    def _log(
        self,
        node_id: int,
        it: int,
        now: float,
        dur: float,
        batch: list[Chunk],
        sum_uc: int,
        sum_a: float,
        sum_rst: int,
        sum_c: int,
    ) -> None:
        out = self.out
        if out.discards:
            return
        out.row(
            "prefill_iterations",
            node_id=node_id,
            iter_id=it,
            t_start=now,
            duration_s=dur,
            num_reqs=len(batch),
            t_uc=sum_uc,
            attn_pairs=sum_a,
            t_rst=sum_rst,
            t_c=sum_c,
        )
        if out.wants("prefill_iteration_requests"):
            n = len(batch)
            out.emit(
                "prefill_iteration_requests",
                {
                    "node_id": [node_id] * n,
                    "iter_id": [it] * n,
                    "request_id": [b[0].request_id for b in batch],
                    "t_uc": [b[1] for b in batch],
                    "t_c": [b[4] for b in batch],
                    "t_rst": [b[3] for b in batch],
                },
            )

    def end(self, node: SimNode, batch: list[Chunk], after_s: float = 0.0) -> None:
        """The iteration ended: requests whose last chunk ran leave the prefill batch (the
        node stays busy `after_s` more: its CPU overhead, `free` ends it)."""
        if after_s > 0.0:
            for req in self.advance(node, batch):
                self.finished(node, req)
            self.kernel.push(self.kernel.now + after_s, PREFILL_END, self.free, node)
            return
        node.busy = False
        node.worked_t = self.kernel.now
        for req in self.advance(node, batch):
            self.finished(node, req)
        self.schedule(node)

    def free(self, node: SimNode) -> None:
        """The node's loop finished an iteration's CPU overhead: it may start the next."""
        node.busy = False
        node.worked_t = self.kernel.now
        self.schedule(node)

    def advance(self, node: SimNode, batch: list[Chunk]) -> list[SimRequest]:
        """Count the chunks of `batch` as computed; returns the requests whose prefill
        ended (they leave the node's prefill batch)."""
        finished = []
        for req, take, *_ in batch:
            req.done_uc += take
            if req.done_uc >= req.t_uc:
                finished.append(req)
        if finished:
            done_ids = {id(r) for r in finished}
            node.prefilling = [r for r in node.prefilling if id(r) not in done_ids]
        return finished
