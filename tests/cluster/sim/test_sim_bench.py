"""The simulator bench runs the workloads it names (no timing is asserted)."""

import csv
from pathlib import Path

import pytest

from cluster.sim import bench
from cluster.sim.partitions import partition_configs
from cluster.workloads.traces import open_text


def test_the_rss_partition_is_one_of_the_3072gpu_runs_eight():
    full = bench.config_3072gpu()
    assert full.nodes * 4 == 3072
    part = bench.config_partition(quick=False)
    assert part == partition_configs(full, 8)[0]
    assert (part.nodes, part.agents, part.duration_s) == (96, 3840, 600.0)
    assert bench.config_partition(quick=True).nodes == 96


def test_azure_child_replays_the_trace_open_loop():
    cfg = bench.config_azure(quick=True)  # the shared data's trace, else the bundled gzip copy
    with open_text(Path(cfg.workload), newline="") as f:
        arrivals = [float(r["arrived_at"]) for r in csv.DictReader(f)]
    before = sum(1 for t in arrivals if t < cfg.duration_s)
    figures, wall_s = bench.run_child("azure", quick=True)
    # Every finished request is one of the trace's (none added to keep agents busy), and
    # 8 nodes keep up with its rate, so nearly all that arrived have finished.
    assert 0.95 * before <= figures["requests"] <= before
    assert figures["sim_seconds"] == cfg.duration_s
    assert figures["peak_rss_mb"] > 10 and wall_s > figures["wall_seconds"]


def test_an_unknown_child_names_the_choices():
    with pytest.raises(RuntimeError, match="choose from: cc, azure, partition"):
        bench.run_child("nope", quick=True)


def test_user_path_figures_come_from_pdlab_simulate_writing_its_database():
    # The bench times `pdlab simulate ... --db` as a whole process (the users' path); its
    # summary is the CLI's JSON, and the database is written (and removed with its folder).
    summary, wall_s = bench.simulate_cli(
        [
            "--workload",
            "cc",
            "--nodes",
            "2",
            "--split",
            "1P1D",
            "--agents",
            "4",
            "--duration",
            "30",
            "--warmup",
            "0",
        ]
    )
    assert summary["requests"] > 0 and summary["run_id"]
    assert wall_s > summary["wall_seconds"] > 0
    assert "--seed" in bench.CC_ARGS and "compact" in bench.AZURE_ARGS
