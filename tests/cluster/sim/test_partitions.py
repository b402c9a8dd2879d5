"""Hierarchical partitions (paper 000 App. D.2): independent partitions, one database."""

import pytest

import telemetry
from cluster.core import ConfigError
from cluster.sim.partitions import partition_configs, simulate_partitioned
from cluster.sim.simulator import SimConfig

CFG = SimConfig(
    workload="cc",
    nodes=8,
    split="4P4D",
    agents=24,
    duration_s=200,
    warmup_s=40,
    planner="static",
    telemetry="compact",
    seed=2,
)


def test_partitions_split_nodes_agents_and_seeds():
    parts = partition_configs(CFG, 2)
    assert [p.nodes for p in parts] == [4, 4]
    assert [p.split for p in parts] == ["2P2D", "2P2D"]
    assert sum(p.agents for p in parts) == 24
    assert len({p.seed for p in parts}) == 2
    with pytest.raises(ConfigError, match="divisible"):
        partition_configs(CFG, 3)


def test_partitions_land_in_one_database_and_match_serial_runs(tmp_path):
    db = tmp_path / "parts.duckdb"
    parallel = simulate_partitioned(CFG, 2, db_path=db, run_id="big", processes=2)
    serial = simulate_partitioned(CFG, 2, processes=1)
    # Partitions are independent: the same results in parallel processes or one by one.
    for key in ("requests", "throughput_rps", "mean_e2e_s", "p95_ttft_s", "kv_hit_rate"):
        assert parallel[key] == pytest.approx(serial[key], rel=1e-12), key
    # Speedup counts the elapsed time of the whole run: one by one, that is at least the
    # partitions' wall times added up, so it is at most half the per-partition figure.
    assert serial["wall_seconds"] >= serial["cpu_seconds"]
    assert serial["speedup"] == pytest.approx(serial["sim_seconds"] / serial["wall_seconds"])
    assert serial["speedup"] <= serial["speedup_per_partition"] / 2
    r = telemetry.open_reader(db)
    assert sorted(r.runs()["run_id"].to_list()) == ["big-p0", "big-p1"]
    nodes = r.sql(
        "SELECT run_id, min(node_id) lo, max(node_id) hi FROM nodes GROUP BY run_id ORDER BY run_id"
    )
    assert nodes.rows() == [("big-p0", 0, 3), ("big-p1", 4, 7)]  # global node ids
    reqs = r.sql("SELECT count(*) FROM requests WHERE t_arrival >= 40").item()
    assert reqs == parallel["requests"]
