"""The control plane's read accessors (paper 000 §4.3): what callers may read of it.

`ControlPlane` (control_plane.py) owns the state; these methods only read it, so the REST
API, the dashboards and the engines read a consistent view through one set of accessors
(tests/cluster/control/test_api_boundary.py keeps writes inside `cluster/control`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from cluster.control.parts import ControlPlaneParts
from cluster.control.snapshots import BranchInfo, RouterSettings, branch_info, directory_stats
from cluster.core import BlockHash, Phase
from models import NodeModel

if TYPE_CHECKING:
    from cluster.control.config import ControlPlaneConfig
    from cluster.control.lock import ContendedRLock
    from cluster.control.planner_driver import PlannerSettings
    from cluster.control.state import ClusterView
    from cluster.control.switching import PendingSwitch


class ControlPlaneReads(ControlPlaneParts):
    """Read accessors of `ControlPlane` (its parts are private: cluster/control/parts.py)."""

    @property
    def config(self) -> ControlPlaneConfig:
        """The settings it was built with (frozen)."""
        return self._config

    @property
    def lock(self) -> ContendedRLock:
        """Held by the control plane's own changes; a live caller holds it to read or change
        several things at once consistently."""
        return self._lock

    @property
    def view(self) -> ClusterView:
        """The read-only view the router prices with (pending work, decode load, T_hat)."""
        return self._view

    @property
    def collocated(self) -> bool:
        """Every node serves both phases (the warmup, or a collocated cluster)."""
        return self._collocated

    @property
    def now(self) -> float:
        """The time of the last request admitted, load observed or planner tick."""
        return self._now

    @property
    def in_service(self) -> int:
        """Requests admitted and not finished: the planner's decode demand q."""
        return self._in_service

    @property
    def switches(self) -> Mapping[int, PendingSwitch]:
        """Pending switches by node (a read-only view)."""
        return MappingProxyType(self._book.pending)

    @property
    def num_switches(self) -> int:
        return self._book.num_switches

    @property
    def block_tokens(self) -> int:
        return self._directory.block_tokens

    def pending_switch(self, node: int) -> PendingSwitch | None:
        return self._book.pending.get(node)

    def unavailable_nodes(self) -> frozenset[int]:
        """Nodes out of routing and planning (switching, or held for a reason of their own)."""
        return frozenset(self._state.unavailable)

    def unavailable_reasons(self, node: int) -> frozenset[str]:
        """Why `node` is out of routing ("switch" while switching); empty when it serves."""
        return self._book.reasons(node)

    def phase_of(self, node: int) -> Phase:
        return self._state.phases[node]

    def phases(self) -> dict[int, Phase]:
        return dict(self._state.phases)

    def available(self, phase: Phase) -> list[int]:
        """Nodes serving `phase` that the router may use."""
        return self._state.nodes_in(phase)

    def models(self) -> dict[int, NodeModel]:
        return dict(self._state.models)

    def form_priced_nodes(self) -> frozenset[int]:
        """Nodes whose prefill the router prices with a fitted form's predictor (not Eq. 3)."""
        return frozenset(self._state.prefill_predictors)

    def branch(self, branch_id: str) -> BranchInfo | None:
        return branch_info(self._branches, branch_id)

    def active_branches(self) -> list[str]:
        """Ids of the active branches, oldest first."""
        return list(self._branches.branches)

    def has_branch(self, branch_id: str) -> bool:
        return branch_id in self._branches.branches

    def node_blocks(self, node: int) -> int:
        return self._directory.node_blocks(node)

    def node_holdings(self, node: int) -> dict[BlockHash, int]:
        """The blocks the directory has on `node`, each with its tier bits (GPU 1, host 2)."""
        return self._directory.node_holdings(node)

    def cached_prefix(self, path: Sequence[BlockHash], node: int) -> int:
        """How many leading blocks of `path` the directory has on `node`."""
        return self._directory.longest_prefix(path, [node]).per_node[node]

    def block_count(self, node: int, block: BlockHash) -> int:
        """R_{b,n}: the active branches counted on `node` whose path holds `block`."""
        return self._directory.count(node, block)

    def count_of(self, node: int) -> Callable[[BlockHash], int]:
        """R_{b,n} of `node`'s blocks as a function (the live table's C-level read: a node
        cache's eviction key; absent blocks count 0)."""
        return self._directory.counts_of(node).__getitem__

    def branch_counts(self, node: int) -> dict[BlockHash, int]:
        """R_{b,n} > 0 of the blocks on `node`: what a branch-aware engine cache ranks by."""
        return self._directory.node_counts(node)

    def directory_stats(self) -> dict[str, int]:
        return directory_stats(self._directory)

    def planner_settings(self) -> PlannerSettings:
        return self._plan.settings(self._collocated)

    def router_settings(self) -> RouterSettings:
        return RouterSettings(
            self._router.name, self._state.copy_price_s_per_token, self._config.kv_fetch
        )

    def check_invariants(self) -> None:
        self._book.check_invariants()
        self._branches.check_invariants()
        assert all(v >= 0 for v in self._state.decode_load.values()), self._state.decode_load
        assert self._in_service >= 0
