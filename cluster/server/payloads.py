"""The JSON shapes of the control server's REST API (SPEC §6), each written once.

Built from the control plane's read-only records (`cluster.control.snapshots`, the planner's
settings, pending switches) and the engines' `NodeStatus`; numbers JSON cannot hold (inf,
nan) become null.
"""

from __future__ import annotations

from typing import Any

from cluster.control import (
    ROUTERS,
    BranchInfo,
    ControlPlane,
    NodeStatus,
    PendingSwitch,
    PlannerDecision,
)
from cluster.server.latency import num


def switch_json(sw: PendingSwitch | None) -> dict[str, Any] | None:
    """A pending phase switch (None when the node is not switching)."""
    if sw is None:
        return None
    return {
        "from_phase": sw.from_phase,
        "to_phase": sw.to_phase,
        "t_decided": sw.t_decided,
        "trigger": sw.trigger,
        "mode": sw.mode,
    }


def node_json(cp: ControlPlane, node: int, status: NodeStatus) -> dict[str, Any]:
    return {
        "id": node,
        "phase": cp.phase_of(node),
        "switching": switch_json(cp.pending_switch(node)),
        **status.as_dict(),
    }


def decision_json(d: PlannerDecision) -> dict[str, Any]:
    """A planner evaluation with every candidate's gain (paper 000 Eq. 6)."""
    return {
        "t": d.t,
        "current_prefill": d.current_prefill,
        "chosen_prefill": d.chosen_prefill,
        "mode": d.mode,
        "reason": d.reason,
        "switches": [{"node": s.node_id, "to_phase": s.to_phase} for s in d.switches],
        "candidates": [
            {
                "prefill_count": c.prefill_count,
                "mean_gain": num(c.mean_gain),
                "std_gain": num(c.std_gain),
                "slices": c.slices,
                "qualified": bool(c.qualified),
            }
            for c in d.candidates
        ],
    }


def planner_json(cp: ControlPlane) -> dict[str, Any]:
    s = cp.planner_settings()
    return {
        "name": s.name,
        "mode": s.mode,
        "modes": list(s.modes),
        "window_s": s.window_s,
        "slices": s.slices,
        "interval_s": num(s.interval_s),
        "next_evaluation_t": num(s.next_evaluation_t),
        "collocated": s.collocated,
        "last_decision": None if s.last_decision is None else decision_json(s.last_decision),
    }


def router_json(cp: ControlPlane) -> dict[str, Any]:
    r = cp.router_settings()
    return {
        "policy": r.policy,
        "copy_price": r.copy_price_s_per_token,
        "copy_price_unit": "s/token",
        "kv_fetch": r.kv_fetch,
        "policies": ROUTERS.names(),
    }


def branch_json(b: BranchInfo) -> dict[str, Any]:
    return {
        "branch_id": b.branch_id,
        "program_id": b.program_id,
        "version": b.version,
        "path_blocks": b.path_blocks,
        "counted": {str(n): length for n, length in b.counted.items()},
        "nodes": b.nodes,
    }
