"""`pdlab serve` (the default): the simulated cluster paced to wall-clock time (SPEC §5,
`cluster.sim.paced`) behind the control server (SPEC §6).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from cluster.core import ConfigError, leave_garbage_to_os

if TYPE_CHECKING:
    from cluster.sim.config import SimConfig
    from cluster.sim.paced import PaceConfig

console = Console(stderr=True)


def _say(line: str) -> None:
    """A line of the server's shutdown (what it consolidates), printed as it happens."""
    print(f"pdlab serve: {line}", file=sys.stderr, flush=True)


def serve_simulated(
    cfg: SimConfig,
    pace: PaceConfig,
    *,
    host: str,
    port: int,
    token: str,
    db: Path | None,
    run_id: str | None,
) -> None:
    """The simulated cluster paced to wall-clock time behind the server."""
    from cluster.server import ControlService, create_app
    from cluster.sim.paced import PacedSimulation
    from toolkit.serve.loop import bind_port, http_server, run_until_stopped

    try:
        listen = bind_port(host, port)
        engines = PacedSimulation(cfg, db, pace, run_id, say=_say)
        service = ControlService(engines)
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    url = f"http://{host}:{port}"
    adaptive = f" (adaptive: slower when the simulator lags {pace.max_lag_wall_s:g} s)"
    banner = (
        f"[bold]pdlab serve[/] {url}  speed {pace.speed:g}x"
        f"{adaptive if pace.max_lag_wall_s > 0 else ''}  db {db or '(none)'}\n"
        f"  mutating calls: Authorization: Bearer {token}"
    )
    server = http_server(create_app(service, token), host=host, port=port)
    run_until_stopped(server, url=url, token=token, banner=banner, listen=listen)
    # The run is stored and closed: the process exits without freeing the simulated cluster
    # object by object (seconds for 100,000 agents after a SIGTERM).
    leave_garbage_to_os()
    summary = service.summary
    if summary is not None and "requests" in summary:
        console.print(
            f"run {summary.get('run_id')}: {summary['sim_seconds']:.0f} sim-s, "
            f"{summary['requests']} requests, {summary['switches']} switches"
        )
    failure = service.failure or engines.error
    if failure is not None:  # the run did not end well: say so, and in the exit code
        console.print(f"[red]error:[/] the run failed: {escape(failure)}")
        raise typer.Exit(1)
