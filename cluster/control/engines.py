"""What the control side needs of a cluster's engines (paper 000 Fig. 1; SPEC §4, §6).

Two protocols, one per direction of a live cluster:

- `EngineBackend`: what the control plane asks of the engines — carry out a phase switch it
  decided (`ControlPlane.request_switch` -> `begin_switch` -> `complete_switch` or
  `cancel_switch`).
- `ClusterEngines`: what a control server needs of a running cluster — its lifecycle, its
  clock, the `ControlPlane` it drives, the status of each node, health, how finished or
  failed it is, its telemetry (and a tap on its rows, for the server's metrics), and its
  completed requests (for the rolling latency).

Implementations: the simulator paced to wall-clock time (`cluster.sim.paced`) and live
SGLang engines (`cluster.sglang.live.cluster`); the server (`cluster.server`) knows only
these protocols, and the CLI (`pdlab serve`) wires one implementation in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from cluster.control.planning import SwitchMode
from cluster.core import Phase, TelemetrySink

if TYPE_CHECKING:
    from cluster.control.control_plane import ControlPlane


class EngineBackend(Protocol):
    """What the control plane asks of the engines (simulated or live)."""

    def begin_switch(self, node: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """Stop the node taking work of its old phase, hand its queued requests back through
        `ControlPlane.reroute` (or equivalent), let running ones finish, and call
        `ControlPlane.complete_switch` when the node serves `to_phase` (or
        `ControlPlane.cancel_switch` when the switch cannot be done). Called with the
        control plane's lock held: return quickly and finish on another thread or event."""
        ...


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as a live view shows it (its phase and switch come from the control plane).

    `extras` are engine-specific JSON fields (an engine's URL, health, stream counters...),
    shown after the common ones.
    """

    out_of_service: bool
    queue: int  # requests waiting for prefill
    running: int  # requests in the running batch (prefill or decode)
    waiting_kv: int  # requests waiting for their KV to arrive before decoding
    kv_gpu_used: int  # tokens
    kv_gpu_capacity: int
    kv_host_used: int
    kv_host_capacity: int
    prefill_iterations: int
    decode_iterations: int
    extras: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "out_of_service": self.out_of_service,
            "queue": self.queue,
            "running": self.running,
            "waiting_kv": self.waiting_kv,
            "kv_gpu_used": self.kv_gpu_used,
            "kv_gpu_capacity": self.kv_gpu_capacity,
            "kv_host_used": self.kv_host_used,
            "kv_host_capacity": self.kv_host_capacity,
            "prefill_iterations": self.prefill_iterations,
            "decode_iterations": self.decode_iterations,
            **self.extras,
        }


class CompletedRequest(NamedTuple):
    """A finished request on the cluster's clock (seconds)."""

    t_arrival: float
    t_first_token: float | None  # None: no token was streamed before the end
    t_done: float


RequestListener = Callable[[CompletedRequest], None]


class ClusterEngines(Protocol):
    """A running cluster behind a control server (see module docstring).

    Once `start` returned, `control_plane` is set and every other call is made with
    `control_plane.lock` held; implementations take that lock in their own threads too.
    Times are seconds on the cluster's clock (`now`): simulated seconds for a simulation,
    seconds since the run started for live engines.
    """

    source: str  # the telemetry run's source ("live-sim", "sglang", ...)
    speed: float  # seconds of the cluster's clock per wall-clock second (1 for live engines)

    @property
    def run_id(self) -> str | None:
        """The telemetry run (None without a database)."""
        ...

    @property
    def db_path(self) -> Path | None: ...

    @property
    def control_plane(self) -> ControlPlane | None:
        """The control plane the engines drive; None until `start`."""
        ...

    def set_request_listener(self, listener: RequestListener) -> None:
        """Call `listener` (lock held) for every request that completes from now on."""
        ...

    def set_telemetry_tap(self, tap: TelemetrySink) -> None:
        """Hand `tap` every batch of telemetry rows (SPEC §3 tables) the engines and their
        control plane write, as the database gets them, with or without a database (the
        server's Prometheus metrics). Called before `start`; `tap.emit` may be called from
        any of the engines' threads."""
        ...

    def start(self) -> None:
        """Open the telemetry run and start the engines (idempotent)."""
        ...

    def stop(self) -> dict[str, Any] | None:
        """Stop the engines, flush and close the telemetry run; the run's summary (None if
        it never started). Idempotent."""
        ...

    def now(self) -> float: ...

    def ended(self) -> str | None:
        """None while the cluster serves; why it stopped serving once it ended, for refusals
        ("the simulated run ended at t=120.0 s (--duration)")."""
        ...

    @property
    def error(self) -> str | None:
        """A failure of the engines' own threads, once one happened (None before). The
        server stops the run when it sees one: `stop()` must then still store what it can
        and close the telemetry run."""
        ...

    def node_ids(self) -> Sequence[int]: ...

    def node_status(self, node: int) -> NodeStatus: ...

    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        ...

    def split_timeline(self) -> Sequence[tuple[float, int, int]]:
        """(t, prefill nodes, decode nodes) at the start and after each change of split."""
        ...

    def health_details(self) -> dict[str, Any]:
        """Engine-specific fields of GET /v1/health (e.g. lag behind the clock, engines up)."""
        ...

    def cluster_details(self) -> dict[str, Any]:
        """Engine-specific fields of GET /v1/cluster (e.g. failed requests, retries)."""
        ...

    def flush_telemetry(self) -> None:
        """Make the rows written so far visible to readers of the database."""
        ...
