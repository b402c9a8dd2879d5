"""`pdlab serve --sglang CLUSTER_FILE`: the control server over live SGLang engines (SPEC §6).

The same REST API as the simulated cluster (`pdlab serve`), over the engines of a cluster
file (`cluster.live.cluster_file`), plus the data plane on the same port: /generate,
/v1/completions and /v1/chat/completions (point an OpenAI client's base_url at
http://HOST:PORT/v1), POST /v1/branches/{id}/finish and GET /health. Collectors write the
engines' KV events and forward-pass iterations to `--db` (fit them with `pdlab fit`).
Policies (router, planner, tokenizer, timeouts) come from the file's [cluster] table.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from cluster.core import ConfigError

if TYPE_CHECKING:
    from cluster.live.cluster import SGLangCluster

console = Console(stderr=True)


def create_sglang_app(cluster: SGLangCluster, token: str) -> Any:
    """The control server's REST API (SPEC §6) over `cluster`, plus its data plane.

    The composition root of `pdlab serve --sglang`: the SGLang cluster is the server's
    `ClusterEngines`; the app starts it on startup and stops it (closing the telemetry run)
    on shutdown. Data-plane routes need no token; control calls do.
    """
    from cluster.live.serving import add_data_plane
    from cluster.server import ControlService, ServiceConfig, create_app

    service = ControlService(cluster, ServiceConfig(flush_every_s=cluster.settings.flush_every_s))
    app = create_app(service, token)
    add_data_plane(app, cluster)
    return app


def serve_sglang(
    cluster_file: Path,
    *,
    host: str,
    port: int,
    token: str,
    db: Path | None,
    run_id: str | None,
) -> None:
    """Discover the engines, then serve until Ctrl-C / SIGTERM / SIGHUP (the run is closed)."""
    from cluster.live.cluster import SGLangCluster
    from toolkit.serve.loop import bind_port, http_server, run_until_stopped
    from toolkit.serve.processes import log_to_stderr

    log_to_stderr()
    try:
        listen = bind_port(host, port)
        cluster = SGLangCluster(cluster_file, db_path=db, run_id=run_id)
        cluster.prepare()
    except ConfigError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    app = create_sglang_app(cluster, token)
    url = f"http://{host}:{port}"
    roles = ", ".join(f"{e.node_id}:{e.role} {e.http_url}" for e in cluster.config.engines)
    banner = (
        f"[bold]pdlab serve --sglang[/] {url}  engines {roles}  db {db or '(none)'}\n"
        f"  data plane: {url}/generate, {url}/v1/chat/completions (OpenAI base_url {url}/v1)\n"
        f"  mutating control calls: Authorization: Bearer {token}"
    )
    server = http_server(app, host=host, port=port)
    run_until_stopped(server, url=url, token=token, banner=banner, listen=listen)
    s = cluster.summary
    if s is not None:
        console.print(
            f"run {s['run_id']}: {s['completed']} requests completed, {s['errors']} failed, "
            f"{s['retries']} retried, {s['switches']} switches, split {s['final_split']}"
        )
