"""Simulated symmetric engines: requests, per-node KV tiers and batches (paper 000 §4.1–4.2).

Every node can serve either phase. A node keeps GPU KV (L1, LRU) and host KV (L2, written
through, evicted by the configured policy) and publishes what it stores and evicts as KV
events; the shared pool lets prefill nodes fetch a peer's L2 while a request queues. With a
retention policy (paper 003 §3.4) both tiers are `RetentionCache`s keyed by (1[t<d], v).
Without a host tier (`unified`, paper 003's single-engine memory-pressure regime) L1 is
the node's whole KV pool: running calls pin their blocks and reserve their other tokens in
it, and `l2` is the same object as `l1`. This module holds the state; `simulator.py`
drives it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from cluster.core import BlockHash, Phase
from cluster.eviction import (
    Evicted,
    EvictionPolicy,
    LRUTierCache,
    RecencyTierCache,
    TierCache,
)
from cluster.hashing import prefix_in

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
        "generated",
        "gpu_blocks",
        "kv_pinned",
        "kv_private",
        "measured",
        "path",
        "preemptions",
        "prefill_node",
        "priority",
        "program",
        "recompute",
        "request_id",
        "route_t_c",
        "route_t_uc",
        "run",
        "seq",
        "t_arrival",
        "t_c",
        "t_done",
        "t_first_token",
        "t_ideal_c",
        "t_in",
        "t_out",
        "t_prefill_start",
        "t_release",
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
        # Dispatch Plane: priority q (smaller first), release time r and release order.
        self.priority = 0.0
        self.t_release = t_arrival
        self.seq = 0
        # Unified KV pool: blocks this call pins, tokens it reserves outside the cache,
        # tokens generated so far, and preemption (recompute) state.
        self.kv_pinned: list[BlockHash] = []
        self.kv_private = 0
        self.generated = 0.0
        self.recompute = False
        self.preemptions = 0

    def sort_key(self) -> tuple[float, float, int]:
        """Priority order of the Dispatch Plane: q, then release time, then release order."""
        return (self.priority, self.t_release, self.seq)


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
        "epoch_reserved",
        "exact_prefix",
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
        "unified",
        "waiting_join",
    )

    def __init__(
        self,
        node_id: int,
        phase: Phase,
        l1_tokens: int,
        l2_tokens: int,
        policy: EvictionPolicy,
        count_of: Callable[[BlockHash], int],
        caches: tuple[TierCache, TierCache] | None = None,
    ) -> None:
        self.id = node_id
        self.phase: Phase = phase
        self.l1: TierCache
        self.l2: TierCache
        if caches is None:
            self.l1 = LRUTierCache(node_id, "gpu", l1_tokens, count_of)
            # The built-in policies get the heap-free exact order; a user's policy (any key)
            # gets the general heap.
            host = RecencyTierCache if RecencyTierCache.orders(policy) else TierCache
            self.l2 = host(node_id, "host", l2_tokens, policy, count_of)
        else:
            self.l1, self.l2 = caches
        self.unified = self.l2 is self.l1  # no host tier: L1 is the whole KV pool
        # Retention decisions can leave a block cached without its parent, so the planes
        # read prefixes with a scan instead of the binary search that assumes closure.
        self.exact_prefix = caches is not None
        self.epoch_reserved = 0  # unified pool: tokens reserved for the running decode epoch
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
        if self.exact_prefix:
            k = 0
            for h in path:
                if h not in entries:
                    break
                k += 1
            return k
        return prefix_in(path, entries)

    @property
    def decode_kv_tokens(self) -> int:
        """KV tokens the running decode batch holds in GPU memory (input + full output)."""
        return self.decode_kv

    # ---- the unified KV pool (no host tier): running calls' KV shares L1 with the cache ----
    def pool_need(self, req: SimRequest, bt: int) -> tuple[int, int]:
        """(cached leading blocks, tokens to reserve) for the call's (re-)prefill: its whole
        context less the cached blocks, plus generated tokens to recompute after preemption."""
        local = self.prefix_blocks(self.l1, req.path)
        extra = math.ceil(req.generated) if req.recompute else 0
        return local, max(req.t_in + extra - local * bt, 0)

    def holds_kv(self) -> bool:
        """Some call here holds KV in the pool (prefilling, decoding or about to decode)."""
        return bool(self.prefilling or self.decode_batch or self.join_queue)

    def pool_fits(self, req: SimRequest, bt: int) -> bool:
        """Could `pool_admit` succeed now (or would it be forced because nothing runs)?"""
        if not self.holds_kv():
            return True
        local, need = self.pool_need(req, bt)
        entries = self.l1.entries
        newly_pinned = sum(entries[h].tokens for h in req.path[:local] if not entries[h].pins)
        return need + newly_pinned <= self.l1.reservable_tokens  # type: ignore[attr-defined]

    def pool_admit(self, req: SimRequest, bt: int) -> list[Evicted] | None:
        """Pin the cached prefix and reserve the rest (vLLM allocates a waiting call's
        blocks when it is scheduled); None if it does not fit. A node holding no KV admits
        anyway, so a call larger than the pool still runs (over-committed)."""
        l1 = self.l1
        local, need = self.pool_need(req, bt)
        pinned = l1.pin_present(req.path[:local])  # type: ignore[attr-defined]
        evicted = l1.reserve(need, force=not self.holds_kv())  # type: ignore[attr-defined]
        if evicted is None:
            l1.unpin(pinned)
            return None
        req.kv_pinned = pinned
        req.kv_private = need
        return evicted

    def pool_prefilled(self, req: SimRequest, bt: int) -> None:
        """Prefill ended: the context's new full blocks are about to enter the cache, so
        their tokens move from the call's reservation into (pinned) blocks."""
        moved = min(max(len(req.path) - len(req.kv_pinned), 0) * bt, req.kv_private)
        self.l1.unreserve(moved)  # type: ignore[attr-defined]
        req.kv_private -= moved

    def pool_pin_path(self, req: SimRequest) -> None:
        have = set(req.kv_pinned)
        rest = [h for h in req.path if h not in have]
        req.kv_pinned = req.kv_pinned + self.l1.pin_present(rest)  # type: ignore[attr-defined]

    def pool_release(self, req: SimRequest) -> None:
        """The call no longer holds KV (completed or preempted)."""
        self.l1.unpin(req.kv_pinned)
        self.l1.unreserve(req.kv_private)  # type: ignore[attr-defined]
        req.kv_pinned = []
        req.kv_private = 0

    def inflight(self) -> int:
        """Calls queued or running here (the Dispatch Plane's load signal)."""
        return (
            len(self.queue)
            + len(self.prefilling)
            + len(self.decode_batch)
            + len(self.join_queue)
            + self.inbound
        )

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
