"""The parts a `ControlPlane` holds, declared once for the modules that act on them.

`ControlPlane` (control_plane.py) is a facade: its methods come from one module per concern
(`placement.py`: admission and placement; `intake.py`: the engines' events and reports;
`availability.py`: phase switches and nodes held out of routing; `plane_reads.py`: what
callers may read) and all act on these private parts, which `ControlPlane.__init__` builds.
Nothing outside `cluster/control` touches them (tests/cluster/control/test_api_boundary.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.control.config import ControlPlaneConfig
    from cluster.control.engines import EngineBackend
    from cluster.control.lock import ContendedRLock
    from cluster.control.planner_driver import PlannerDriver
    from cluster.control.planning import WindowStats
    from cluster.control.routing import DecodeBinder, Router
    from cluster.control.state import ClusterState, ClusterView
    from cluster.control.switching import SwitchBook
    from cluster.core import TelemetrySink
    from cluster.kv.branches import BranchTable
    from cluster.kv.directory import KVDirectory


class ControlPlaneParts:
    """Declarations only (for the type checker): see the module docstring."""

    _config: ControlPlaneConfig
    _sink: TelemetrySink
    _backend: EngineBackend | None
    _lock: ContendedRLock
    _directory: KVDirectory
    _state: ClusterState
    _view: ClusterView
    _branches: BranchTable
    _router: Router
    _binder: DecodeBinder
    _plan: PlannerDriver
    _stats: WindowStats
    _book: SwitchBook
    _collocated: bool
    _now: float
    _in_service: int  # admitted and not finished: the planner's decode demand q
