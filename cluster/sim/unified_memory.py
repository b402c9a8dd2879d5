"""Unified KV memory of a simulated node: one GPU pool, no host tier (paper 003 §3.4, §4).

Paper 003's single-engine memory-pressure regime, allocated as vLLM does: a call's KV is
taken as its tokens are prefilled and generated (never from the hidden output length).
Cached blocks, the blocks running calls pin and the tokens they reserve outside the block
cache share the pool's capacity (`RetentionCache`); reclaiming follows the Retention
Plane's key. A call is admitted to prefill only if its memory fits (a node holding no KV
admits anyway, over-committed); when a decode epoch cannot get memory for even one
iteration, a running call is preempted (`preemption_victim`: under FCFS the one that joined
the running batch last, as vLLM's FCFS; else the largest priority q) and later recomputed.

On a PD split (the engines of `pdlab twin`'s what-ifs, which keep no host KV either) a
prefill node lets go of a call's KV once it has been sent to the call's decode node, and the
decode node takes the call's KV in its own pool when the call joins its batch: the received
blocks pinned, the rest reserved; a call whose KV does not fit waits, as a vLLM decode
instance's waiting requests do. A node that turns to decode keeps its cached blocks, as
reclaimable as any (there is no host tier to keep them in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cluster.core import BlockHash, KVEvent, Phase
from cluster.kv.retention_cache import RetentionCache
from cluster.policies.retention import RetentionDecision
from cluster.sim.buffer import BufferedSink
from cluster.sim.entities import SimRequest
from cluster.sim.memory import KVMemory, Publish


class UnifiedMemory(KVMemory):
    """The pool is `l1` (and `l2`, the same object). `epoch_reserved`: tokens reserved for
    the running decode epoch."""

    def __init__(
        self,
        node_id: int,
        pool: RetentionCache,
        block_tokens: int,
        t_acc: float,
        out: BufferedSink,
        publish: Publish,
        fifo: bool = False,
    ) -> None:
        super().__init__(node_id, pool, pool, block_tokens, out, publish, exact_prefix=True)
        self.pool = pool
        self.t_acc = t_acc
        self.fifo = fifo  # FCFS scheduling: preempt as vLLM's FCFS does
        self.epoch_reserved = 0

    def cached_prefix(self, path: Sequence[BlockHash]) -> tuple[int, int]:
        local = self._prefix(path, self.pool.entries)
        return local, local

    def store(
        self, path: Sequence[BlockHash], host_from: int, gpu_from: int | None, t: float
    ) -> None:
        """The blocks enter the GPU pool only (there is no host tier)."""
        start = host_from if gpu_from is None else min(host_from, gpu_from)
        if start >= len(path):
            return
        events: list[KVEvent] = []
        self._insert(self.pool, "gpu", path, start, t, events)
        if events:
            self.publish(events)

    def fetch(self, blocks: Sequence[BlockHash], t: float) -> None:
        local = self._prefix(blocks, self.pool.entries)
        self.store(blocks, local, local, t)

    def receive(self, path: Sequence[BlockHash], t: float) -> None:
        self.store(path, self._prefix(path, self.pool.entries), None, t)

    def retain(
        self, path: Sequence[BlockHash], owner: int, decision: RetentionDecision, now: float
    ) -> None:
        self._retain_in(self.pool, "gpu", path, owner, decision, now)

    # ---- running calls: pins and reservations ---------------------------------------------
    def _need(self, req: SimRequest) -> tuple[int, int]:
        """(cached leading blocks, tokens to reserve) for the call's (re-)prefill: its whole
        context less the cached blocks, plus generated tokens to recompute after preemption."""
        local = self._prefix(req.path, self.pool.entries)
        extra = math.ceil(req.generated) if req.recompute else 0
        return local, max(req.t_in + extra - local * self.bt, 0)

    def fits(self, req: SimRequest, busy: bool) -> bool:
        if not busy:
            return True
        local, need = self._need(req)
        entries = self.pool.entries
        newly_pinned = sum(entries[h].tokens for h in req.path[:local] if not entries[h].pins)
        return need + newly_pinned <= self.pool.reservable_tokens

    def admit(self, req: SimRequest, busy: bool, t: float) -> bool:
        """Pin the cached prefix and reserve the rest (vLLM allocates a waiting call's
        blocks when it is scheduled)."""
        pool = self.pool
        local, need = self._need(req)
        pinned = pool.pin_present(req.path[:local])
        evicted = pool.reserve(need, force=not busy)
        if evicted is None:
            pool.unpin(pinned)
            return False
        req.kv_pinned = pinned
        req.kv_private = need
        if evicted:
            self._evicted("gpu", evicted, t)
        return True

    def prefilled(self, req: SimRequest, start: int, t: float) -> None:
        """The context's new full blocks enter the cache: their tokens move from the call's
        reservation into blocks it pins."""
        moved = min(max(len(req.path) - len(req.kv_pinned), 0) * self.bt, req.kv_private)
        self.pool.unreserve(moved)
        req.kv_private -= moved
        self.store(req.path, start, req.gpu_blocks, t)
        have = set(req.kv_pinned)
        rest = [h for h in req.path if h not in have]
        req.kv_pinned = req.kv_pinned + self.pool.pin_present(rest)

    def admit_decode(
        self, joiners: list[SimRequest], running: int, max_batch: int
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        # A call prefilled here holds its KV already (prompt at prefill, tokens as they are
        # generated); a call whose KV was transferred here (PD) holds none yet and takes it
        # now: the blocks received pinned, the rest of its tokens reserved.
        admitted: list[SimRequest] = []
        keep: list[SimRequest] = []
        pool = self.pool
        for req in joiners:
            if running >= max_batch:
                keep.append(req)
                continue
            if req.prefill_node != self.node_id and not req.kv_pinned and not req.kv_private:
                pinned = pool.pin_present(req.path)
                need = req.t_in + math.ceil(req.generated) - len(pinned) * self.bt
                evicted = pool.reserve(need, force=not running)
                if evicted is None:  # does not fit next to the running calls: it waits
                    pool.unpin(pinned)
                    keep.append(req)
                    continue
                req.kv_pinned = pinned
                req.kv_private = max(need, 0)
                if evicted:
                    self._evicted("gpu", evicted, pool.clock())
            admitted.append(req)
            running += 1
        return admitted, keep

    def _fit(self, batch: list[SimRequest]) -> int:
        """Decode iterations of `batch` the pool could still hold."""
        return int(self.pool.reservable_tokens // (len(batch) * self.t_acc))

    def preemption_victim(self, batch: list[SimRequest]) -> SimRequest | None:
        """While not even one iteration fits: under FCFS the call that joined the running
        batch last (vLLM's FCFS pops its running list; a resumed call joins it again at the
        end), else the running call with the largest q, then the latest release (vLLM's
        priority scheduling)."""
        if len(batch) == 1 or self._fit(batch) >= 1:
            return None
        if self.fifo:
            return batch[-1]
        return max(batch, key=SimRequest.sort_key)

    def reserve_epoch(self, batch: list[SimRequest], k: int, t: float) -> int:
        b = len(batch)
        k = max(1, min(k, 256, self._fit(batch), min(r.decode_left for r in batch)))
        tokens = math.ceil(k * b * self.t_acc)
        evicted = self.pool.reserve(tokens, force=True)
        if evicted:
            self._evicted("gpu", evicted, t)
        self.epoch_reserved = tokens
        return k

    def settle_epoch(self, batch: list[SimRequest], iterations: int, t: float) -> None:
        """The epoch's reservation becomes the generated tokens of its calls."""
        pool = self.pool
        pool.unreserve(self.epoch_reserved)
        self.epoch_reserved = 0
        bt = self.bt
        t_acc = self.t_acc
        grow = 0
        for r in batch:
            r.generated = min(r.generated + iterations * t_acc, float(r.t_out))
            want = r.t_in - len(r.path) * bt + math.ceil(r.generated)
            if want > r.kv_private:
                grow += want - r.kv_private
                r.kv_private = want
        evicted = pool.reserve(grow, force=True)
        if evicted:
            self._evicted("gpu", evicted, t)

    def release(self, req: SimRequest) -> None:
        self.pool.unpin(req.kv_pinned)
        self.pool.unreserve(req.kv_private)
        req.kv_pinned = []
        req.kv_private = 0

    def end_call(self, req: SimRequest, decoded: bool, t: float) -> None:
        self.pool.touch(req.path, t)  # freed KV is the most recently used (vLLM)
        self.release(req)

    def hand_off(self, req: SimRequest, t: float) -> None:
        """Its KV, freed here once prefilled, is the most recently used (as at the end)."""
        self.end_call(req, False, t)

    # ---- figures -------------------------------------------------------------------------
    def report(self, phase: Phase) -> tuple[int, int, int, int]:
        pool = self.pool
        return (pool.used_tokens + pool.reserved_tokens, pool.pool_tokens, 0, 0)

    def signal_kv(self, phase: Phase) -> tuple[float, float]:
        return self.pool.utilization, 0.0

    def signal_tokens(self) -> int:
        return self.pool.pinned_tokens + self.pool.reserved_tokens

    def status(self) -> tuple[int, int, int, int]:
        pool = self.pool
        return (pool.used_tokens, pool.capacity_tokens, pool.used_tokens, pool.capacity_tokens)

    def drop_gpu_cache(self, t: float) -> None:
        """The node turns to decode: its cached blocks stay in the pool, reclaimable (the
        pool counts running calls' KV and cached blocks together; there is no host tier)."""
        return None
