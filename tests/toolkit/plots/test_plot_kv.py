"""KV figures: the eviction timeline and branch counts, checked against a replay of the rows."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from telemetry import TelemetryWriter
from toolkit.plots import branch_count_tree, branch_counts_over_time, eviction_timeline


def _rows(db, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_eviction_bars_and_needed_again_match_the_logs(sim_run):
    fig = eviction_timeline(sim_run.db, sim_run.run_id)
    rid = sim_run.run_id
    counts = {
        (tier, ref): n
        for tier, ref, n in _rows(
            sim_run.db,
            "SELECT tier, branch_count > 0, count(*) FROM evictions "
            f"WHERE run_id = '{rid}' GROUP BY ALL",
        )
    }
    host_total = counts[("host", False)] + counts.get(("host", True), 0)
    assert counts[("gpu", False)] and counts[("gpu", True)] and counts[("host", False)]
    for tr in (t for t in fig.data if t.type == "bar"):
        key = (tr.meta["tier"], tr.meta["referenced"])
        assert sum(tr.y) == counts.pop(key)
    assert not counts
    # "Needed again": a later 'stored' event of the block on the same node and tier.
    again = dict(
        _rows(
            sim_run.db,
            f"""
            SELECT e.tier, count(*) FROM evictions e WHERE e.run_id = '{rid}' AND EXISTS (
                SELECT 1 FROM kv_events k WHERE k.run_id = e.run_id AND k.kind = 'stored'
                AND k.node_id = e.node_id AND k.tier = e.tier AND k.block_hash = e.block_hash
                AND k.t > e.t)
            GROUP BY 1
            """,
        )
    )
    lines = {
        t.meta["tier"]: t for t in fig.data if t.type == "scatter" and t.meta.get("needed_again")
    }
    assert {tier: sum(t.y) for tier, t in lines.items()} == again
    assert 0 < again["host"] < host_total  # some, not all, host evictions were re-stored
    title = fig.layout.annotations[0].text
    assert title.startswith("gpu: ") and "needed again: count 0" in title


def _replay(db, run_id: str, t_max: float) -> dict[tuple[int, int], int]:
    """R_{b,n} at t_max: the last logged row per (node, block), in logged order."""
    state: dict[tuple[int, int], int] = {}
    rows = _rows(
        db, f"SELECT node_id, block_hash, t, count FROM branch_counts WHERE run_id = '{run_id}'"
    )
    for node, block, t, count in rows:
        if t <= t_max:
            state[(node, block)] = count
    return state


def test_counts_over_time_end_in_the_replayed_state(sim_run):
    fig = branch_counts_over_time(sim_run.db, sim_run.run_id, bins=40)
    state = _replay(sim_run.db, sim_run.run_id, float("inf"))
    (heat,) = [t for t in fig.data if t.type == "heatmap"]
    last = np.asarray(heat.z)[:, -1]
    for node, value in zip(heat.meta["nodes"], last, strict=True):
        assert value == sum(1 for (n, _), c in state.items() if n == node and c > 0)
    totals = {t.meta["series"]: t.y for t in fig.data if t.type == "scatter"}
    assert totals["blocks with count > 0"][-1] == sum(c > 0 for c in state.values())
    assert totals["Σ counts R_{b,n}"][-1] == sum(state.values())
    # Mid-run, the bin ending at 200 s holds the state at 200 s.
    mid = _replay(sim_run.db, sim_run.run_id, 200.0)
    i = list(heat.x).index(200.0)
    assert totals["Σ counts R_{b,n}"][i] == sum(mid.values())


def test_count_tree_shows_the_most_shared_blocks_at_t(sim_run):
    fig = branch_count_tree(sim_run.db, sim_run.run_id, t=250.0, max_blocks=8)
    (heat,) = fig.data
    assert heat.meta["t"] == 250.0
    state = _replay(sim_run.db, sim_run.run_id, 250.0)
    z = np.asarray(heat.z, dtype=float)
    for i, block in enumerate(heat.meta["blocks"]):
        for j, node in enumerate(heat.meta["nodes"]):
            want = state.get((node, block))
            assert (np.isnan(z[i, j]) and want is None) or z[i, j] == want
    totals: dict[int, int] = {}
    for (_, block), c in state.items():
        totals[block] = totals.get(block, 0) + c
    shown = sorted((totals[b] for b in heat.meta["blocks"]), reverse=True)
    assert shown == sorted(totals.values(), reverse=True)[:8]
    assert len(heat.y) == 8
    # Columns name each node with its phase at t: 3P1D after the warmup, then the switches.
    phases = {0: "P", 1: "P", 2: "P", 3: "D"}
    for node, to in _rows(
        sim_run.db,
        f"SELECT node_id, to_phase FROM phase_switches WHERE run_id = '{sim_run.run_id}' "
        "AND t_done <= 250 ORDER BY t_done",
    ):
        phases[node] = to[0].upper()
    assert list(heat.x) == [f"{phases[n]}{n}" for n in range(4)]


def test_count_tree_of_one_branch(sim_run):
    rid = sim_run.run_id
    (program, branch, t, node) = _rows(
        sim_run.db,
        f"""
        SELECT r.program_id, r.branch_id, d.t, d.node_id FROM router_decisions d
        JOIN requests r USING (run_id, request_id)
        WHERE d.run_id = '{rid}' AND r.branch_id LIKE '%/root'
        ORDER BY d.t DESC LIMIT 1
        """,
    )[0]
    assert branch == f"{program}/root"  # the simulated harness sends cluster-wide IDs
    fig = branch_count_tree(sim_run.db, rid, branch_id=branch, max_blocks=500)
    (heat,) = fig.data
    # Its last placement counts its path on the chosen node.
    assert heat.meta["t"] >= t
    col = heat.meta["nodes"].index(node)
    assert np.nanmax(np.asarray(heat.z, dtype=float)[:, col]) >= 1
    missing = branch_count_tree(sim_run.db, rid, branch_id="nope", program_id=program)
    assert "no counted blocks found for branch 'nope'" in missing.layout.annotations[0].text


def test_count_tree_asks_for_the_program_when_branch_ids_repeat(tmp_path):
    """Harnesses outside pdlab may name branches per program ('root' in every agent)."""
    db = tmp_path / "ext.duckdb"
    with TelemetryWriter(db, run_id="ext", source="external") as w:
        w.add_nodes(
            {"node_id": [0], "name": ["n0"], "hardware": ["x"], "moe_top_k": [8],
             "moe_experts": [256]}
        )  # fmt: skip
        w.append(
            "requests",
            {
                "request_id": ["a/0", "b/0"],
                "program_id": ["a", "b"],
                "branch_id": ["root", "root"],
                "t_arrival": [0.0, 1.0],
                "prefill_node": [0, 0],
                "decode_node": [0, 0],
                "t_in": [1000, 1000],
                "t_c": [0, 0],
                "t_fetch": [0, 0],
                "t_out": [10, 10],
                "t_prefill_start": [0.1, 1.1],
                "t_first_token": [0.2, 1.2],
                "t_done": [1.0, 2.0],
                "t_ideal_c": [0, 0],
            },
        )
        w.append("branch_counts", {"t": [0.1], "node_id": [0], "block_hash": [7], "count": [1]})
    with pytest.raises(ValueError, match=r"occurs in 2 programs of run ext; pass program_id"):
        branch_count_tree(db, "ext", branch_id="root")
