"""`pdlab serve` (the live control server of SPEC §6) and `pdlab lab` (server + JupyterLab).

`serve` paces the embedded simulated cluster (SPEC §5) to wall-clock time and exposes its
control plane over REST on 127.0.0.1 unless told otherwise. Defaults suit a demo: no
collocated warmup (`--warmup 0`, so manual switches work at once; the planner uses the
profile's coefficients instead of models fitted during a warmup), the gain planner in
`advise` mode (it evaluates every window and shows its candidates; nothing switches unless
you apply it or set mode auto). `lab` starts `serve` in the background and JupyterLab on
`notebooks/` with PDLAB_URL, PDLAB_TOKEN and PDLAB_DB set, so notebook 04 connects.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.console import Console

from cluster.core import ConfigError

console = Console(stderr=True)
TOKEN_ENV = "PDLAB_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve_command(
    workload: str = typer.Option("cc", help="putnam | cc | osworld | shift | path to a trace"),
    nodes: int = typer.Option(9, help="Number of nodes"),
    split: str = typer.Option("4P5D", help="Initial split XPYD, or 'collocated'"),
    agents: int | None = typer.Option(None, help="Closed loop: concurrent agents (default 126)"),
    arrival_rate: float | None = typer.Option(
        None, "--arrival-rate", help="Open loop: Poisson agent arrivals per minute"
    ),
    duration: float = typer.Option(86_400.0, help="Simulated seconds before the run ends"),
    warmup: float = typer.Option(
        0.0, help="Warmup seconds (with --planner gain: collocated, switches refused until it ends)"
    ),
    planner: str = typer.Option("gain", help="gain | static | dynamo | arrow"),
    planner_mode: str = typer.Option("advise", help="auto | advise | off"),
    window: float = typer.Option(600.0, help="Planner window T_win (simulated seconds)"),
    slices: int = typer.Option(10, help="Planner slices m per window"),
    router: str = typer.Option(
        "ttft", help="ttft | cache-aware | dynamo | sticky | round-robin | least-loaded"
    ),
    eviction: str = typer.Option("branch", help="branch | lru"),
    profile: str = typer.Option("gb300", help="Hardware preset (gb300, h200) or fit JSON"),
    seed: int = typer.Option(0, help="Random seed"),
    speed: float = typer.Option(10.0, help="Simulated seconds per wall-clock second"),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)"),
    port: int = typer.Option(8600, help="TCP port"),
    token: str | None = typer.Option(
        None, help=f"Bearer token for mutating calls (default: ${TOKEN_ENV}, else generated)"
    ),
    db: Path | None = typer.Option(None, help="DuckDB file the run's telemetry is written to"),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: generated)"),
    telemetry: str = typer.Option("full", help="full | compact"),
    sglang: Path | None = typer.Option(
        None,
        "--sglang",
        help="Serve live SGLang engines from this cluster file (TOML/JSON) instead of the "
        "simulator; policies come from its [cluster] table (see toolkit/commands_serve_sglang.py)",
    ),
) -> None:
    """Serve the control-plane REST API over a simulated cluster paced to wall-clock time."""
    import uvicorn

    from cluster.server import LiveCluster, LiveConfig, create_app
    from cluster.sim.simulator import SimConfig

    if agents is None and arrival_rate is None:
        agents = 126
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    if sglang is not None:  # live SGLang cluster: toolkit/commands_serve_sglang.py
        from toolkit.commands_serve_sglang import serve_sglang

        serve_sglang(sglang, host=host, port=port, token=token, db=db, run_id=run_id)
        return
    try:
        cfg = SimConfig(
            workload=workload,
            nodes=nodes,
            split=split,
            agents=agents,
            arrival_rate_per_min=arrival_rate,
            duration_s=duration,
            warmup_s=warmup,
            planner=planner,
            router=router,
            eviction=eviction,
            profile=profile,
            seed=seed,
            window_s=window,
            slices=slices,
            telemetry=telemetry,
        )
        live = LiveCluster(cfg, db, LiveConfig(speed=speed, planner_mode=planner_mode), run_id)
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    if host not in LOOPBACK:
        console.print(f"[yellow]warning:[/] binding {host}: the API is reachable from the network")
    app = create_app(live, token)
    url = f"http://{host}:{port}"
    # Printed before the server starts so wrappers (pdlab lab, tests) can read it at once.
    print(f"pdlab serve: {url} token={token}", flush=True)
    console.print(
        f"[bold]pdlab serve[/] {url}  speed {speed:g}x  db {db or '(none)'}\n"
        f"  mutating calls: Authorization: Bearer {token}"
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    )
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        server.run()
    summary = live.summary
    if summary is not None:
        console.print(
            f"run {summary.get('run_id')}: {summary['sim_seconds']:.0f} sim-s, "
            f"{summary['requests']} requests, {summary['switches']} switches"
        )


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


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 40.0, sig: int = signal.SIGINT) -> None:
    """Ask `proc` to shut down cleanly (the server closes its telemetry run), then insist."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def lab_command(
    notebook_dir: Path = typer.Option(Path("notebooks"), help="Directory JupyterLab opens"),
    port: int = typer.Option(8600, help="Control server port"),
    lab_port: int = typer.Option(8888, help="JupyterLab port"),
    lab_token: str | None = typer.Option(
        None, help="JupyterLab token (default: generated, printed in its URL)"
    ),
    token: str | None = typer.Option(None, help=f"Server bearer token (default: ${TOKEN_ENV})"),
    db: Path = typer.Option(
        Path("pdlab-live.duckdb"), help="DuckDB file the live run writes (notebooks read it)"
    ),
    speed: float = typer.Option(10.0, help="Simulated seconds per wall-clock second"),
    workload: str = typer.Option("cc", help="Workload of the simulated cluster"),
    nodes: int = typer.Option(9, help="Number of nodes"),
    split: str = typer.Option("4P5D", help="Initial split XPYD"),
    agents: int = typer.Option(126, help="Concurrent agents (closed loop)"),
    window: float = typer.Option(
        300.0, help="Planner window (simulated s; shorter than serve's so gains show sooner)"
    ),
    open_browser: bool = typer.Option(True, "--browser/--no-browser", help="Open a browser"),
) -> None:
    """Start `pdlab serve` in the background and JupyterLab on the notebooks; Ctrl-C stops both."""
    if not notebook_dir.is_dir():
        console.print(f"[red]error:[/] notebook directory {notebook_dir} does not exist")
        raise typer.Exit(2)
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    lab_token = lab_token or secrets.token_urlsafe(18)
    url = f"http://127.0.0.1:{port}"
    db = db.resolve()
    env = {**os.environ, "PDLAB_URL": url, "PDLAB_TOKEN": token, "PDLAB_DB": str(db)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "serve", "--port", str(port), "--db", str(db),
         "--speed", str(speed), "--workload", workload, "--nodes", str(nodes),
         "--split", split, "--agents", str(agents), "--window", str(window)],
        env=env,
    )  # fmt: skip
    lab: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(f"{url}/v1/health", serve, 60)
        lab = subprocess.Popen(
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
        if lab is not None:
            _stop(lab, 20, signal.SIGTERM)  # SIGINT would ask for confirmation
        _stop(serve)
