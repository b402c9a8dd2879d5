"""`pdlab lab`: `pdlab serve` and JupyterLab on the notebooks, started and stopped together.

`lab` starts `pdlab serve` (a simulated cluster, or `--engines torch`: real torch engine
processes) and, once it answers, JupyterLab on `notebooks/` with PDLAB_URL, PDLAB_TOKEN and
PDLAB_DB set, so notebook 04 connects to the server. The live run is added to `--db`, by
default the main job's `pdlab.duckdb`, whose run notebooks 01 and 02 open. The simulated
cluster's default (4 nodes, 32 agents, at most 10x, adaptive pace: `--max-lag`) keeps pace on
a loaded 2-core machine, and when a machine cannot, the clock slows instead of the lag
growing. Both children run in sessions of their own (`toolkit.serve.processes.spawn`); Ctrl-C,
SIGTERM or SIGHUP of `lab` stops both at once, saying so: JupyterLab by SIGTERM (it shuts
its kernels down; any kernel left is terminated), the server by SIGINT (it prints what it
consolidates into the DB, and stops its engines); a `kill -9` of `lab` makes Linux send
both children SIGTERM.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import typer
from rich.console import Console

from cluster.core import ConfigError
from toolkit.cli.serve import ENGINES, TOKEN_ENV

console = Console(stderr=True)
MAIN_DB = "pdlab.duckdb"  # the main job's database (README's first command)
# Lab defaults per kind of engine (nodes, split, agents): a simulated cluster a loaded 2-core
# machine keeps at 10x (9 nodes and 126 agents simulate at ~4x there and write ~7x the rows
# per simulated second), or 3 torch processes.
LAB_SHAPE = {"sim": (4, "2P2D", 32), "torch": (3, "1P2D", 8)}


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


def lab_command(
    notebook_dir: Path = typer.Option(Path("notebooks"), help="Directory JupyterLab opens"),
    port: int = typer.Option(8600, help="Control server port"),
    lab_port: int = typer.Option(8888, help="JupyterLab port"),
    lab_token: str | None = typer.Option(
        None, help="JupyterLab token (default: generated, printed in its URL)"
    ),
    token: str | None = typer.Option(None, help=f"Server bearer token (default: ${TOKEN_ENV})"),
    db: Path = typer.Option(
        Path(MAIN_DB),
        help="DuckDB file the live run is added to; default: the main job's (the README's "
        "first command); notebooks 01/02 read its run, 04 the live one",
    ),
    engines: str = typer.Option("sim", help="sim | torch (real torch engine processes)"),
    speed: float = typer.Option(10.0, help="Simulated seconds per wall-clock second (at most)"),
    max_lag: float = typer.Option(
        2.0,
        "--max-lag",
        help="sim: when the simulator falls this many wall seconds behind --speed, the clock "
        "slows to its pace (the lag stays bounded); 0: fixed pace",
    ),
    workload: str = typer.Option("cc", help="Workload of the cluster's agents"),
    nodes: int | None = typer.Option(None, help="Number of nodes (default 4; torch: 3)"),
    split: str | None = typer.Option(None, help="Initial split XPYD (default 2P2D; torch: 1P2D)"),
    agents: int | None = typer.Option(
        None, help="Concurrent agents, closed loop (default 32; torch: 8)"
    ),
    window: float = typer.Option(
        300.0, help="Planner window (simulated s; shorter than serve's so gains show sooner)"
    ),
    model: str = typer.Option("tiny-moe", help="torch engines: the model preset"),
    token_scale: float = typer.Option(
        0.02, "--token-scale", help="torch engines: workload token counts times this"
    ),
    open_browser: bool = typer.Option(True, "--browser/--no-browser", help="Open a browser"),
) -> None:
    """Start `pdlab serve` and JupyterLab on the notebooks; Ctrl-C stops both and all they started."""
    from toolkit.serve.processes import spawn, stop_signals, stop_tree

    stop_signals()
    try:  # before JupyterLab or the server starts (cluster.size_limits)
        from cluster import size_limits as limits
        from toolkit.cli.serve import check_sizes

        limits.PORT.check("--lab-port", lab_port)
        check_sizes(engines, port=port, nodes=nodes, agents=agents, token_scale=token_scale)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if not notebook_dir.is_dir():
        console.print(f"[red]error:[/] notebook directory {notebook_dir} does not exist")
        raise typer.Exit(2)
    if engines not in ENGINES:
        console.print(f"[red]error:[/] --engines must be one of {', '.join(ENGINES)}")
        raise typer.Exit(2)
    if engines == "torch":
        from toolkit.extras import torch_missing

        if (missing := torch_missing("--engines torch")) is not None:
            typer.echo(f"error: {missing}", err=True)  # one line, however narrow
            raise typer.Exit(2)
    d_nodes, d_split, d_agents = LAB_SHAPE[engines]
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    lab_token = lab_token or secrets.token_urlsafe(18)
    url = f"http://127.0.0.1:{port}"
    db = db.resolve()
    env = {**os.environ, "PDLAB_URL": url, "PDLAB_TOKEN": token, "PDLAB_DB": str(db)}
    serve = spawn(
        [sys.executable, "-m", "toolkit.cli", "serve", "--port", str(port), "--db", str(db),
         "--engines", engines, "--speed", str(speed), "--max-lag", str(max_lag),
         "--workload", workload,
         "--nodes", str(nodes or d_nodes), "--split", split or d_split,
         "--agents", str(agents or d_agents), "--window", str(window), "--model", model,
         "--token-scale", str(token_scale), "--parent-pid", str(os.getpid())],
        env=env,
    )  # fmt: skip
    lab: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(f"{url}/v1/health", serve, 60 if engines == "sim" else 600)
        lab = spawn(
            [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={lab_port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={lab_token}", f"--ServerApp.root_dir={notebook_dir.resolve()}",
             "--ServerApp.open_browser=" + ("True" if open_browser else "False"),
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
            env=env,
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{lab_port}/api", lab, 120)
        print(
            f"pdlab lab: JupyterLab http://127.0.0.1:{lab_port}/lab?token={lab_token}  "
            f"server {url} token={token}",
            flush=True,
        )
        while serve.poll() is None and lab.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except RuntimeError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(1) from None
    finally:
        print(
            f"pdlab lab: stopping JupyterLab and the server (the server consolidates its run "
            f"into {db})",
            file=sys.stderr,
            flush=True,
        )
        # Both at once: JupyterLab's kernels shut down while the server consolidates.
        stopper = None
        if lab is not None:  # SIGINT would ask for confirmation
            stopper = threading.Thread(target=stop_tree, args=(lab, signal.SIGTERM, 20))
            stopper.start()
        stop_tree(serve, signal.SIGINT, 600)  # a long run's consolidation says how it goes
        if stopper is not None:
            stopper.join()
        print("pdlab lab: stopped", file=sys.stderr, flush=True)
