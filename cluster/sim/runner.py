"""Run a simulation with its telemetry written to DuckDB (the embedded default, SPEC §5, §7).

`simulate()` opens a `TelemetryWriter` for the run (source 'sim'), registers the nodes with
the profile's hardware and MoE shape, runs the simulator, closes the writer (consolidating
the run into the database) and returns the summary with the run id.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from cluster.sim.profiles import HardwareProfile
from cluster.sim.simulator import SimConfig, Simulator


def config_dict(cfg: SimConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    if isinstance(cfg.profile, HardwareProfile):
        d["profile"] = cfg.profile.name
    return d


def register_nodes(writer: Any, sim: Simulator) -> None:
    prof = sim.profile
    ids = sim.node_ids
    writer.add_nodes(
        {
            "node_id": ids,
            "name": [f"node-{n}" for n in ids],
            "hardware": [prof.hardware or prof.name] * len(ids),
            "moe_top_k": [prof.top_k if prof.num_experts else 0] * len(ids),
            "moe_experts": [prof.num_experts] * len(ids),
        }
    )


def simulate(
    cfg: SimConfig,
    db_path: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Simulate `cfg`; with `db_path`, write the full telemetry of the run there."""
    if db_path is None:
        sim = Simulator(cfg, progress=progress)
        summary = sim.run()
        summary["run_id"] = None
        return summary
    from telemetry import TelemetryWriter

    with TelemetryWriter(db_path, run_id=run_id, source="sim", config=config_dict(cfg)) as writer:
        sim = Simulator(cfg, sink=writer, progress=progress)
        sim.run_id = writer.run_id
        register_nodes(writer, sim)
        summary = sim.run()
    summary["run_id"] = writer.run_id
    return summary
