"""What the stages of one simulated run share (SPEC §5): the resolved config, the event
kernel, the nodes, the telemetry buffer and the initial phases, handed to each stage as one
`StageContext` by the composition root (`cluster.sim.simulator`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.core import Phase
    from cluster.hardware.profiles import HardwareProfile
    from cluster.sim.buffer import BufferedSink
    from cluster.sim.config import SimConfig
    from cluster.sim.kernel import EventKernel
    from cluster.sim.node import SimNode
    from cluster.sim.resolved import ResolvedConfig


@dataclass(frozen=True, slots=True)
class StageContext:
    """One run's shared parts. `nodes` is filled by the composition root after the control
    plane exists (the stages read it at events, not at construction)."""

    run: ResolvedConfig
    kernel: EventKernel
    nodes: dict[int, SimNode]
    out: BufferedSink
    initial_phases: dict[int, Phase]

    @property
    def cfg(self) -> SimConfig:
        return self.run.config

    @property
    def profile(self) -> HardwareProfile:
        return self.run.profile
