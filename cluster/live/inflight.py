"""The proxy's accounting of requests in flight per engine (paper 000 App. E.3; SPEC §6).

A request counts on its prefill engine until that engine answered and on its decode engine
until the answer ends. A node's count is what a phase switch drains; the requests whose
prefill a node has not finished are its queue in the node reports the router reads (a
running one counts whole, so T_rem = 0). Read and written under the control-plane lock.
"""

from __future__ import annotations

from cluster.control import QueuedWork
from cluster.live.live_request import LiveRequest


class InFlight:
    def __init__(self) -> None:
        self.by_node: dict[int, dict[str, LiveRequest]] = {}

    def add(self, rec: LiveRequest, nodes: set[int]) -> None:
        for n in nodes:
            self.by_node.setdefault(n, {})[rec.request_id] = rec

    def drop(self, rec: LiveRequest, node: int | None = None) -> None:
        """Forget `rec` on `node`, or on both its engines."""
        nodes = {node} if node is not None else {rec.prefill_node, rec.decode_node}
        for n in nodes:
            if n is not None:
                self.by_node.get(n, {}).pop(rec.request_id, None)

    def outstanding(self, node: int) -> int:
        """Requests sent to `node` and not yet answered (the drain of a phase switch)."""
        return len(self.by_node.get(node, {}))

    def prefill_queue(self, node: int) -> list[QueuedWork]:
        """Requests whose prefill `node` has not finished, oldest first (its queue)."""
        out = []
        for r in self.by_node.get(node, {}).values():
            if r.prefill_node == node and r.t_prefill_done is None:
                out.append(
                    QueuedWork(r.request_id, max(r.t_in - r.cached_tokens, 1), r.cached_tokens)
                )
        return out

    def decode_running(self, node: int) -> int:
        return sum(1 for r in self.by_node.get(node, {}).values() if r.decode_node == node)

    def num_requests(self) -> int:
        """Distinct requests in flight anywhere."""
        return len({rid for reqs in self.by_node.values() for rid in reqs})
