"""How a live cluster answers its role switcher's questions from its parts (SPEC §4).

`RoleSwitcher` (role_switch.py) sees its cluster only through the `SwitchHost` port: the
settings, the lock, the engines' specs and a few calls back. What the port asks that a
cluster holds in its parts (the proxy's requests in flight on a node, the control plane's
pending switch and the node's blocks, the decode engines that are up) is answered here,
so the switcher never reaches into the proxy, the fleet or the control plane.
`SGLangCluster` mixes this in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.control import ControlPlane, PendingSwitch
    from cluster.live.cluster_file import EngineSpec
    from cluster.live.engine_state import EngineState
    from cluster.live.proxy import PDProxy


class SwitchQueries:
    """The `SwitchHost` queries of a cluster with a proxy, a control plane and engines."""

    cp: ControlPlane
    proxy: PDProxy
    if TYPE_CHECKING:  # the cluster's own

        @property
        def engines(self) -> dict[int, EngineState]: ...

        def engine(self, node: int) -> EngineSpec: ...

    def requests_on(self, node: int) -> int:
        """Requests the proxy has in flight on `node` (what a switch drains)."""
        return self.proxy.outstanding(node)

    def engine_headers(self) -> dict[str, str]:
        """The headers every call to an engine carries (its API key, if any)."""
        return dict(self.proxy.headers)

    def pending_switch(self, node: int) -> PendingSwitch | None:
        return self.cp.pending_switch(node)

    def held_blocks(self, node: int) -> int:
        """KV blocks the directory says `node` holds (what a cache-dropping switch loses)."""
        return self.cp.node_blocks(node)

    def block_tokens(self) -> int:
        return self.cp.block_tokens

    def decode_peers(self, node: int) -> list[str]:
        """HTTP URLs of the decode engines other than `node` that are up (call under the lock)."""
        return [
            self.engine(n).http_url
            for n, p in self.cp.phases().items()
            if p == "decode" and n != node and self.engines[n].up
        ]
