"""docs/metrics.md, generated from the metric catalogue (`metric_catalog.CATALOG`).

    python -m cluster.server.metrics_doc > docs/metrics.md

A test keeps the file equal to this output, and another holds a live scrape to the
catalogue, so the reference lists exactly what `GET /metrics` serves.
"""

from __future__ import annotations

from cluster.server.metric_catalog import CATALOG, MetricSpec

_INTRO = """\
# Prometheus metrics reference (`GET /metrics`)

`pdlab serve` exposes these families in Prometheus' text format on `/metrics` (no token), for
every kind of cluster: the simulated one paced to wall-clock time, torch engines, SGLang
engines. Generated from `cluster/server/metric_catalog.py` by
`python -m cluster.server.metrics_doc > docs/metrics.md`; a test checks they agree and that
a live scrape serves exactly these families. Grafana: `pdlab dashboards grafana --out DIR`
(see [dashboards.md](dashboards.md)).

- Names follow Prometheus conventions (base units in the name, `_total` on counters) and
  take vLLM's where they mean the same (`vllm:time_to_first_token_seconds` here is
  `pdlab_time_to_first_token_seconds`, `vllm:num_requests_running` is
  `pdlab_num_requests_running`, `vllm:kv_cache_usage_perc` is `pdlab_kv_cache_usage_perc`,
  a fraction as in vLLM).
- `node` is the node id of the run (`GET /v1/cluster`); `phase` is `prefill` or `decode`;
  `tier` is `gpu` or `host`. A request's TTFT, queue time and prompt tokens count on the node
  that prefilled it, its TPOT and output tokens on the node that decoded it; E2E spans both
  and is cluster-wide.
- Histograms (`_bucket{le}`, `_sum`, `_count`) aggregate across nodes and servers:
  `histogram_quantile(0.95, sum by (le) (rate(pdlab_time_to_first_token_seconds_bucket[5m])))`
  is the cluster's p95 TTFT. Their buckets are vLLM V1's, refined below 10 ms.
- Counters and histograms from telemetry rows lag the cluster by at most one batch of rows
  (about 2 wall seconds on a simulated cluster). Each counter and histogram also has the
  `_created` series prometheus_client adds.
- Times are on the cluster's clock: simulated seconds on a simulated cluster (a paced
  simulation at `--speed 10` ages ten times faster than the wall clock), wall seconds on
  live engines.
"""


def _labels(m: MetricSpec) -> str:
    return ", ".join(f"`{label}`" for label in m.labels) or "-"


def _row(m: MetricSpec) -> str:
    meaning = m.help
    if m.kind == "histogram":
        meaning += f". Buckets (s): {', '.join(f'{b:g}' for b in m.buckets)}"
    if m.legacy:
        meaning += f". **Kept for existing queries; use {m.legacy}**"
    unit = m.unit or "-"
    return f"| `{m.name}` | {m.kind} | {_labels(m)} | {unit} | {meaning}. Source: {m.source} |"


def metrics_markdown() -> str:
    head = "| metric | type | labels | unit | meaning |\n|---|---|---|---|---|"
    current = [m for m in CATALOG if m.legacy is None]
    legacy = [m for m in CATALOG if m.legacy is not None]
    parts = [_INTRO]
    for title, specs in (
        ("Request latency (histograms)", [m for m in current if m.kind == "histogram"]),
        ("Counters", [m for m in current if m.kind == "counter"]),
        ("Gauges", [m for m in current if m.kind == "gauge"]),
        ("Kept names (served since the first release)", legacy),
    ):
        parts.append(f"\n## {title}\n\n{head}\n" + "\n".join(map(_row, specs)) + "\n")
    return "".join(parts)


if __name__ == "__main__":
    print(metrics_markdown(), end="")
