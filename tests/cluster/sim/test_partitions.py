"""Hierarchical partitions (paper 000 App. D.2): independent partitions, one database."""

import dataclasses
import json
import subprocess
import sys

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
    # partitions' wall times added up, so it is below the per-partition figure (the slowest
    # partition alone). Not "at most half": the two partitions' wall times differ by noise.
    assert serial["wall_seconds"] >= serial["cpu_seconds"]
    assert serial["speedup"] == pytest.approx(serial["sim_seconds"] / serial["wall_seconds"])
    assert serial["speedup"] < serial["speedup_per_partition"]
    r = telemetry.open_reader(db)
    assert sorted(r.runs()["run_id"].to_list()) == ["big-p0", "big-p1"]
    nodes = r.sql(
        "SELECT run_id, min(node_id) lo, max(node_id) hi FROM nodes GROUP BY run_id ORDER BY run_id"
    )
    assert nodes.rows() == [("big-p0", 0, 3), ("big-p1", 4, 7)]  # global node ids
    reqs = r.sql("SELECT count(*) FROM requests WHERE t_arrival >= 40").item()
    assert reqs == parallel["requests"]


def test_a_trace_replayed_at_its_times_is_not_copied_into_every_partition():
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "azure_code_head200.csv"
    timed = dataclasses.replace(CFG, workload=str(trace))
    with pytest.raises(ConfigError, match="not split across partitions"):
        partition_configs(timed, 2)
    assert len(partition_configs(dataclasses.replace(timed, trace_cycle=True), 2)) == 2
    assert len(partition_configs(timed, 1)) == 1


# Tables a partition writes, compared row for row between backends (`runs` holds the start
# time and the parent run id, which differ by design).
TABLES = (
    "nodes",
    "requests",
    "programs",
    "prefill_iterations",
    "decode_iterations",
    "phase_switches",
    "planner_windows",
)


def _rows(reader, table, run_id):
    df = reader.table(table, run_id=run_id).drop("run_id")
    return sorted(df.rows(), key=repr)


@pytest.mark.slow
def test_ray_backend_gives_the_rows_of_local_processes(tmp_path):
    pytest.importorskip("ray", reason="the 'ray' extra (ray[default]) is not installed")
    from typer.testing import CliRunner

    from toolkit.cli import app

    db = tmp_path / "backends.duckdb"
    local = simulate_partitioned(CFG, 2, db_path=db, run_id="loc", processes=2)
    # The CLI starts a local Ray runtime of 2 CPUs for the run and shuts it down after.
    args = ["simulate", "--workload", "cc", "--nodes", "8", "--split", "4P4D", "--agents", "24"]
    args += ["--duration", "200", "--warmup", "40", "--planner", "static", "--seed", "2"]
    args += ["--telemetry", "compact", "--partitions", "2", "--backend", "ray"]
    args += ["--processes", "2", "--db", str(db), "--run-id", "ray", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    import ray

    assert not ray.is_initialized()  # the runtime it started is gone
    remote = json.loads(res.stdout.strip().splitlines()[-1])
    assert remote["partition_runs"] == ["ray-p0", "ray-p1"]
    for key in ("requests", "throughput_rps", "mean_e2e_s", "p95_ttft_s", "kv_hit_rate"):
        assert remote[key] == local[key], key
    r = telemetry.open_reader(db)
    for k in range(2):
        for table in TABLES:
            assert _rows(r, table, f"ray-p{k}") == _rows(r, table, f"loc-p{k}"), (table, k)
    assert len(_rows(r, "requests", "ray-p0")) > 50


def test_ray_backend_without_ray_names_the_extra(tmp_path):
    # A None entry in sys.modules makes `import ray` fail as on a machine without the extra.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from toolkit.cli import app\n"
        "app(['simulate', '--nodes', '8', '--split', '4P4D', '--partitions', '2',"
        " '--backend', 'ray', '--duration', '60'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "pip install 'pdlab[ray]'" in res.stderr
    with pytest.raises(ConfigError, match="backend must be one of local, ray"):
        simulate_partitioned(CFG, 2, backend="dask")
