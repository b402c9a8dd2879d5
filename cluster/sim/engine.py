"""Simulated symmetric engines: requests, per-node KV tiers and batches (paper 000 §4.1–4.2).

Every node can serve either phase. A node keeps GPU KV (L1, LRU) and host KV (L2, written
through, evicted by the configured policy) and publishes what it stores and evicts as KV
events; the shared pool lets prefill nodes fetch a peer's L2 while a request queues. This
module holds the state; `simulator.py` drives it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cluster.core import BlockHash, Phase
from cluster.eviction import EvictionPolicy, LRUEviction, TierCache

if TYPE_CHECKING:
    from cluster.sim.simulator import ProgramRun


class SimRequest:
    """One LLM request (a turn). `t_out` is hidden from policies: only the engine reads it."""

    __slots__ = (
        "attn_pairs",
        "branch_id",
        "decode_left",
        "decode_node",
        "done_uc",
        "fetch_ready_t",
        "fetch_tokens",
        "first_chunk",
        "gpu_blocks",
        "measured",
        "path",
        "prefill_node",
        "program",
        "request_id",
        "route_t_c",
        "route_t_uc",
        "run",
        "t_arrival",
        "t_c",
        "t_done",
        "t_first_token",
        "t_ideal_c",
        "t_in",
        "t_out",
        "t_prefill_start",
        "t_routed",
        "t_rst",
        "t_uc",
        "turn_index",
    )

    def __init__(
        self,
        request_id: str,
        run: ProgramRun,
        turn_index: int,
        branch_id: str,
        path: list[BlockHash],
        t_in: int,
        t_out: int,
        t_arrival: float,
        t_ideal_c: int,
    ) -> None:
        self.request_id = request_id
        self.run = run
        self.program = run.program.program_id
        self.turn_index = turn_index
        self.branch_id = branch_id
        self.path = path
        self.t_in = t_in
        self.t_out = t_out
        self.t_arrival = t_arrival
        self.t_ideal_c = t_ideal_c
        self.prefill_node = -1
        self.decode_node = -1
        self.route_t_c = 0
        self.route_t_uc = t_in
        self.fetch_tokens = 0
        self.fetch_ready_t = 0.0
        self.t_c = 0  # cached prefix at prefill start (local + fetched)
        self.t_uc = t_in
        self.t_rst = 0
        self.t_routed = t_arrival
        self.gpu_blocks = 0
        self.done_uc = 0
        self.first_chunk = True
        self.attn_pairs = 0.0
        self.t_prefill_start: float | None = None
        self.t_first_token: float | None = None
        self.t_done: float | None = None
        self.decode_left = 0
        self.measured = True


class DecodeEpoch:
    """A run of decode iterations over a fixed batch (continuous batching between events)."""

    __slots__ = ("batch", "ctx0", "ends", "iter0", "start", "token")

    def __init__(
        self,
        start: float,
        batch: list[SimRequest],
        ends: np.ndarray,
        ctx0: float,
        iter0: int,
        token: int,
    ) -> None:
        self.start = start
        self.batch = batch
        self.ends = ends  # cumulative end offsets of each iteration
        self.ctx0 = ctx0
        self.iter0 = iter0
        self.token = token


class SimNode:
    """One node: phase, KV tiers, prefill queue, chunked prefill, decode batch."""

    __slots__ = (
        "busy",
        "cleared_at",
        "decode_batch",
        "decode_iter",
        "decode_kv",
        "epoch",
        "id",
        "inbound",
        "join_queue",
        "l1",
        "l2",
        "out_of_service",
        "phase",
        "prefill_iter",
        "prefilling",
        "queue",
        "switch",
        "waiting_join",
    )

    def __init__(
        self,
        node_id: int,
        phase: Phase,
        l1_tokens: int,
        l2_tokens: int,
        policy: EvictionPolicy,
        count_of,
    ) -> None:  # type: ignore[no-untyped-def]
        self.id = node_id
        self.phase: Phase = phase
        self.l1 = TierCache(node_id, "gpu", l1_tokens, LRUEviction(), count_of)
        self.l2 = TierCache(node_id, "host", l2_tokens, policy, count_of)
        self.queue: list[SimRequest] = []  # routed, not started (FCFS)
        self.prefilling: list[SimRequest] = []  # chunked prefill in progress
        self.busy = False  # a prefill iteration is in flight
        self.prefill_iter = 0
        self.decode_iter = 0
        self.decode_batch: list[SimRequest] = []
        self.decode_kv = 0
        self.join_queue: list[SimRequest] = []  # KV arrived, waiting for the next iteration
        self.waiting_join = 0
        self.inbound = 0  # requests bound here whose KV is still in transfer
        self.epoch: DecodeEpoch | None = None
        self.switch: tuple[Phase, str, float, int] | None = None  # (to, mode, t_decided, running)
        self.out_of_service = False
        self.cleared_at = -1.0

    def prefix_blocks(self, cache: TierCache, path: list[BlockHash]) -> int:
        """Leading blocks of `path` in `cache` (holdings are prefix-closed)."""
        entries = cache.entries
        n = len(path)
        if n == 0 or path[0] not in entries:
            return 0
        if path[n - 1] in entries:
            return n
        lo, hi = 1, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if path[mid] in entries:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @property
    def decode_kv_tokens(self) -> int:
        """KV tokens the running decode batch holds in GPU memory (input + full output)."""
        return self.decode_kv

    def idle(self) -> bool:
        """No work of any phase in flight (a switching node completes its switch then)."""
        return (
            not self.busy
            and not self.prefilling
            and not self.queue
            and not self.decode_batch
            and not self.join_queue
            and self.inbound == 0
            and self.epoch is None
        )
