"""`pdlab serve`: the live control server of SPEC §6 over a simulated or a real cluster.

The command checks its options and hands them to a composition root of toolkit/serve/. By
default it paces the embedded simulated cluster (SPEC §5, `cluster.sim.paced`) to wall-clock
time (toolkit/serve/simulated.py); with
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

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from cluster.core import ConfigError
from toolkit.cli.sim_command import sim_command

if TYPE_CHECKING:
    from cluster.sim.config import SimConfig
    from toolkit.cli.sim_options import SimOptions
    from toolkit.serve.torch import TorchClusterOptions

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
    sim = _checked(engines, sim, sglang, port, token_scale, time_scale, max_output_tokens, db)
    if host not in LOOPBACK:
        console.print(f"[yellow]warning:[/] binding {host}: the API is reachable from the network")
    where = {"host": host, "port": port, "token": token, "db": db, "run_id": run_id}
    if sglang is not None:  # live SGLang cluster: toolkit/serve/sglang.py
        from toolkit.serve.sglang import serve_sglang

        serve_sglang(sglang, **where)
    elif engines == "torch":
        from toolkit.serve.torch import serve_torch

        opts = _torch_options(
            sim, model, device, planner_mode, engine_arg, token_scale, time_scale,
            max_output_tokens,
        )  # fmt: skip
        serve_torch(opts, **where)
    else:
        from cluster.sim.paced import PaceConfig
        from toolkit.serve.simulated import serve_simulated

        pace = PaceConfig(speed=speed, planner_mode=planner_mode, max_lag_wall_s=max_lag)
        serve_simulated(_config(sim), pace, **where)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(2)


def _checked(
    engines: str,
    sim: SimOptions,
    sglang: Path | None,
    port: int,
    token_scale: float,
    time_scale: float,
    max_output_tokens: int,
    db: Path | None,
) -> SimOptions:
    """The simulation options with the shape of the kind of engine filled in, after every
    check that can fail before anything starts or allocates (a typo is one line, not 22 GB)."""
    if engines not in ENGINES:
        raise _fail(f"--engines must be one of {', '.join(ENGINES)}, got {engines!r}")
    if engines == "torch" and sglang is None:
        from toolkit.extras import torch_missing

        if (missing := torch_missing("--engines torch")) is not None:
            typer.echo(f"error: {missing}", err=True)  # one line, however narrow
            raise typer.Exit(2)
    d_nodes, d_split, d_agents = DEFAULT_SHAPE[engines]
    nodes = d_nodes if sim.get("nodes") is None else sim.get("nodes")
    split = d_split if sim.get("split") is None else sim.get("split")
    agents = sim.get("agents")
    if agents is None and sim.get("arrival_rate") is None:
        agents = d_agents
    sim = sim.replace(nodes=nodes, split=split, agents=agents)
    try:
        check_sizes(
            engines, port=port, nodes=nodes, agents=agents, duration_s=sim.get("duration"),
            token_scale=token_scale, time_scale=time_scale, max_output_tokens=max_output_tokens,
        )  # fmt: skip
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if db is not None:  # before anything starts: a wrong file is one line, not a traceback
        from telemetry.database import check_database
        from telemetry.errors import TelemetryError

        try:
            check_database(db)
        except TelemetryError as exc:
            raise _fail(f"--db: {exc}") from None
    return sim


def _torch_options(
    sim: SimOptions,
    model: str,
    device: str,
    planner_mode: str,
    engine_arg: list[str],
    token_scale: float,
    time_scale: float,
    max_output_tokens: int,
) -> TorchClusterOptions:
    from toolkit.serve.torch import TorchClusterOptions

    opt = sim.get
    return TorchClusterOptions(
        nodes=opt("nodes"), split=opt("split"), model=model, device=device, seed=opt("seed"),
        eviction=opt("eviction"), router=opt("router"), planner=opt("planner"),
        planner_mode=planner_mode, window_s=opt("window"), slices=opt("slices"),
        profile=opt("profile"), engine_args=tuple(engine_arg), workload=opt("workload"),
        agents=opt("agents"), arrival_rate_per_min=opt("arrival_rate"),
        duration_s=opt("duration"), cycle=opt("cycle"), token_scale=token_scale,
        time_scale=time_scale, max_output_tokens=max_output_tokens,
    )  # fmt: skip


def _config(sim: SimOptions) -> SimConfig:
    """The simulated cluster's configuration (SimConfig checks every option again)."""
    try:
        return sim.to_config()
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
