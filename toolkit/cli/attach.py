"""`pdlab attach`: watch a running vLLM/SGLang fleet in shadow mode (SPEC §6).

The fleet runs as it was started, behind its own router; pdlab only listens and reads:
KV events, forward-pass metrics or pdlab's vLLM step stream, and each engine's /metrics,
into `--db` (tables `kv_events`, `prefill_iterations`, `decode_iterations`, `requests`,
`engine_metrics`, `router_decisions`, `planner_windows`). It serves the same REST API as
`pdlab serve` (notebook 04's dashboard and the notebooks read it), with the router's and
planner's recommendations computed live from the fleet's own fits under GET /v1/cluster's
"shadow" — never acted on: the planner runs in advise mode only, and a phase switch happens
only when asked (POST /v1/nodes/{id}/phase), only on engines that can switch in place
(SGLang or pdlab's torch engine with --enable-pd-role-switch), 409 with the reason
otherwise. Engines come from a fleet file (`cluster/live/fleet_file.py`) and/or
`--engine URL[,key=value...]` (keys: role, kind, kv_events, kv_replay, vllm_steps,
forward_metrics, metrics_url, block_size, kv_capacity_tokens, node_id).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from cluster.core import ConfigError
from toolkit.cli.serve import TOKEN_ENV

if TYPE_CHECKING:
    from cluster.live.attached import AttachedFleet

console = Console(stderr=True)


def create_attach_app(fleet: AttachedFleet, token: str) -> Any:
    """The REST API of `pdlab serve` over an attached fleet (no data plane: the fleet has its
    own router). The app starts the fleet's watch on startup and stops it on shutdown."""
    from cluster.server import ControlService, ServiceConfig, create_app

    service = ControlService(fleet, ServiceConfig(flush_every_s=fleet.settings.flush_every_s))
    return create_app(service, token)


def attach_command(
    fleet_file: Path | None = typer.Argument(
        None, help="Fleet file (TOML or JSON: a fleet table of settings, an engines list)"
    ),
    engine: list[str] = typer.Option(
        [],
        "--engine",
        help="An engine: URL[,role=prefill,kind=vllm,kv_events=tcp://...] "
        "(repeat; added to the fleet file's)",
    ),
    router_url: str | None = typer.Option(
        None, "--router", help="The fleet's own router/proxy URL (its /health is watched)"
    ),
    db: Path | None = typer.Option(None, "--db", help="DuckDB file the watch writes"),
    run_id: str | None = typer.Option(None, "--run-id", help="Id of the run (default: generated)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the REST API binds"),
    port: int = typer.Option(8600, "--port", help="Port of the REST API"),
    token: str | None = typer.Option(
        None, "--token", help=f"Bearer token for mutating calls (default: ${TOKEN_ENV})"
    ),
    profile: str | None = typer.Option(
        None, "--profile", help="Models until the fleet's fits replace them (default h200)"
    ),
) -> None:
    """Watch a running vLLM/SGLang fleet: collect, fit, recommend (shadow mode), serve the API."""
    from cluster.live.attached import AttachedFleet
    from cluster.live.fleet_file import (
        FleetConfig,
        FleetSettings,
        load_fleet_file,
        parse_engine_arg,
    )
    from toolkit.serve.loop import http_server, run_until_stopped
    from toolkit.serve.processes import log_to_stderr

    log_to_stderr()
    try:
        cfg = load_fleet_file(fleet_file) if fleet_file is not None else None
        extra = tuple(parse_engine_arg(a) for a in engine)
        engines = (cfg.engines if cfg else ()) + extra
        if not engines:
            raise ConfigError("give a fleet file or at least one --engine URL")
        settings = cfg.settings if cfg else FleetSettings()
        if router_url:
            settings = dataclasses.replace(settings, router_url=router_url)
        if profile:
            settings = dataclasses.replace(settings, profile=profile)
        fleet = AttachedFleet(
            FleetConfig(engines, settings, str(fleet_file or "")), db_path=db, run_id=run_id
        )
        fleet.prepare()
    except ConfigError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(18)
    app = create_attach_app(fleet, token)
    url = f"http://{host}:{port}"
    nodes = ", ".join(f"{e.node_id}:{e.kind}/{e.role} {e.url}" for e in fleet.config.engines)
    banner = (
        f"[bold]pdlab attach[/] {url}  shadow mode (recommends, never acts)  engines {nodes}  "
        f"db {db or '(none)'}\n  mutating control calls: Authorization: Bearer {token}"
    )
    server = http_server(app, host=host, port=port)
    run_until_stopped(server, url=url, token=token, banner=banner, name="pdlab attach")
    s = fleet.summary
    if s is not None:
        console.print(
            f"run {s['run_id']}: watched {s['nodes']} engines for {s['seconds']:.0f} s, "
            f"{s['requests_observed']} requests observed, {s['switches']} switches asked"
        )
