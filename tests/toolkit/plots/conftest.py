"""One small simulated run per test session, and a run whose tables are empty.

The simulated run is sized so every figure has content within ~4 s of simulation: a short
planner window (100 s) so the gain planner evaluates and switches after the 100 s warmup,
and small GPU/host KV tiers so blocks are evicted (with zero and positive counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry import TelemetryWriter

SIM_CONFIG = SimConfig(
    workload="cc",
    agents=20,
    duration_s=400.0,
    warmup_s=100.0,
    nodes=4,
    split="3P1D",
    telemetry="full",
    window_s=100.0,
    cooldown_s=30.0,
    l1_tokens=200_000,
    l2_tokens=400_000,
    seed=0,
)


class SimRun(NamedTuple):
    db: Path
    run_id: str
    summary: dict[str, Any]


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> SimRun:
    db = tmp_path_factory.mktemp("plots") / "sim.duckdb"
    summary = simulate(SIM_CONFIG, db)
    return SimRun(db, summary["run_id"], summary)


@pytest.fixture(scope="session")
def empty_run(tmp_path_factory: pytest.TempPathFactory) -> SimRun:
    """A run with a runs row and two nodes, and no other rows in any table."""
    db = tmp_path_factory.mktemp("plots-empty") / "empty.duckdb"
    with TelemetryWriter(db, run_id="empty-run", source="test", config={"duration_s": 60.0}) as w:
        w.add_nodes(
            {
                "node_id": [0, 1],
                "name": ["a", "b"],
                "hardware": ["x", "x"],
                "moe_top_k": [8, 8],
                "moe_experts": [256, 256],
            }
        )
    return SimRun(db, "empty-run", {})
