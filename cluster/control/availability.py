"""Phase switches and availability: which nodes serve which phase, and which the router may
use (paper 000 §4.1–4.2, Alg. E.3; SPEC §4).

A switch is requested (by the planner or by hand), serialized per node in the `SwitchBook`
(switching.py), carried out by the engines (`EngineBackend.begin_switch`) and completed or
cancelled by them; completion moves the node's phase, its branch counts (a decode node
turning to prefill frees its memory) and, for a relaunch or a stranded switch, drops its
KV from the directory. Nodes also leave routing for reasons of their own (an engine down,
a relaunch) until every reason they were held for ends.
"""

from __future__ import annotations

from cluster.control.parts import ControlPlaneParts
from cluster.control.planning import SwitchMode
from cluster.control.switching import PendingSwitch, Trigger, switch_row
from cluster.core import ConfigError


class Availability(ControlPlaneParts):
    """`ControlPlane`'s phase-switch and availability methods (module docstring)."""

    def request_switch(
        self,
        node: int,
        to_phase: str,
        now: float,
        *,
        trigger: Trigger = "manual",
        mode: SwitchMode = "in-place",
    ) -> PendingSwitch:
        """Start switching `node` to `to_phase`; serialized per node."""
        with self._lock:
            cur = self._book.check(node, to_phase, self._state.phases, self._collocated)
            sw = PendingSwitch(node, cur, to_phase, now, trigger, mode)  # type: ignore[arg-type]
            self._book.begin(sw)
            if self._backend is not None:
                self._backend.begin_switch(node, to_phase, mode, now)  # type: ignore[arg-type]
            return sw

    def complete_switch(
        self, node: int, now: float, drained: int = 0, lost_kv_blocks: int | None = None
    ) -> None:
        """The backend reports that `node` serves its new phase.

        `lost_kv_blocks`: blocks the switch made unreachable; by default 0 for an in-place
        switch (the KV stays in the pool) and every block the node held for a relaunch or a
        stranded switch.
        """
        with self._lock:
            sw = self._book.finish(node, now, drained)
            self._state.phases[node] = sw.to_phase
            self._state.reports.pop(node, None)
            self._branches.on_phase_switch(node, sw.from_phase, sw.to_phase, now)
            if lost_kv_blocks is None:
                lost_kv_blocks = (
                    self._directory.node_blocks(node) if sw.mode in ("relaunch", "strand") else 0
                )
            if sw.mode in ("relaunch", "strand"):
                # The relaunched or stranded node's KV is unreachable: drop it from the directory.
                self._directory.clear_node(node)
            self._sink.emit("phase_switches", switch_row(sw, now, lost_kv_blocks))

    def cancel_switch(self, node: int) -> PendingSwitch:
        """Roll back the pending switch of `node` (the backend could not do it): the node
        keeps its phase and returns to routing unless held for another reason. No
        `phase_switches` row: only completed switches are rows."""
        with self._lock:
            return self._book.cancel(node)

    def set_switch_mode(self, node: int, mode: SwitchMode) -> PendingSwitch:
        """The backend carries out the pending switch of `node` another way (e.g. a relaunch
        where the engine cannot switch in place): completion then drops the node's KV."""
        with self._lock:
            return self._book.set_mode(node, mode)

    def mark_unavailable(self, node: int, reason: str) -> None:
        """Take `node` out of routing and planning for `reason` (an engine down, a relaunch);
        it returns when every reason it was marked for ends (`mark_available`)."""
        with self._lock:
            self._book.hold(self._node(node), reason)

    def mark_available(self, node: int, reason: str) -> None:
        with self._lock:
            self._book.release(self._node(node), reason)

    def _node(self, node: int) -> int:
        if node not in self._state.phases:
            raise ConfigError(f"unknown node {node}; nodes are {sorted(self._state.phases)}")
        return node
