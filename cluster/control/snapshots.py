"""Read-only records of the control plane's state for servers and engine adapters (SPEC §6).

Callers outside the control layer read the control plane through these copies (and the
`ControlPlane` accessors that return them), never through its mutable parts: a branch of
the branch table (paper 000 Alg. E.1), the router's settings, the directory's counters.
"""

from __future__ import annotations

from typing import NamedTuple

from cluster.kv.branches import BranchTable
from cluster.kv.directory import KVDirectory


class BranchInfo(NamedTuple):
    """One active branch: version v, its path's length and the counted blocks per node."""

    branch_id: str
    program_id: str
    version: int
    path_blocks: int
    counted: dict[int, int]  # node -> length of C_{beta,n} (blocks)
    nodes: list[int]  # nodes holding counts of the branch


class RouterSettings(NamedTuple):
    policy: str
    copy_price_s_per_token: float  # kappa of Eq. 7
    kv_fetch: str  # "async" | "sync" | "none"


def branch_info(table: BranchTable, branch_id: str) -> BranchInfo | None:
    st = table.branches.get(branch_id)
    if st is None:
        return None
    return BranchInfo(
        branch_id=st.branch_id,
        program_id=st.program_id,
        version=st.version,
        path_blocks=len(st.path),
        counted={n: length for n, (_, length) in sorted(st.counted.items())},
        nodes=table.nodes_of(branch_id),
    )


def directory_stats(directory: KVDirectory) -> dict[str, int]:
    """Blocks, holdings, counted holdings, events applied and the block size in tokens."""
    stats = {k: int(v) for k, v in directory.stats().items()}
    stats["block_tokens"] = directory.block_tokens
    return stats
