"""Event intake: what the engines tell the control plane (paper 000 §4.3, App. E.3; SPEC §6).

KV events (stored, removed, cleared; batched, as live engines publish them) update the
directory; node reports update the cluster state the router prices with; prefill passes
feed the planner's remeasure; an attached fleet's load and finished work feed the planner
without routing. A restarted engine's blocks are dropped in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cluster.control.parts import ControlPlaneParts
from cluster.control.state import NodeReport
from cluster.core import BlockHash, KVEvent


class EventIntake(ControlPlaneParts):
    """`ControlPlane`'s methods for the engines' events and reports (module docstring)."""

    def on_kv_events(self, events: Iterable[KVEvent]) -> None:
        self._directory.apply_all(events)

    def on_report(self, report: NodeReport) -> None:
        self._state.report(report)

    def on_prefill_iteration(
        self, node: int, t: float, new_tokens: float, cached_tokens: float, restored_tokens: float
    ) -> None:
        """One prefill forward pass of `node` (t_bar_n and f_n of the planner's remeasure)."""
        self._stats.record_prefill_iteration(node, t, new_tokens, cached_tokens, restored_tokens)

    def observe_load(
        self, t: float, in_service: int, finished: Iterable[tuple[float, ...]] = ()
    ) -> None:
        """Requests the engines served without this control plane routing them (an attached
        fleet in shadow mode, `pdlab attach`): the fleet's requests in service (the planner's
        decode demand q) and the work (t_uc, A, t_c, t_out, t_acc) of those that finished
        (the window's w-bar, Eq. 5-6)."""
        self._now = t
        self._in_service = max(int(in_service), 0)
        self._stats.record_decode_load(t, self._in_service)
        for t_uc, pairs, t_c, t_out, t_acc in finished:
            self._stats.record_request(t, t_uc, pairs, t_c, t_out, t_acc)

    def add_zero_count_listener(self, listener: Callable[[int, list[BlockHash]], None]) -> None:
        """Call `listener(node, blocks)` whenever blocks' R_{b,n} drop to zero (a
        branch-aware cache re-ranks them: their eviction key fell)."""
        self._directory.zero_listeners.append(listener)

    def drop_node_blocks(self, node: int) -> int:
        """`node`'s engine restarted with an empty cache (it published no AllBlocksCleared):
        drop its blocks from the directory; returns how many it held."""
        held = self._directory.node_blocks(node)
        self._directory.clear_node(node)
        return held

    def _log_counts(self, node: int, blocks: list[int], counts: list[int]) -> None:
        """A path's count changes as one batch of `branch_counts` rows."""
        n = len(counts)
        if not n:
            return
        self._sink.emit(
            "branch_counts",
            {"t": [self._now] * n, "node_id": [node] * n, "block_hash": blocks, "count": counts},
        )
