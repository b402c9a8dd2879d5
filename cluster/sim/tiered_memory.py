"""Tiered KV memory of a simulated node: GPU memory (L1) and host memory (L2).

Paper 000 §4.1-4.2: GPU KV is an exact LRU; host KV is written through and evicted by the
configured policy (§5.3), or both tiers by the Retention Plane's key (paper 003 §3.4). A
block leaving host memory leaves the node. Decode batches hold their requests' whole KV
(input plus full output) in GPU memory next to the prefix cache, and a request joins the
batch only when that fits. With `paged` (the engine limits of `SimConfig`) a decode's KV
grows as its tokens are generated, as vLLM allocates it: a request joins when its current
KV fits, and when the next iteration of the running batch does not fit, the newest running
request is preempted (recompute). With `reserve_prompts` too (a collocated node with engine
limits, vLLM V1's `scheduler_reserve_full_isl`), a request starts its prefill only when its
prompt's KV fits next to what the node's requests hold, and holds it from then on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cluster.core import BlockHash, KVEvent, Phase
from cluster.kv.tier_cache import TierCache
from cluster.policies.retention import RetentionDecision
from cluster.sim.buffer import BufferedSink
from cluster.sim.entities import SimRequest
from cluster.sim.memory import KVMemory, Publish


class TieredMemory(KVMemory):
    """GPU memory (L1) and host memory (L2, written through); decode batches keep their
    requests' whole KV (input and output) in GPU memory, outside the prefix cache."""

    def __init__(
        self,
        node_id: int,
        l1: TierCache,
        l2: TierCache,
        block_tokens: int,
        out: BufferedSink,
        publish: Publish,
        exact_prefix: bool = False,
        paged: bool = False,
        t_acc: float = 1.0,
        reserve_prompts: bool = False,
    ) -> None:
        super().__init__(node_id, l1, l2, block_tokens, out, publish, exact_prefix)
        self.decode_kv = 0  # KV tokens of the running decode batch (and prompts, reserving)
        self.paged = paged
        self.reserve_prompts = paged and reserve_prompts
        self.t_acc = t_acc  # tokens per request per decode iteration (paged)
        self.epoch_reserved = 0  # tokens reserved for the running epoch (paged)

    def cached_prefix(self, path: Sequence[BlockHash]) -> tuple[int, int]:
        return self._prefix(path, self.l2.entries), self._prefix(path, self.l1.entries)

    def store(
        self, path: Sequence[BlockHash], host_from: int, gpu_from: int | None, t: float
    ) -> None:
        n = len(path)
        events: list[KVEvent] = []
        if host_from < n:
            self._insert(self.l2, "host", path, host_from, t, events)
        if gpu_from is not None and gpu_from < n:
            self._insert(self.l1, "gpu", path, gpu_from, t, events)
        if events:
            self.publish(events)

    def fetch(self, blocks: Sequence[BlockHash], t: float) -> None:
        prefix = self._prefix
        self.store(blocks, prefix(blocks, self.l2.entries), prefix(blocks, self.l1.entries), t)

    def receive(self, path: Sequence[BlockHash], t: float) -> None:
        self.store(path, self._prefix(path, self.l2.entries), None, t)

    def prefilled(self, req: SimRequest, start: int, t: float) -> None:
        # The restored prefix was loaded into GPU memory; the new blocks go to both tiers.
        self.store(req.path, start, req.gpu_blocks, t)

    def retain(
        self, path: Sequence[BlockHash], owner: int, decision: RetentionDecision, now: float
    ) -> None:
        self._retain_in(self.l2, "host", path, owner, decision, now)
        self._retain_in(self.l1, "gpu", path, owner, decision, now)

    def fits(self, req: SimRequest, busy: bool) -> bool:
        """Prefill always gets memory; paged, a preempted request is recomputed only when
        its KV would fit next to the running batch's (reserving prompts: any request)."""
        if not (self.paged and (req.recompute or self.reserve_prompts) and busy):
            return True
        need = req.t_in + math.ceil(req.generated)
        return self.decode_kv + need <= self.l1.capacity_tokens

    def admit(self, req: SimRequest, busy: bool, t: float) -> bool:
        ok = self.fits(req, busy)
        if ok and self.reserve_prompts:  # the prompt's KV is held from its first chunk
            req.kv_private = req.t_in + math.ceil(req.generated)
            self.decode_kv += req.kv_private
        return ok

    def admit_decode(
        self, joiners: list[SimRequest], running: int, max_batch: int
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        # A request joins when its whole KV (input + full output) fits next to the batch's;
        # paged, when the KV it holds now (input + tokens generated so far) does.
        cap = self.l1.capacity_tokens
        used = self.decode_kv
        paged = self.paged
        admitted: list[SimRequest] = []
        keep: list[SimRequest] = []
        for req in joiners:
            need = req.t_in + (math.ceil(req.generated) if paged else req.t_out)
            more = need - req.kv_private  # reserving prompts: the prompt's KV is held
            if running < max_batch and (used + more <= cap or not running):
                admitted.append(req)
                used += more
                running += 1
                req.kv_private = need
            else:
                keep.append(req)
        self.decode_kv = used
        return admitted, keep

    def _fit(self, batch: list[SimRequest]) -> int:
        """Decode iterations of `batch` the GPU KV could still hold (paged)."""
        return int((self.l1.capacity_tokens - self.decode_kv) // (len(batch) * self.t_acc))

    def preemption_victim(self, batch: list[SimRequest]) -> SimRequest | None:
        """Paged: while not even one iteration fits, the newest running request (vLLM)."""
        if not self.paged or len(batch) == 1 or self._fit(batch) >= 1:
            return None
        return batch[-1]

    def reserve_epoch(self, batch: list[SimRequest], k: int, t: float) -> int:
        if not self.paged:
            return k
        k = max(1, min(k, self._fit(batch)))
        self.epoch_reserved = math.ceil(k * len(batch) * self.t_acc)
        self.decode_kv += self.epoch_reserved
        return k

    def settle_epoch(self, batch: list[SimRequest], iterations: int, t: float) -> None:
        """Paged: the epoch's reservation becomes the tokens its requests generated."""
        if not self.paged:
            return
        self.decode_kv -= self.epoch_reserved
        self.epoch_reserved = 0
        t_acc = self.t_acc
        grow = 0
        for r in batch:
            r.generated = min(r.generated + iterations * t_acc, float(r.t_out))
            want = r.t_in + math.ceil(r.generated)
            grow += want - r.kv_private
            r.kv_private = want
        self.decode_kv += grow

    def release(self, req: SimRequest) -> None:
        self.decode_kv -= req.kv_private  # preempted (paged only)
        req.kv_private = 0

    def end_call(self, req: SimRequest, decoded: bool, t: float) -> None:
        if decoded or self.reserve_prompts:
            self.decode_kv -= req.kv_private
            req.kv_private = 0

    def hand_off(self, req: SimRequest, t: float) -> None:
        return None  # a prefill node holds a call's KV only in its caches (no reservation)

    def report(self, phase: Phase) -> tuple[int, int, int, int]:
        return (
            self.decode_kv if phase == "decode" else self.l1.used_tokens,
            self.l1.capacity_tokens,
            self.l2.used_tokens,
            self.l2.capacity_tokens,
        )

    def signal_kv(self, phase: Phase) -> tuple[float, float]:
        used = self.decode_kv if phase == "decode" else self.l1.used_tokens
        return used / self.l1.capacity_tokens, self.l2.used_tokens / self.l2.capacity_tokens

    def signal_tokens(self) -> int:
        return self.decode_kv

    def status(self) -> tuple[int, int, int, int]:
        return (
            self.l1.used_tokens + self.decode_kv,
            self.l1.capacity_tokens,
            self.l2.used_tokens,
            self.l2.capacity_tokens,
        )
