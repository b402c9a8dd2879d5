"""Run a simulation with its telemetry written to DuckDB (the embedded default, SPEC §5, §7).

`simulate()` builds the simulator first (configuration, profile, policies and trace are
checked there), then opens a `TelemetryWriter` for the run (source 'sim'), registers the
nodes with the profile's hardware and MoE shape, runs the simulator and closes the writer
(consolidating the run into the database); it returns the summary with the run id.

A setup error therefore never creates a run. An exception mid-run ends the run as failed
(`TelemetryWriter.abort`): the rows simulated until then are flushed and kept, marked with
the error, or the run is removed when nothing but its registration was written. A killed
process leaves its live segments (at most the last few wall seconds of rows missing) for
`pdlab recover`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cluster.core import TelemetrySink
from cluster.hardware.profiles import HardwareProfile
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


class _LateSink:
    """The simulator's sink before the run exists: rows wait until the writer is attached."""

    def __init__(self) -> None:
        self.target: TelemetrySink | None = None
        self._early: list[tuple[str, Mapping[str, Sequence[Any]]]] = []

    def attach(self, target: TelemetrySink) -> None:
        self.target = target
        early, self._early = self._early, []
        for table, columns in early:
            target.emit(table, columns)

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        if self.target is None:
            self._early.append((table, columns))
        else:
            self.target.emit(table, columns)


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

    late = _LateSink()
    sim = Simulator(cfg, sink=late, progress=progress)
    writer = TelemetryWriter(db_path, run_id=run_id, source="sim", config=config_dict(cfg))
    try:
        sim.run_id = writer.run_id
        register_nodes(writer, sim)
        late.attach(writer)
        summary = sim.run()
    except BaseException as exc:
        # Keep what was simulated up to the failure; a row the writer rejects (the failure
        # itself, perhaps) must not hide `exc`.
        with contextlib.suppress(Exception):
            sim.out.flush()
        writer.abort(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        raise
    writer.close()
    summary["run_id"] = writer.run_id
    return summary
