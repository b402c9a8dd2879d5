"""The control layer (paper 000 §5, App. E.3): what the control plane knows of the nodes,
routers, planners and the `ControlPlane` that drives simulated and live engines alike.

This is the control plane's one address: code outside `cluster/control` imports what it
needs from here, never from the modules inside (tests/test_architecture.py checks it).
`ControlPlane` is a facade over admission and placement, event intake, and phase switches
and availability; its parts stay private behind its methods and read accessors.
"""

from cluster.control.bounds import COPY_PRICE_S_PER_TOKEN, SLICES, WINDOW_S, Range
from cluster.control.config import ControlPlaneConfig
from cluster.control.control_plane import ControlPlane
from cluster.control.engines import (
    ClusterEngines,
    CompletedRequest,
    EngineBackend,
    NodeStatus,
    RequestListener,
)
from cluster.control.lock import ContendedRLock
from cluster.control.planner_driver import PLANNER_MODES, PlannerSettings
from cluster.control.planning import PlannerDecision, SwitchMode, candidate_split
from cluster.control.routing import ROUTERS, local_decision
from cluster.control.snapshots import BranchInfo, RouterSettings
from cluster.control.state import ClusterView, NodeReport, QueuedWork, RouteDecision, RouteRequest
from cluster.control.switching import PendingSwitch, SwitchError

__all__ = [
    "COPY_PRICE_S_PER_TOKEN",
    "PLANNER_MODES",
    "ROUTERS",
    "SLICES",
    "WINDOW_S",
    "BranchInfo",
    "ClusterEngines",
    "ClusterView",
    "CompletedRequest",
    "ContendedRLock",
    "ControlPlane",
    "ControlPlaneConfig",
    "EngineBackend",
    "NodeReport",
    "NodeStatus",
    "PendingSwitch",
    "PlannerDecision",
    "PlannerSettings",
    "QueuedWork",
    "Range",
    "RequestListener",
    "RouteDecision",
    "RouteRequest",
    "RouterSettings",
    "SwitchError",
    "SwitchMode",
    "candidate_split",
    "local_decision",
]
