"""The control plane's read accessors (paper 000 §4.3): what callers may read of it.

`ControlPlane` (control_plane.py) owns the state; these methods only read it, so the REST
API, the dashboards and the engines read a consistent view through one set of accessors
(tests/cluster/control/test_api_boundary.py keeps writes inside `cluster/control`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from cluster.control.snapshots import BranchInfo, RouterSettings, branch_info, directory_stats
from cluster.core import BlockHash, Phase
from models import NodeModel

if TYPE_CHECKING:
    from cluster.control.config import ControlPlaneConfig
    from cluster.control.planner_driver import PlannerDriver, PlannerSettings
    from cluster.control.routing import Router
    from cluster.control.state import ClusterState
    from cluster.control.switching import PendingSwitch, SwitchBook
    from cluster.kv.branches import BranchTable
    from cluster.kv.directory import KVDirectory


class ControlPlaneReads:
    """Read accessors of `ControlPlane` (its state is declared here for the type checker)."""

    config: ControlPlaneConfig
    state: ClusterState
    directory: KVDirectory
    branches: BranchTable
    router: Router
    collocated: bool
    in_service: int
    _book: SwitchBook
    _plan: PlannerDriver

    @property
    def switches(self) -> Mapping[int, PendingSwitch]:
        """Pending switches by node (a read-only view)."""
        return MappingProxyType(self._book.pending)

    @property
    def num_switches(self) -> int:
        return self._book.num_switches

    @property
    def block_tokens(self) -> int:
        return self.directory.block_tokens

    def pending_switch(self, node: int) -> PendingSwitch | None:
        return self._book.pending.get(node)

    def unavailable_reasons(self, node: int) -> frozenset[str]:
        """Why `node` is out of routing ("switch" while switching); empty when it serves."""
        return self._book.reasons(node)

    def phase_of(self, node: int) -> Phase:
        return self.state.phases[node]

    def phases(self) -> dict[int, Phase]:
        return dict(self.state.phases)

    def available(self, phase: Phase) -> list[int]:
        """Nodes serving `phase` that the router may use."""
        return self.state.nodes_in(phase)

    def models(self) -> dict[int, NodeModel]:
        return dict(self.state.models)

    def branch(self, branch_id: str) -> BranchInfo | None:
        return branch_info(self.branches, branch_id)

    def active_branches(self) -> list[str]:
        """Ids of the active branches, oldest first."""
        return list(self.branches.branches)

    def node_blocks(self, node: int) -> int:
        return self.directory.node_blocks(node)

    def branch_counts(self, node: int) -> dict[BlockHash, int]:
        """R_{b,n} > 0 of the blocks on `node`: what a branch-aware engine cache ranks by."""
        return self.directory.node_counts(node)

    def directory_stats(self) -> dict[str, int]:
        return directory_stats(self.directory)

    def planner_settings(self) -> PlannerSettings:
        return self._plan.settings(self.collocated)

    def router_settings(self) -> RouterSettings:
        return RouterSettings(
            self.router.name, self.state.copy_price_s_per_token, self.config.kv_fetch
        )

    def check_invariants(self) -> None:
        self._book.check_invariants()
        assert all(v >= 0 for v in self.state.decode_load.values()), self.state.decode_load
        assert self.in_service >= 0
