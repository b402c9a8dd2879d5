"""The simulated engines: queueing, scheduling, KV transfer and preemption (paper 000 §4).

`NodeEngine` runs every node's work: a routed request waits in its prefill node's queue
(in priority order; FCFS keeps arrival order) while KV fetched from peers' host memory
arrives (async fetch, §4.2); chunked prefill (`PrefillStage`) and decode epochs
(`DecodeStage`) alternate per node as `schedule` decides (with engine limits a collocated
node runs vLLM V1's mixed iterations instead, `MixedStage`: its decodes and prefill chunks
in one forward pass, decode epochs only while no prefill may start); at prefill end the request's KV
moves to its decode node (write-through to the pool, then a transfer delay) and joins the
decode batch there. Under memory pressure the unified pool's victim is preempted: it
frees its KV and waits at the front of the queue to be recomputed (vLLM). With engine
limits (`SimConfig.engine_limits`) a decode node's newest running request is preempted
when its KV runs out, and the decode node recomputes it (a prefill iteration of its own)
once its KV fits again; prefill iterations take at most `max_num_seqs` sequences and the
token budget, and decode batches at most `max_num_seqs` requests (the rest wait).

The engine talks to the control plane as a live engine's gateway would (decode binding,
prefill/transfer done, state reports) and signals everything else upward through
callbacks the composition root wires: `on_request_done`, `on_switch_ready` (a switching
node went idle), `on_computed` (blocks some request produced: the ideal cache) and the
iteration logs of the warmup fit. A prefill start and a preemption are recorded on the
request's PCB where they happen (`record_prefill_start`, `record_preemption`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import numpy as np

from cluster.control import ControlPlane, RouteRequest
from cluster.core import BlockHash
from cluster.sim.decode import DecodeStage
from cluster.sim.entities import SimRequest
from cluster.sim.kernel import DECODE_END, FETCH, TRANSFER, EventKernel
from cluster.sim.mixed import MixedStage
from cluster.sim.node import SimNode
from cluster.sim.prefill import PrefillStage
from cluster.sim.stage import StageContext
from models.overheads import OverheadSampler


def _unwired(*args: object) -> None:
    raise RuntimeError("NodeEngine callback not wired (see cluster.sim.simulator)")


class NodeEngine:
    """See module docstring. `nodes` is shared with the composition root."""

    def __init__(
        self,
        ctx: StageContext,
        cp: ControlPlane,
        on_prefill_iteration: Callable[[int, float, float, float, float, float], None],
        on_decode_iterations: Callable[[int, int, Sequence[float], Sequence[float]], None],
    ) -> None:
        kernel, profile, out, nodes = ctx.kernel, ctx.profile, ctx.out, ctx.nodes
        rng = np.random.default_rng(ctx.cfg.seed)
        fifo, limits, max_num_seqs = ctx.run.fifo, ctx.cfg.engine_limits, ctx.cfg.max_num_seqs
        self.kernel: EventKernel = kernel
        self.cp = cp
        self.profile = profile
        self.nodes = nodes
        self.fifo = fifo
        self.limits = limits
        self.bt = profile.block_tokens
        self.preemptions = 0
        self.queue_wait: dict[int, list[float]] = {n: [] for n in nodes}
        # With engine limits, a profile's measured-grid pricer prices every iteration as the
        # engine model does (engine_model.pricing); the fitted forms otherwise.
        pricer = profile.pricer if limits else None
        # Upward signals, wired by the composition root.
        self.on_request_done: Callable[[SimRequest], None] = _unwired
        self.on_switch_ready: Callable[[SimNode], None] = _unwired
        self.on_computed: Callable[[list[BlockHash]], None] = _unwired
        self.prefill = PrefillStage(
            kernel,
            cp,
            profile,
            rng,
            out,
            nodes,
            self.queue_wait,
            finished=self._prefill_finished,
            schedule=self.schedule,
            iteration=on_prefill_iteration,
            max_num_seqs=max_num_seqs,
            limits=limits,
            pricer=pricer,
        )
        self.decode = DecodeStage(
            kernel,
            profile,
            rng,
            out,
            fifo,
            report=cp.on_report,
            done=self._done,
            preempt=self.preempt,
            schedule=self.schedule,
            iterations=on_decode_iterations,
            track_waits=limits,
            pricer=pricer,
        )
        self.mixed = MixedStage(kernel, profile, self.prefill, self.decode)
        self.overheads: OverheadSampler | None = None

    def set_overheads(self, sampler: OverheadSampler | None) -> None:
        """Price a live cluster's serving overheads (models.overheads) where a request
        spends them: an idle prefill node's wake-up and every iteration's CPU overhead
        (the stages), the KV hand-off (in place of the profile's transfer time when it was
        measured), an idle decode node's join, and the first and last token's way out
        to the client (TTFT and completion move by them; the node is free already)."""
        self.overheads = sampler
        self.prefill.overheads = sampler
        self.decode.overheads = sampler
        self.decode.on_joined = None if sampler is None else self._first_out

    # ---- queueing -------------------------------------------------------------------------
    def enqueue(self, req: SimRequest, node_id: int, cached: int, fetch: int) -> None:
        """A routed request reaches its prefill node (its peers' KV starts to move)."""
        node = self.nodes[node_id]
        now = self.kernel.now
        req.prefill_node = node_id
        req.t_routed = now
        req.route_t_c = cached + fetch
        req.route_t_uc = max(req.t_in - req.route_t_c, 1)
        req.fetch_tokens = fetch
        if fetch and self.cp.config.kv_fetch == "async":
            req.fetch_ready_t = now + self.profile.fetch_time(fetch)
            self.kernel.push(req.fetch_ready_t, FETCH, self._fetch_done, req, node_id)
        else:
            req.fetch_ready_t = now
        self._queue_insert(node, req)
        self.schedule(node)

    def take_queue(self, node: SimNode) -> list[SimRequest]:
        """Remove and return the node's queued requests (a switch hands them to peers);
        requests it preempted stay: they are running work, recomputed and finished here."""
        if not self.limits:
            moved, node.queue = node.queue, []
            return moved
        moved = [r for r in node.queue if not r.recompute]
        node.queue = [r for r in node.queue if r.recompute]
        return moved

    def _queue_insert(self, node: SimNode, req: SimRequest, front: bool = False) -> None:
        """FCFS (the default) appends; other policies keep the queue sorted by q, release."""
        if self.fifo:
            if front:
                node.queue.insert(0, req)
            else:
                node.queue.append(req)
        else:
            bisect.insort(node.queue, req, key=SimRequest.sort_key)

    def _fetch_done(self, req: SimRequest, node_id: int) -> None:
        if req.prefill_node != node_id or req.t_prefill_start is not None:
            return  # re-routed meanwhile, or already started
        node = self.nodes[node_id]
        node.memory.fetch(req.path[: req.route_t_c // self.bt], self.kernel.now)
        self.schedule(node)

    # ---- scheduling -----------------------------------------------------------------------
    def schedule(self, node: SimNode) -> None:
        """Start the node's next iteration, if it is free and has work of a phase it serves."""
        if node.out_of_service or node.busy:
            return
        collocated = self.cp.collocated
        # With engine limits a decode node recomputes the requests it preempted.
        serves_prefill = collocated or node.phase == "prefill" or (self.limits and bool(node.queue))
        if node.epoch is not None:
            # A joiner cuts the epoch to enter the batch (with limits: if it has a seat).
            joins = bool(node.join_queue) and not (
                self.limits and len(node.decode_batch) >= self.profile.max_decode_batch
            )
            if joins or (serves_prefill and self.prefill.ready(node)):
                self.decode.cut_epoch(node)
            return
        if collocated and self.limits:
            # vLLM V1: the running decodes and prefill chunks in one iteration (mixed).
            self.decode.admit_joins(node)
            if self.prefill.ready(node) and self.mixed.start(node):
                return
            if node.decode_batch:
                self.decode.start_epoch(node)
                return
        else:
            if (serves_prefill or node.prefilling) and self.prefill.ready(node):
                self.prefill.start(node)
                return
            if collocated or node.phase == "decode" or node.decode_batch or node.join_queue:
                self.decode.admit_joins(node)
                if node.decode_batch:
                    self.decode.start_epoch(node)
                    return
        if node.switch is not None and node.idle():
            self.on_switch_ready(node)

    # ---- prefill end, transfer, completion -------------------------------------------------
    def _prefill_finished(self, node: SimNode, req: SimRequest) -> None:
        now = self.kernel.now
        start = req.t_c // self.bt
        node.memory.prefilled(req, start, now)
        self.on_computed(req.path[start:])
        if req.recompute:
            req.recompute = False
            self._join(node, req)  # resumes decoding where the preemption left it
            return
        over = self.overheads
        # With serving overheads a PD request's first token reaches the client through its
        # decode node (`_first_out`), as SGLang's PD proxy streams it.
        req.t_first_token = now if over is None else None
        if over is not None:
            req.answer_t = now + self._draw("prefill_out", req)
        rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, now)
        self.cp.on_prefill_done(rr, node.id, now)
        dnode = self.nodes[req.decode_node]
        if req.t_out <= 1:
            emit_s = out_s = 0.0
            if dnode is not node:
                dnode.inbound -= 1
                node.memory.hand_off(req, now)  # nothing to send: its KV is let go here
                if over is not None:  # the decode engine answers once it has the KV
                    emit_s = self._draw("handoff", req)
            if over is not None:
                req.t_first_token = now + emit_s + self._draw("first_out", req)
                out_s = max(emit_s, req.answer_t - now) + self._draw("last_out", req)
            self._done(dnode, req, decoded=False, out_s=out_s)
            return
        req.decode_left = math.ceil((req.t_out - 1) / self.profile.t_acc)
        if dnode is node:
            if over is not None:
                req.t_first_token = now + self._draw("first_out", req)
            self._join(node, req)
            return
        # Decode nodes keep running requests' KV in GPU memory and write it through to the
        # pool; they reuse nothing from their own GPU memory, so the whole context moves.
        if over is not None and over.has("handoff"):
            delay = self._draw("handoff", req)  # measured: hand-over and transfer together
        else:
            delay = self.profile.transfer_base_s + self.profile.transfer_s_per_token * req.t_in
        self.kernel.push(now + delay, TRANSFER, self._transfer_done, req)

    def _transfer_done(self, req: SimRequest) -> None:
        dnode = self.nodes[req.decode_node]
        dnode.inbound -= 1
        now = self.kernel.now
        # The prefill node held the call's KV until it was sent.
        self.nodes[req.prefill_node].memory.hand_off(req, now)
        dnode.memory.receive(req.path, now)
        self.cp.on_transfer_done(req.branch_id, dnode.id, now)
        over = self.overheads
        if (
            over is not None
            and over.has("join")
            and dnode.epoch is None
            and not (dnode.decode_batch or dnode.join_queue)
        ):
            # An idle live decode engine wakes up and loads the KV before the request
            # joins; behind a running batch the join waits for the iteration instead.
            self.kernel.push(now + self._draw("join", req), TRANSFER, self._join, dnode, req)
            return
        self._join(dnode, req)

    def _join(self, node: SimNode, req: SimRequest) -> None:
        req.t_joined = self.kernel.now
        node.join_queue.append(req)
        self.schedule(node)

    def _first_out(self, req: SimRequest) -> None:
        """A request joined its decode batch: its first token goes out to the client."""
        if req.t_first_token is None:
            req.t_first_token = self.kernel.now + self._draw("first_out", req)

    def _draw(self, stage: str, req: SimRequest) -> float:
        """A duration of `stage` for `req` (from its row of the joint stages, if any)."""
        assert self.overheads is not None
        return self.overheads.draw(stage, row=req.overhead_row)

    def _done(
        self, node: SimNode, req: SimRequest, decoded: bool = True, out_s: float | None = None
    ) -> None:
        """The request's last token is out on `node` (its decode node); with serving
        overheads the client has it `out_s` later (default: once the prefill engine's
        answer is in too, a `last_out` draw later: a PD proxy finishes a request then)."""
        now = self.kernel.now
        node.memory.end_call(req, decoded, now)
        over = self.overheads
        if over is None:
            self.on_request_done(req)
        else:
            if out_s is None:
                out_s = max(req.answer_t - now, 0.0) + self._draw("last_out", req)
            self.kernel.push(now + out_s, DECODE_END, self._complete, req)
        if node.switch is not None and node.idle():
            self.on_switch_ready(node)

    def _complete(self, req: SimRequest) -> None:
        self.on_request_done(req)

    def preempt(self, node: SimNode, req: SimRequest) -> None:
        """Recompute preemption (vLLM): the call frees its KV and waits to be re-prefilled
        (prompt plus the tokens generated so far), then resumes decoding."""
        self.decode.leave(node, req)
        node.memory.release(req)
        req.recompute = True
        req.done_uc = 0
        req.fetch_ready_t = self.kernel.now
        req.preemptions += 1
        self.preemptions += 1
        req.run.pcb.record_preemption()
        self._queue_insert(node, req, front=True)
