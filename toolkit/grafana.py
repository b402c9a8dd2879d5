"""The Grafana dashboard over `pdlab serve`'s /metrics, its provisioning files, and its queries.

`dashboard()` builds the dashboard (Grafana's JSON model, schema 39) from `PANELS`, one short
spec per panel: latency quantiles from the Prometheus histograms (`histogram_quantile` over
`rate` of `_bucket`, so they aggregate across nodes), throughput, running and waiting
requests, KV use per tier, prefix hits and lost reuse, evictions, the PD split, phase
switches, the planner's gain test (paper 000 Eq. 6) and the branch table. The repository
keeps it as dashboards/pdlab-cluster.json (`python -m toolkit.grafana >
dashboards/pdlab-cluster.json`; a test keeps them equal). `provision()` writes what a Grafana
and a Prometheus need to show it (`pdlab dashboards grafana --out DIR`), and
`panel_queries()` gives every panel's query with the dashboard's variables filled in, to run
against a Prometheus (`pdlab dashboards check`, and the CI test against a real one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from cluster.core import ConfigError

DASHBOARD_UID = "pdlab-cluster"
DATASOURCE_UID = "pdlab-prometheus"
DS = {"type": "prometheus", "uid": "${datasource}"}
N = 'node=~"$node"'  # the node variable's filter
RATE = "[$__rate_interval]"


class Query(NamedTuple):
    expr: str
    legend: str


class Panel(NamedTuple):
    title: str
    unit: str  # Grafana's unit id: s, reqps, short, percentunit, ...
    queries: tuple[Query, ...]
    description: str
    stack: bool = False


def _quantiles(metric: str, by: str = "", where: str = N) -> tuple[Query, ...]:
    """p50, p95 and p99 of a histogram, summed over everything but `by` (and `le`)."""
    sel = f"{{{where}}}" if where else ""
    group = f"le, {by}" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel}{RATE})))",
            f"{legend}p{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _p95(metric: str, by: str) -> tuple[Query, ...]:
    return (
        Query(
            f"histogram_quantile(0.95, sum by (le, {by}) (rate({metric}_bucket{{{N}}}{RATE})))",
            f"{{{{{by.replace(', ', '}} {{')}}}}} p95",
        ),
    )


# Rows of the dashboard: (title, panels); two panels side by side per line.
PANELS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Latency", (
        Panel("TTFT", "s", _quantiles("pdlab_time_to_first_token_seconds"),
              "Time to first token of finished requests, on the nodes selected (prefill node)"),
        Panel("TTFT p95 per prefill node", "s",
              _p95("pdlab_time_to_first_token_seconds", "node"),
              "95th percentile TTFT by the node that prefilled the request"),
        Panel("TPOT", "s", _quantiles("pdlab_request_time_per_output_token_seconds"),
              "Mean time per output token after the first, per request (decode node)"),
        Panel("E2E latency", "s", _quantiles("pdlab_e2e_request_latency_seconds", where=""),
              "End-to-end latency of finished requests, cluster-wide"),
        Panel("Queue time p95 per prefill node", "s",
              _p95("pdlab_request_queue_time_seconds", "node"),
              "Arrival to the start of prefill"),
        Panel("Forward pass p95 per node and phase", "s",
              _p95("pdlab_iteration_duration_seconds", "node, phase"),
              "Duration of one forward pass (T_P of Eq. 1, T_D(B) of Eq. 2)"),
    )),
    ("Throughput and load", (
        Panel("Requests", "reqps", (
            Query(f"sum(rate(pdlab_request_success_total{RATE}))", "finished"),
            Query(f"sum(rate(pdlab_request_failure_total{RATE}))", "failed"),
        ), "Requests finished and failed per second"),
        Panel("Tokens", "short", (
            Query(f"sum(rate(pdlab_prompt_tokens_total{{{N}}}{RATE}))", "prompt"),
            Query(f"sum(rate(pdlab_generation_tokens_total{{{N}}}{RATE}))", "generated"),
            Query(f"sum(rate(pdlab_prefill_computed_tokens_total{{{N}}}{RATE}))",
                  "prefill computed"),
        ), "Tokens per second: prompts (cached included), outputs, prefill computation"),
        Panel("Running requests per node", "short", (
            Query(f"pdlab_num_requests_running{{{N}}}", "{{node}}"),
        ), "Requests in each node's running batch", stack=True),
        Panel("Waiting requests per node", "short", (
            Query(f"pdlab_num_requests_waiting{{{N}}}", "{{node}} prefill queue"),
            Query(f"pdlab_num_requests_waiting_kv{{{N}}}", "{{node}} waiting for KV"),
        ), "Requests queued for prefill, and waiting for their KV before decoding"),
    )),
    ("KV cache", (
        Panel("KV usage per node and tier", "percentunit", (
            Query(f"pdlab_kv_cache_usage_perc{{{N}}}", "{{node}} {{tier}}"),
        ), "KV held as a fraction of each tier's capacity (gpu, host)"),
        Panel("Prefix cache hit rate", "percentunit", (
            Query(f"sum(rate(pdlab_prefix_cache_hits_total{{{N}}}{RATE})) / "
                  f"sum(rate(pdlab_prompt_tokens_total{{{N}}}{RATE}))", "hit rate h"),
        ), "Prompt tokens found cached over prompt tokens"),
        Panel("Lost KV reuse", "short", (
            Query(f"sum(rate(pdlab_kv_lost_reuse_tokens_total{{{N}}}{RATE}))",
                  "tokens/s an ideal cache would have held"),
            Query(f"sum(rate(pdlab_kv_lost_blocks_total{{{N}}}{RATE}))",
                  "blocks/s lost at phase switches"),
        ), "Reuse an unlimited shared cache would have had (1 - h/h*), and KV lost at switches"),
        Panel("Evictions", "short", (
            Query(f"sum by (node, tier) (rate(pdlab_kv_evicted_blocks_total{{{N}}}{RATE}))",
                  "{{node}} {{tier}}"),
        ), "KV blocks evicted per second by node and tier", stack=True),
    )),
    ("PD control", (
        Panel("PD split", "short", (
            Query("pdlab_split_nodes", "{{phase}}"),
        ), "Nodes serving each phase", stack=True),
        Panel("Phase switches", "short", (
            Query(f"sum by (node, to_phase) (increase(pdlab_node_phase_switches_total{{{N}}}"
                  f"{RATE}))", "{{node}} to {{to_phase}}"),
        ), "Completed phase switches per interval, by node and new phase"),
        Panel("Planner gain (Eq. 6)", "reqps", (
            Query("pdlab_planner_gain_requests_per_second", "{{prefill_nodes}}P mean gain"),
            Query("2 * pdlab_planner_gain_std_requests_per_second", "{{prefill_nodes}}P 2 std"),
        ), "Mean throughput gain of each candidate split at the planner's last evaluation; "
           "a candidate qualifies when mean > 2 std / sqrt(m)"),
        Panel("Branches and KV directory", "short", (
            Query("pdlab_branches_active", "active branches"),
            Query("pdlab_directory_blocks", "directory blocks"),
            Query("pdlab_directory_counted_holdings", "counted holdings (R > 0)"),
        ), "Agent branches in the branch table and the blocks the KV directory tracks"),
    )),
)  # fmt: skip


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": True, "stacking": {"mode": "normal" if p.stack else "none"}}  # fmt: skip
    return {
        "id": pid,
        "type": "timeseries",
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": q.expr,
                "legendFormat": q.legend,
                "range": True,
            }
            for i, q in enumerate(p.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    """Grafana's JSON model of the pdlab cluster dashboard."""
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, row in PANELS:
        panels.append({"id": pid, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        pid, y = pid + 1, y + 1
        for i, p in enumerate(row):
            panels.append(_panel(p, pid, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    node_query = "label_values(pdlab_node_phase, node)"
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {"text": DATASOURCE_UID, "value": DATASOURCE_UID}, "hide": 0, "refresh": 1},
        {"name": "node", "label": "node", "type": "query", "datasource": DS,
         "query": {"query": node_query, "refId": "node"}, "definition": node_query,
         "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 3,
         "current": {"text": "All", "value": "$__all"}, "hide": 0},
    ]  # fmt: skip
    return {
        "uid": DASHBOARD_UID,
        "title": "pdlab cluster",
        "description": "A PD-disaggregated cluster under pdlab's control plane (pdlab serve "
        "/metrics; reference docs/metrics.md)",
        "tags": ["pdlab", "llm-serving", "prefill-decode"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_text() -> str:
    """The dashboard as the repository keeps it (dashboards/pdlab-cluster.json)."""
    return json.dumps(dashboard(), indent=2) + "\n"


def panel_queries(
    board: dict[str, Any], rate_interval: str = "1m", node: str = ".*"
) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of `board`'s panels, with the dashboard's
    variables filled in as Grafana would: `$__rate_interval`, and `$node` as a regex."""
    out = []
    for p in board["panels"]:
        for t in p.get("targets", ()):
            expr = t["expr"].replace("$__rate_interval", rate_interval).replace("$node", node)
            out.append((p["title"], expr))
    return out


def provision(
    out: Path, prometheus_url: str, pdlab_urls: list[str], scrape_s: float = 5.0
) -> list[Path]:
    """Write Grafana's provisioning (a Prometheus datasource at `prometheus_url`, a file
    provider of the dashboard) and a Prometheus config scraping `pdlab_urls` into `out`;
    returns the files written. Grafana: `--config` or `GF_PATHS_PROVISIONING=out/provisioning`;
    Prometheus: `prometheus --config.file=out/prometheus.yml`."""
    board_dir = (out / "dashboards").resolve()
    files = {
        board_dir / "pdlab-cluster.json": dashboard_text(),
        out / "provisioning" / "datasources" / "pdlab.yaml": (
            "apiVersion: 1\ndatasources:\n"
            f"  - name: pdlab Prometheus\n    uid: {DATASOURCE_UID}\n    type: prometheus\n"
            f"    access: proxy\n    url: {json.dumps(prometheus_url)}\n    isDefault: true\n"
            f"    jsonData:\n      timeInterval: {json.dumps(f'{scrape_s:g}s')}\n"
        ),
        out / "provisioning" / "dashboards" / "pdlab.yaml": (
            "apiVersion: 1\nproviders:\n  - name: pdlab\n    folder: pdlab\n    type: file\n"
            "    allowUiUpdates: true\n    options:\n"
            f"      path: {json.dumps(str(board_dir))}\n"
        ),
        out / "prometheus.yml": prometheus_config(pdlab_urls, scrape_s),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


def prometheus_config(pdlab_urls: list[str], scrape_s: float = 5.0) -> str:
    """A Prometheus config scraping `/metrics` of each `pdlab serve` URL (http://HOST:PORT)."""
    from urllib.parse import urlsplit

    targets = []
    for url in pdlab_urls:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ConfigError(f"--pdlab-url must be http://HOST:PORT (pdlab serve), got {url!r}")
        targets.append(json.dumps(parts.netloc))
    return (
        f"global:\n  scrape_interval: {scrape_s:g}s\n  evaluation_interval: {scrape_s:g}s\n"
        "scrape_configs:\n  - job_name: pdlab\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: [{', '.join(targets)}]\n"
    )


if __name__ == "__main__":
    print(dashboard_text(), end="")


class QueryCheck(NamedTuple):
    """One panel query run against a Prometheus: the series it returned, how many of them
    hold a number (a quantile of an idle histogram is NaN: Grafana draws nothing), or the
    error."""

    panel: str
    expr: str
    series: int
    finite: int
    error: str | None

    @property
    def has_data(self) -> bool:
        return self.error is None and self.finite > 0


def check_queries(
    prometheus_url: str, board: dict[str, Any], rate_interval: str = "1m", timeout_s: float = 10.0
) -> list[QueryCheck]:
    """Run every panel query of `board` as an instant query against `prometheus_url`
    (its HTTP API, /api/v1/query); a query without a number or with an error has no data."""
    import httpx

    out = []
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout_s) as http:
        for title, expr in panel_queries(board, rate_interval):
            try:
                r = http.get("/api/v1/query", params={"query": expr})
                body = r.json()
            except (httpx.HTTPError, ValueError) as exc:
                out.append(QueryCheck(title, expr, 0, 0, f"{type(exc).__name__}: {exc}"))
                continue
            if body.get("status") != "success":
                error = str(body.get("error") or r.text[:200])
                out.append(QueryCheck(title, expr, 0, 0, error))
                continue
            values = [float(s["value"][1]) for s in body["data"]["result"]]
            finite = sum(math.isfinite(v) for v in values)
            out.append(QueryCheck(title, expr, len(values), finite, None))
    return out
