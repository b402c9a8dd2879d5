"""`pdlab serve`: the live control server of SPEC §6 over a simulated or a real cluster.

`serve` is the composition root of the live control server. By default it paces the
embedded simulated cluster (SPEC §5, `cluster.sim.paced`) to wall-clock time; with
`--engines torch` it starts real torch engine processes and an agent client
(toolkit/serve/torch.py); with `--sglang FILE` it drives live SGLang engines
(toolkit/serve/sglang.py). Each hands its cluster to the server
(`cluster.server.ControlService`), which exposes the control plane over REST on 127.0.0.1
unless told otherwise. Defaults suit a demo: no collocated warmup (`--warmup 0`, so manual
switches work at once; the planner uses the profile's coefficients instead of models fitted
during a warmup), the gain planner in `advise` mode (it evaluates every window and shows its
candidates; nothing switches unless you apply it or set mode auto). Ctrl-C, SIGTERM and
SIGHUP stop the server cleanly: the run is consolidated into `--db` and every process the
command started is stopped (`toolkit.serve.processes`). `pdlab lab` (toolkit/cli/lab.py)
runs it next to JupyterLab.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from cluster.core import ConfigError, leave_garbage_to_os
from toolkit.cli.sim_command import sim_command

if TYPE_CHECKING:
    from cluster.sim.paced import PaceConfig
    from toolkit.cli.sim_options import SimOptions

console = Console(stderr=True)
TOKEN_ENV = "PDLAB_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ENGINES = ("sim", "torch")
# Cluster shape defaults per kind of engine: 9 simulated nodes, or 3 torch processes.
DEFAULT_SHAPE = {"sim": (9, "4P5D", 126), "torch": (3, "1P2D", 8)}


def check_sizes(
    engines: str,
    *,
    port: int,
    nodes: int | None,
    agents: int | None,
    duration_s: float | None = None,
    token_scale: float | None = None,
    time_scale: float | None = None,
    max_output_tokens: int | None = None,
) -> None:
    """The sizes `pdlab serve` and `pdlab lab` take, against their ceilings
    (cluster.size_limits; ConfigError naming the flag). The simulated cluster's options are
    checked again, all of them, by its SimConfig."""
    from cluster import size_limits as limits

    limits.check("--port", port, limits.PORT)
    limits.check("--nodes", nodes, limits.TORCH_NODES if engines == "torch" else limits.NODES)
    if nodes is not None:
        limits.check_agents("--agents", agents, nodes)
    limits.check("--duration", duration_s, limits.SIM_SECONDS)
    limits.check("--token-scale", token_scale, limits.TOKEN_SCALE)
    limits.check("--time-scale", time_scale, limits.TIME_SCALE)
    limits.check("--max-output-tokens", max_output_tokens, limits.OUTPUT_TOKENS)


# The simulation options `serve` offers (SimConfig's fields, toolkit/cli/sim_command.py), with the
# defaults of a demo: the cluster shape per kind of engine (DEFAULT_SHAPE), a day's run and
# no warmup (manual switches work at once).
SERVE_SIM_OPTIONS = (
    "workload", "nodes", "split", "agents", "arrival_rate", "duration", "warmup", "learn",
    "planner", "router", "eviction", "profile", "seed", "window", "slices", "telemetry", "cycle",
)  # fmt: skip
SERVE_SIM_OVERRIDES: dict[str, dict[str, object]] = {
    "nodes": {"default": None, "help": "Number of nodes (default 9; torch: 3)"},
    "split": {
        "default": None,
        "help": "Initial split XPYD, or 'collocated' (default 4P5D; torch: 1P2D)",
    },
    "agents": {"help": "Closed loop: concurrent agents (default 126; torch: 8)"},
    "duration": {
        "default": 86_400.0,
        "help": "Seconds before the run ends (simulated; torch: wall seconds of agents)",
    },
    "warmup": {
        "default": 0.0,
        "help": "Warmup seconds (with --planner gain: collocated, switches refused, for the "
        "first --learn of them)",
    },
}


@sim_command(only=SERVE_SIM_OPTIONS, overrides=SERVE_SIM_OVERRIDES)
def serve_command(
    engines: str = typer.Option(
        "sim",
        help="sim (a simulated cluster paced to wall-clock time) | torch (real torch "
        "engine processes, see --model)",
    ),
    sim: SimOptions = None,  # type: ignore[assignment]  # SERVE_SIM_OPTIONS (toolkit/cli/sim_command.py)
    planner_mode: str = typer.Option("advise", help="auto | advise | off"),
    speed: float = typer.Option(10.0, help="Simulated seconds per wall-clock second"),
    max_lag: float = typer.Option(
        0.0,
        "--max-lag",
        help="Adaptive pace: when the simulator falls this many wall seconds behind --speed, "
        "the clock slows to its pace (the lag stays bounded; health reports speed_kept). "
        "0: fixed pace, the lag may grow without bound",
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)"),
    port: int = typer.Option(8600, help="TCP port"),
    token: str | None = typer.Option(
        None, help=f"Bearer token for mutating calls (default: ${TOKEN_ENV}, else generated)"
    ),
    db: Path | None = typer.Option(None, help="DuckDB file the run's telemetry is written to"),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: generated)"),
    model: str = typer.Option("tiny-moe", help="torch engines: tiny-moe | small-moe | small-dense"),
    device: str = typer.Option("cpu", help="torch engines: cpu | cuda"),
    token_scale: float = typer.Option(
        0.02,
        "--token-scale",
        help="torch engines: the workload's token counts (contexts and outputs) times this",
    ),
    time_scale: float = typer.Option(
        0.1, "--time-scale", help="torch engines: the workload's tool gaps and arrivals times this"
    ),
    max_output_tokens: int = typer.Option(
        32, "--max-output-tokens", help="torch engines: cap of a turn's output tokens"
    ),
    engine_arg: list[str] = typer.Option(
        [], "--engine-arg", help="torch engines: one more `pdlab engine` argument (repeatable)"
    ),
    parent_pid: int | None = typer.Option(
        None, "--parent-pid", help="Stop as on SIGTERM once this process (the launcher) is gone"
    ),
    sglang: Path | None = typer.Option(
        None,
        "--sglang",
        help="Serve live SGLang engines from this cluster file (TOML/JSON) instead of the "
        "simulator; policies come from its [cluster] table (see toolkit/serve/sglang.py)",
    ),
) -> None:
    """Serve the control-plane REST API over a simulated (or real) cluster."""
    from toolkit.serve.processes import exit_with_parent, stop_signals

    stop_signals()  # SIGTERM and SIGHUP stop the server as Ctrl-C does
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    if engines not in ENGINES:
        console.print(
            f"[red]error:[/] --engines must be one of {', '.join(ENGINES)}, got {engines!r}"
        )
        raise typer.Exit(2)
    if engines == "torch" and sglang is None:
        from toolkit.extras import torch_missing

        if (missing := torch_missing("--engines torch")) is not None:
            typer.echo(f"error: {missing}", err=True)  # one line, however narrow
            raise typer.Exit(2)
    d_nodes, d_split, d_agents = DEFAULT_SHAPE[engines]
    nodes = d_nodes if sim.get("nodes") is None else sim.get("nodes")
    split = d_split if sim.get("split") is None else sim.get("split")
    agents, arrival_rate = sim.get("agents"), sim.get("arrival_rate")
    if agents is None and arrival_rate is None:
        agents = d_agents
    sim = sim.replace(nodes=nodes, split=split, agents=agents)
    duration = sim.get("duration")
    try:  # before anything starts or allocates: a typo is one line, not 22 GB
        check_sizes(
            engines, port=port, nodes=nodes, agents=agents, duration_s=duration,
            token_scale=token_scale, time_scale=time_scale, max_output_tokens=max_output_tokens,
        )  # fmt: skip
    except ConfigError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    if db is not None:  # before anything starts: a wrong file is one line, not a traceback
        from telemetry.database import check_database
        from telemetry.errors import TelemetryError

        try:
            check_database(db)
        except TelemetryError as exc:
            console.print(f"[red]error:[/] --db: {escape(str(exc))}")
            raise typer.Exit(2) from None
    if host not in LOOPBACK:
        console.print(f"[yellow]warning:[/] binding {host}: the API is reachable from the network")
    if sglang is not None:  # live SGLang cluster: toolkit/serve/sglang.py
        from toolkit.serve.sglang import serve_sglang

        serve_sglang(sglang, host=host, port=port, token=token, db=db, run_id=run_id)
        return
    if engines == "torch":
        from toolkit.serve.torch import TorchClusterOptions, serve_torch

        opt = sim.get
        opts = TorchClusterOptions(
            nodes=nodes, split=split, model=model, device=device, seed=opt("seed"),
            eviction=opt("eviction"), router=opt("router"), planner=opt("planner"),
            planner_mode=planner_mode, window_s=opt("window"), slices=opt("slices"),
            profile=opt("profile"), engine_args=tuple(engine_arg), workload=opt("workload"),
            agents=agents, arrival_rate_per_min=arrival_rate, duration_s=duration,
            cycle=opt("cycle"), token_scale=token_scale, time_scale=time_scale,
            max_output_tokens=max_output_tokens,
        )  # fmt: skip
        serve_torch(opts, host=host, port=port, token=token, db=db, run_id=run_id)
        return
    from cluster.sim.paced import PaceConfig

    pace = PaceConfig(speed=speed, planner_mode=planner_mode, max_lag_wall_s=max_lag)
    _serve_sim(sim, pace, host=host, port=port, token=token, db=db, run_id=run_id)


def _say(line: str) -> None:
    """A line of the server's shutdown (what it consolidates), printed as it happens."""
    print(f"pdlab serve: {line}", file=sys.stderr, flush=True)


def _serve_sim(
    options: SimOptions,
    pace: PaceConfig,
    *,
    host: str,
    port: int,
    token: str,
    db: Path | None,
    run_id: str | None,
) -> None:
    """The simulated cluster paced to wall-clock time behind the server."""
    import uvicorn

    from cluster.server import ControlService, create_app
    from cluster.sim.paced import PacedSimulation
    from toolkit.serve.processes import serving

    try:
        cfg = options.to_config()
        engines = PacedSimulation(cfg, db, pace, run_id, say=_say)
        service = ControlService(engines)
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    app = create_app(service, token)
    url = f"http://{host}:{port}"
    # Printed before the server starts so wrappers (pdlab lab, tests) can read it at once.
    print(f"pdlab serve: {url} token={token}", flush=True)
    adaptive = f" (adaptive: slower when the simulator lags {pace.max_lag_wall_s:g} s)"
    console.print(
        f"[bold]pdlab serve[/] {url}  speed {pace.speed:g}x"
        f"{adaptive if pace.max_lag_wall_s > 0 else ''}  db {db or '(none)'}\n"
        f"  mutating calls: Authorization: Bearer {token}"
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    )
    # uvicorn re-raises the SIGINT (SIGTERM, SIGHUP: toolkit.serve.processes) it handled
    with serving(server), contextlib.suppress(KeyboardInterrupt):
        server.run()
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
