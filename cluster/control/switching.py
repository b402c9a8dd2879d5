"""Pending phase switches and node availability (paper 000 §4.1–4.2, Alg. E.3; SPEC §4).

A switch is decided (planner or manual), the node leaves routing, the engine drains it and
reports completion — or gives up, and the switch is cancelled. Nodes also leave routing for
reasons of their own (an engine down, a relaunch in progress). `SwitchBook` keeps a set of
hold reasons per node, with "switch" reserved for a pending switch, so the end of a switch
does not put a node that is down back into service; `ClusterState.unavailable` (what the
router and planner read) is always the set of nodes with a hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from cluster.control.planning import SwitchMode
from cluster.core import ConfigError, Phase

Trigger = Literal["planner", "manual"]
SWITCH_HOLD = "switch"
SWITCH_MODES: tuple[SwitchMode, ...] = ("in-place", "relaunch", "strand")


class SwitchError(RuntimeError):
    """A phase switch request that cannot be honored (busy node, empty phase, bad phase)."""


def _engine_reason(reason: str) -> str:
    if reason == SWITCH_HOLD:
        raise ConfigError(f"{SWITCH_HOLD!r} is the control plane's own hold reason (switches)")
    return reason


@dataclass(frozen=True, slots=True)
class PendingSwitch:
    """A decided switch of one node; `drained` is set when it completes."""

    node_id: int
    from_phase: Phase
    to_phase: Phase
    t_decided: float
    trigger: Trigger
    mode: SwitchMode
    drained: int = 0


class SwitchBook:
    """Pending switches and the hold reasons that keep nodes out of routing.

    `unavailable` is the control plane's `ClusterState.unavailable`, updated in place.
    """

    def __init__(self, unavailable: set[int]) -> None:
        self.pending: dict[int, PendingSwitch] = {}
        self.holds: dict[int, set[str]] = {}
        self._unavailable = unavailable
        self.last_switch_t: float | None = None
        self.num_switches = 0

    # ---- holds ---------------------------------------------------------------------------
    def hold(self, node: int, reason: str) -> None:
        """Hold `node` out of routing for an engine's `reason` (not "switch": switches do)."""
        self._hold(node, _engine_reason(reason))

    def release(self, node: int, reason: str) -> None:
        self._release(node, _engine_reason(reason))

    def _hold(self, node: int, reason: str) -> None:
        self.holds.setdefault(node, set()).add(reason)
        self._unavailable.add(node)

    def _release(self, node: int, reason: str) -> None:
        reasons = self.holds.get(node)
        if reasons is None:
            return
        reasons.discard(reason)
        if not reasons:
            del self.holds[node]
            self._unavailable.discard(node)

    def reasons(self, node: int) -> frozenset[str]:
        return frozenset(self.holds.get(node, ()))

    # ---- switches ------------------------------------------------------------------------
    def check(
        self, node: int, to_phase: str, phases: Mapping[int, Phase], collocated: bool
    ) -> Phase:
        """Raise `SwitchError` unless `node` may start switching to `to_phase`; its phase."""
        if node not in phases:
            raise SwitchError(f"unknown node {node}; nodes are {sorted(phases)}")
        if to_phase not in ("prefill", "decode"):
            raise SwitchError(f"phase must be 'prefill' or 'decode', got {to_phase!r}")
        if collocated:
            raise SwitchError("the cluster runs collocated (warmup); phase switches start after it")
        busy = self.pending.get(node)
        if busy is not None:
            raise SwitchError(
                f"node {node} is already switching {busy.from_phase} -> {busy.to_phase} "
                f"(decided at t={busy.t_decided:.1f} s by {busy.trigger})"
            )
        cur = phases[node]
        if cur == to_phase:
            raise SwitchError(f"node {node} already serves {to_phase}")
        remaining = [
            n for n, p in phases.items() if p == cur and n != node and n not in self._unavailable
        ]
        if not remaining:
            raise SwitchError(
                f"node {node} is the last available {cur} node; a switch would leave no {cur} node"
            )
        return cur

    def begin(self, sw: PendingSwitch) -> None:
        self.pending[sw.node_id] = sw
        self._hold(sw.node_id, SWITCH_HOLD)

    def _take(self, node: int) -> PendingSwitch:
        sw = self.pending.pop(node, None)
        if sw is None:
            raise SwitchError(f"node {node} has no switch in progress")
        self._release(node, SWITCH_HOLD)
        return sw

    def finish(self, node: int, now: float, drained: int) -> PendingSwitch:
        """The switch of `node` completed: it serves its new phase (unless held otherwise)."""
        sw = replace(self._take(node), drained=drained)
        self.last_switch_t = now
        self.num_switches += 1
        return sw

    def cancel(self, node: int) -> PendingSwitch:
        """Forget the pending switch of `node`: it keeps serving its old phase."""
        return self._take(node)

    def set_mode(self, node: int, mode: SwitchMode) -> PendingSwitch:
        if mode not in SWITCH_MODES:
            raise SwitchError(f"switch mode must be one of {', '.join(SWITCH_MODES)}, got {mode!r}")
        sw = self.pending.get(node)
        if sw is None:
            raise SwitchError(f"node {node} has no switch in progress")
        sw = replace(sw, mode=mode)
        self.pending[node] = sw
        return sw

    def check_invariants(self) -> None:
        assert set(self.holds) == self._unavailable, (self.holds, self._unavailable)
        assert all(self.holds.values()), self.holds
        for n in self.pending:
            assert SWITCH_HOLD in self.holds.get(n, ()), f"switching node {n} is not held"
        for n, reasons in self.holds.items():
            assert (SWITCH_HOLD in reasons) == (n in self.pending), (n, reasons)


def switch_row(sw: PendingSwitch, t_done: float, lost_kv_blocks: int) -> dict[str, list[Any]]:
    """The `phase_switches` row of a completed switch."""
    return {
        "node_id": [sw.node_id],
        "t_decided": [sw.t_decided],
        "t_done": [t_done],
        "from_phase": [sw.from_phase],
        "to_phase": [sw.to_phase],
        "trigger": [sw.trigger],
        "drained": [sw.drained],
        "lost_kv_blocks": [lost_kv_blocks],
    }
