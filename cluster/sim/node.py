"""One simulated node: its phase, queues, batches and KV memory (paper 000 §4.1).

Every node can serve either phase (symmetric engines). A `SimNode` holds what its engine
works on: the prefill queue (routed, not started), the requests in chunked prefill, the
requests whose KV arrived and wait for the next decode iteration, the decode batch and its
running epoch, and the state of a phase switch in progress. Its KV lives behind the
`NodeMemory` protocol (`memory`), tiered or unified. `cluster.sim.node_engine` drives it.
"""

from __future__ import annotations

from collections.abc import Sequence

from cluster.control import NodeReport, QueuedWork
from cluster.core import BlockHash, Phase
from cluster.sim.entities import DecodeEpoch, SimRequest
from cluster.sim.memory import NodeMemory


class SimNode:
    """One node (see module docstring)."""

    __slots__ = (
        "busy",
        "decode_batch",
        "decode_iter",
        "epoch",
        "id",
        "inbound",
        "join_queue",
        "memory",
        "out_of_service",
        "phase",
        "prefill_iter",
        "prefilling",
        "queue",
        "switch",
        "worked_t",
    )

    def __init__(self, node_id: int, phase: Phase, memory: NodeMemory) -> None:
        self.id = node_id
        self.phase: Phase = phase
        self.memory = memory
        self.queue: list[SimRequest] = []  # routed, not started (in priority order)
        self.prefilling: list[SimRequest] = []  # chunked prefill in progress
        self.busy = False  # a prefill iteration is in flight
        self.prefill_iter = 0
        self.decode_iter = 0
        self.decode_batch: list[SimRequest] = []
        self.join_queue: list[SimRequest] = []  # KV arrived, waiting for the next iteration
        self.inbound = 0  # requests bound here whose KV is still in transfer
        self.epoch: DecodeEpoch | None = None
        self.switch: tuple[Phase, str, float, int] | None = None  # (to, mode, t_decided, running)
        self.out_of_service = False
        # When its last iteration (and its CPU overhead) ended: a node not working since
        # before now was idle (serving overheads: a live engine wakes up first).
        self.worked_t = float("-inf")

    def holds_kv(self) -> bool:
        """Some call here holds KV (prefilling, decoding or about to decode)."""
        return bool(self.prefilling or self.decode_batch or self.join_queue)

    def inflight(self) -> int:
        """Calls queued or running here (the Dispatch Plane's load signal)."""
        return (
            len(self.queue)
            + len(self.prefilling)
            + len(self.decode_batch)
            + len(self.join_queue)
            + self.inbound
        )

    def running(self) -> int:
        """Calls a switch lets finish in place (everything but the queue)."""
        return len(self.prefilling) + len(self.decode_batch) + len(self.join_queue) + self.inbound

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

    def keep_output(self, path: Sequence[BlockHash], start: int, t: float) -> None:
        """The node produced the blocks path[start:] at `t` (a call's output): they enter
        its host memory unless its KV became unreachable since."""
        if self.memory.cleared_at < t and not self.out_of_service:
            self.memory.store(path, start, None, t)

    def report(self, now: float, remaining_s: float) -> NodeReport:
        """The node's state report to the control plane (queue, running work, KV)."""
        return NodeReport(
            self.id,
            now,
            self.phase,
            tuple(QueuedWork(r.request_id, r.route_t_uc, r.route_t_c) for r in self.queue),
            remaining_s,
            len(self.decode_batch) if self.phase == "decode" else len(self.prefilling),
            None,
            *self.memory.report(self.phase),
        )

    def status(self) -> dict[str, object]:
        """What a live view shows of the node: service, queues, batches, KV tiers, iterations."""
        gpu_used, gpu_cap, host_used, host_cap = self.memory.status()
        return {
            "out_of_service": self.out_of_service,
            "queue": len(self.queue),
            "running": len(self.prefilling) + len(self.decode_batch),
            "waiting_kv": len(self.join_queue) + self.inbound,
            "kv_gpu_used": gpu_used,
            "kv_gpu_capacity": gpu_cap,
            "kv_host_used": host_used,
            "kv_host_capacity": host_cap,
            "prefill_iterations": self.prefill_iter,
            "decode_iterations": self.decode_iter,
        }
