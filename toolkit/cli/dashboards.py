"""`pdlab dashboards`: the Grafana dashboard over `pdlab serve`'s Prometheus metrics.

`pdlab dashboards grafana --out DIR` writes Grafana provisioning files (a Prometheus
datasource, a file provider) with the dashboard, and a Prometheus config that scrapes the
pdlab servers given; `pdlab dashboards check` runs every panel's query against a Prometheus
and says which return no data. The dashboard and its queries: toolkit/grafana.py; the
metrics: docs/metrics.md; the walk-through: docs/dashboards.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

dashboards_app = typer.Typer(
    help="Grafana dashboards over pdlab serve's /metrics (Prometheus).", no_args_is_help=True
)
console = Console(stderr=True)


@dashboards_app.command("grafana")
def grafana_command(
    out: Path = typer.Option(..., "--out", help="Directory to write the files into"),
    prometheus_url: str = typer.Option(
        "http://127.0.0.1:9090", "--prometheus-url", help="The Prometheus Grafana queries"
    ),
    pdlab_url: list[str] = typer.Option(
        ["http://127.0.0.1:8600"],
        "--pdlab-url",
        help="A pdlab serve to scrape, http://HOST:PORT (repeatable)",
    ),
    scrape_interval: float = typer.Option(
        5.0, "--scrape-interval", help="Seconds between scrapes (Prometheus config)"
    ),
) -> None:
    """Write Grafana provisioning (datasource + dashboard) and a Prometheus scrape config."""
    from cluster.core import ConfigError
    from toolkit.grafana import provision

    if out.exists() and not out.is_dir():
        console.print(f"[red]error:[/] --out {escape(str(out))} exists and is not a directory")
        raise typer.Exit(2)
    if not 0.1 <= scrape_interval <= 3600:
        console.print(
            f"[red]error:[/] --scrape-interval must be in [0.1, 3600] s, got {scrape_interval}"
        )
        raise typer.Exit(2)
    if not prometheus_url.startswith(("http://", "https://")):
        console.print(
            f"[red]error:[/] --prometheus-url must be http(s)://..., got {prometheus_url!r}"
        )
        raise typer.Exit(2)
    try:
        files = provision(out, prometheus_url, pdlab_url, scrape_interval)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    for f in files:
        typer.echo(str(f))
    console.print(
        f"Prometheus: prometheus --config.file={escape(str(out / 'prometheus.yml'))}\n"
        f"Grafana:    GF_PATHS_PROVISIONING={escape(str((out / 'provisioning').resolve()))} "
        "grafana-server (or copy the provisioning/ folders into Grafana's)"
    )


@dashboards_app.command("check")
def check_command(
    prometheus_url: str = typer.Option(
        "http://127.0.0.1:9090", "--prometheus-url", help="The Prometheus to query"
    ),
    rate_interval: str = typer.Option(
        "1m", "--rate-interval", help="What $__rate_interval stands for (>= 4 scrape intervals)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON"),
) -> None:
    """Run every panel's query against a Prometheus; exit 1 if one returns no number."""
    from toolkit.grafana import check_queries, dashboard

    checks = check_queries(prometheus_url, dashboard(), rate_interval)
    failed = [c for c in checks if not c.has_data]
    if as_json:
        typer.echo(json.dumps([c._asdict() for c in checks], indent=2))
    else:
        table = Table("panel", "series (with a number)", "query")
        for c in checks:
            shown = c.error or f"{c.series} ({c.finite})"
            mark = f"[red]{escape(shown)}[/]" if c in failed else shown
            table.add_row(escape(c.panel), mark, escape(c.expr))
        Console().print(table)
    if failed:
        console.print(f"[red]{len(failed)} of {len(checks)} queries returned no data[/]")
        raise typer.Exit(1)
