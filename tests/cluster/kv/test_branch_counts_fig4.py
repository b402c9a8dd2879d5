"""Paper 000 Fig. 4 (a)-(d) as tests with the exact counts the figure shows.

Both branches start on prefill node P1 (node 0). P2 = node 1, D1 = node 2. Blocks are named
by letters; chained hashes make them paths from the root.
"""

import pytest

from cluster.kv.branches import BranchTable
from cluster.kv.directory import KVDirectory
from cluster.kv.hashing import chain

P1, P2, D1 = 0, 1, 2
PHASE = {P1: "prefill", P2: "prefill", D1: "decode"}


def path(*names: str) -> list[int]:
    h, out = 0, []
    for n in names:
        h = chain(h, (ord(n),))
        out.append(h)
    return out


@pytest.fixture
def table():
    d = KVDirectory(block_tokens=4)
    return BranchTable(d, PHASE.__getitem__), d


def R(d, node, *names):
    return [d.count(node, h) for h in path(*names)]


def test_a_consecutive_request_counts_only_its_new_block(table):
    t, d = table
    # Branch 1 context S-A, branch 2 (a fork of the same prefix) S-B; both on P1.
    t.on_request("b1", path("S", "A"), 0.0)
    t.place("b1", P1, 0.0)
    t.on_request("b2", path("S", "B"), 0.0, kind="fork", parent_id="b1")
    t.place("b2", P1, 0.0)
    assert R(d, P1, "S") == [2]
    # Branch 1's next request appends block C: +1 on C only, S and A keep their counts.
    t.on_request("b1", path("S", "A", "C"), 1.0)
    t.place("b1", P1, 1.0)
    assert R(d, P1, "S", "A", "C") == [2, 1, 1]
    assert R(d, P1, "S", "B") == [2, 1]
    t.check_invariants()


def test_b_compaction_bumps_version_and_releases_dropped_history(table):
    t, d = table
    t.on_request("b1", path("S", "A", "C"), 0.0)
    t.place("b1", P1, 0.0)
    t.on_request("b2", path("S", "B"), 0.0, kind="fork", parent_id="b1")
    t.place("b2", P1, 0.0)
    version, bumped = t.on_request("b1", path("S", "Z"), 1.0)  # summary Z replaces A, C
    assert (version, bumped) == (2, True)
    assert R(d, P1, "A", "C") == [0, 0]  # dashed in the figure
    t.place("b1", P1, 1.0)
    assert R(d, P1, "S", "Z") == [2, 1]
    t.check_invariants()


def test_c_same_phase_move_releases_source_once_target_holds(table):
    t, d = table
    t.on_request("b1", path("S", "A"), 0.0)
    t.place("b1", P1, 0.0)
    t.on_request("b1", path("S", "A", "C"), 1.0)
    t.place("b1", P2, 1.0)  # P2P move
    assert R(d, P2, "S", "A", "C") == [1, 1, 1]
    assert R(d, P1, "S", "A") == [1, 1]  # source still counted until P2 holds the version
    t.confirm("b1", P2, 1.5)
    assert R(d, P1, "S", "A") == [0, 0]
    assert R(d, P2, "S", "A", "C") == [1, 1, 1]
    t.check_invariants()


def test_d_cross_phase_transfers_keep_both_copies(table):
    t, d = table
    t.on_request("b1", path("S", "A"), 0.0)
    t.place("b1", P1, 0.0)
    t.confirm("b1", P1, 0.1)
    t.place("b1", D1, 0.1)  # P2D at decode binding
    t.confirm("b1", D1, 0.2)
    assert R(d, P1, "S", "A") == [1, 1]
    assert R(d, D1, "S", "A") == [1, 1]
    # Next step: only the new block is counted on each node.
    t.on_request("b1", path("S", "A", "C"), 1.0)
    t.place("b1", P1, 1.0)
    t.place("b1", D1, 1.1)
    assert R(d, P1, "S", "A", "C") == [1, 1, 1]
    assert R(d, D1, "S", "A", "C") == [1, 1, 1]
    t.check_invariants()


def test_finish_and_phase_switch_rules(table):
    t, d = table
    t.on_request("b1", path("S", "A"), 0.0)
    t.place("b1", P1, 0.0)
    t.place("b1", D1, 0.0)
    PHASE_LOCAL = dict(PHASE)
    t.phase_of = PHASE_LOCAL.__getitem__
    PHASE_LOCAL[P1] = "decode"
    t.on_phase_switch(P1, "prefill", "decode", 1.0)  # P->D keeps
    assert R(d, P1, "S", "A") == [1, 1]
    PHASE_LOCAL[D1] = "prefill"
    t.on_phase_switch(D1, "decode", "prefill", 1.0)  # D->P resets
    assert R(d, D1, "S", "A") == [0, 0]
    t.finish("b1", 2.0)
    assert R(d, P1, "S", "A") == [0, 0]
    assert d.stats()["blocks"] == 0 and d.all_counts() == {}  # nothing held, nothing counted
    t.check_invariants()
