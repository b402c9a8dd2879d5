"""Branch table and branch counts R_{b,n} (paper 000 §4.3, Alg. E.1 and E.2).

Per branch: version v, path pi of its last request (block hashes of the full pages of its
input, including the blocks its prefill adds), and the counted blocks C_{beta,n} per node.
Because block hashes are chained, every C is a root-anchored path, so it is stored as
(path, length) and set differences reduce to a longest-common-prefix search:

- Count(beta, n, pi): +1 on pi \\ C, -1 on C \\ pi, C := pi.
- request: new branch -> v = 1, empty previous path (fork and sub-agent alike: a fork counts
  every block it reuses from its parent on the node that serves it); otherwise v += 1 if the
  previous path is not a prefix of the new one (compaction), and then each node keeps only
  C intersect pi_new (the dropped history is released once per node).
- place(beta, n): Count(beta, n, pi_beta); once n holds the current version (`confirm`),
  same-phase nodes release the branch (P2P, D2D); other-phase nodes keep it (P2D, D2P).
- finish: release everywhere. Phase switch D->P: release every branch on the node; P->D keep.

Counts live in the KVDirectory; this class decides them. Invariants (`check_invariants`):
counts equal a recount from the branch table, never negative, and each active branch holds
counts on at most one copy per phase (a pending move or a node that switched phase since
the placement may add one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from cluster.core import BlockHash, Phase, TelemetrySink
from cluster.kv.directory import KVDirectory

BranchKind = Literal["start", "fork", "subagent"]


def common_prefix(a: Sequence[BlockHash], alen: int, b: Sequence[BlockHash], blen: int) -> int:
    """Length of the common prefix of a[:alen] and b[:blen] (chained hashes: monotone)."""
    n = min(alen, blen)
    if n == 0:
        return 0
    if a[n - 1] == b[n - 1]:
        return n
    lo, hi = 0, n - 1  # a[hi] != b[hi]; find first mismatch
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class BranchState:
    branch_id: str
    program_id: str
    version: int = 1
    path: list[BlockHash] = field(default_factory=list)
    # node -> (path list, counted length); C_{beta,n} = path[:length]
    counted: dict[int, tuple[list[BlockHash], int]] = field(default_factory=dict)
    # node -> switch epoch of the node when the branch was placed there
    placed_epoch: dict[int, int] = field(default_factory=dict)
    # phase -> (node, version) of a same-phase move awaiting confirm
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)


class BranchTable:
    """Branch versions, paths and counts; see module docstring."""

    def __init__(
        self,
        directory: KVDirectory,
        phase_of: Callable[[int], Phase],
        sink: TelemetrySink | None = None,
    ) -> None:
        self.directory = directory
        self.phase_of = phase_of
        self.sink = sink
        self.branches: dict[str, BranchState] = {}
        self._epoch: dict[int, int] = {}  # node -> number of phase switches

    # ---- Alg. E.1 --------------------------------------------------------------------
    def on_request(
        self,
        branch_id: str,
        path: list[BlockHash],
        t: float,
        *,
        program_id: str = "",
        kind: BranchKind = "start",
        parent_id: str | None = None,
    ) -> tuple[int, bool]:
        """Update the branch for a request whose full-page path is `path`.

        Returns (version, version_bumped). `kind` and `parent_id` only describe a new branch.
        """
        st = self.branches.get(branch_id)
        if st is None:
            st = self.branches[branch_id] = BranchState(branch_id, program_id)
            st.path = path
            self._event(t, st, kind, parent_id)
            return st.version, False
        old = st.path
        bumped = common_prefix(old, len(old), path, len(path)) < len(old)
        st.path = path
        if bumped:
            st.version += 1
            st.pending.clear()
            # Release the dropped history once per node: C := C intersect pi_new.
            for n, (cp, cl) in list(st.counted.items()):
                k = common_prefix(cp, cl, path, len(path))
                self._count(st, n, path, k, t)
        self._event(t, st, "compact" if bumped else "append", None)
        return st.version, bumped

    # ---- Alg. E.2 --------------------------------------------------------------------
    def place(self, branch_id: str, node: int, t: float) -> None:
        """Count the branch's current path on `node` (prefill routing or decode binding)."""
        st = self._get(branch_id)
        self._count(st, node, st.path, len(st.path), t)
        st.placed_epoch[node] = self._epoch.get(node, 0)
        phase = self.phase_of(node)
        if any(m != node and self.phase_of(m) == phase for m in st.counted):
            st.pending[phase] = (node, st.version)
        else:
            st.pending.pop(phase, None)

    def confirm(self, branch_id: str, node: int, t: float) -> None:
        """`node` now holds the current version: same-phase copies elsewhere are released."""
        st = self.branches.get(branch_id)
        if st is None:
            return
        phase = self.phase_of(node)
        move = st.pending.get(phase)
        if move is None or move != (node, st.version):
            return
        for m in [m for m in st.counted if m != node and self.phase_of(m) == phase]:
            self._release(st, m, t)
        del st.pending[phase]

    def finish(self, branch_id: str, t: float) -> None:
        """The harness reports the branch finished: release all its counts."""
        st = self.branches.pop(branch_id, None)
        if st is None:
            return
        for m in list(st.counted):
            self._release(st, m, t)
        self._event(t, st, "finish", None)

    def on_phase_switch(self, node: int, from_phase: Phase, to_phase: Phase, t: float) -> None:
        """D->P resets the node's counts to free its memory; P->D keeps them (its KV stays)."""
        self._epoch[node] = self._epoch.get(node, 0) + 1
        if from_phase == "decode" and to_phase == "prefill":
            for st in self.branches.values():
                if node in st.counted:
                    self._release(st, node, t)

    # ---- internals -------------------------------------------------------------------
    def _get(self, branch_id: str) -> BranchState:
        try:
            return self.branches[branch_id]
        except KeyError:
            raise KeyError(f"unknown branch {branch_id!r}: route a request of it first") from None

    def _release(self, st: BranchState, node: int, t: float) -> None:
        self._count(st, node, st.path, 0, t)
        st.placed_epoch.pop(node, None)

    def _count(
        self, st: BranchState, node: int, path: list[BlockHash], length: int, t: float
    ) -> None:
        """Count(beta, n, path[:length])."""
        cur = st.counted.get(node)
        d = self.directory
        if cur is None:
            if length:
                d.add_count(node, path[:length], +1, t)
                st.counted[node] = (path, length)
            return
        cp, cl = cur
        k = common_prefix(cp, cl, path, length)
        if length > k:
            d.add_count(node, path[k:length], +1, t)
        if cl > k:
            d.add_count(node, cp[k:cl], -1, t)
        if length:
            st.counted[node] = (path, length)
        else:
            del st.counted[node]

    def _event(self, t: float, st: BranchState, kind: str, parent: str | None) -> None:
        if self.sink is not None:
            self.sink.emit(
                "branch_events",
                {
                    "t": [t],
                    "branch_id": [st.branch_id],
                    "program_id": [st.program_id],
                    "kind": [kind],
                    "parent_id": [parent],
                    "version": [st.version],
                },
            )

    # ---- views and checks ------------------------------------------------------------
    def nodes_of(self, branch_id: str) -> list[int]:
        st = self.branches.get(branch_id)
        return [] if st is None else list(st.counted)

    def counted_blocks(self, branch_id: str, node: int) -> list[BlockHash]:
        st = self.branches.get(branch_id)
        if st is None or node not in st.counted:
            return []
        p, n = st.counted[node]
        return list(p[:n])

    def recount(self) -> dict[tuple[int, BlockHash], int]:
        """Brute-force R_{b,n} from the branch table (for tests and invariants)."""
        out: dict[tuple[int, BlockHash], int] = {}
        for st in self.branches.values():
            for n, (p, length) in st.counted.items():
                for h in set(p[:length]):
                    out[(n, h)] = out.get((n, h), 0) + 1
        return out

    def check_invariants(self) -> None:
        expected = self.recount()
        actual = self.directory.all_counts()
        for (n, h), c in actual.items():
            if c <= 0:
                raise AssertionError(f"nonpositive count R[{h},{n}] = {c} kept")
        if expected != actual:
            diff = {
                k: (expected.get(k), actual.get(k))
                for k in set(expected) | set(actual)
                if expected.get(k) != actual.get(k)
            }
            raise AssertionError(
                f"counts differ from a recount (expected, actual): {dict(list(diff.items())[:5])}"
            )
        for st in self.branches.values():
            per_phase: dict[Phase, int] = {}
            for n in st.counted:
                if st.placed_epoch.get(n, -1) != self._epoch.get(n, 0):
                    continue  # the node switched phase since the placement
                if any(p[0] == n for p in st.pending.values()):
                    continue  # a same-phase move awaiting confirmation
                ph = self.phase_of(n)
                per_phase[ph] = per_phase.get(ph, 0) + 1
            for ph, k in per_phase.items():
                if k > 1:
                    raise AssertionError(f"branch {st.branch_id} holds counts on {k} {ph} nodes")
