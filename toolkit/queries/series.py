"""Running and waiting requests over time: as the engines recorded them and from request times.

Recorded: what the engines counted at their scheduler steps, where a run kept it:
- `reference_series` (source 'real', an imported LLMServingSim bench run's `timeseries.csv`:
  running_reqs, waiting_reqs, kv_cache_pct per tick, summed over DP engines);
- `engine_metrics` (`pdlab attach` scraping Prometheus /metrics): vLLM's
  `vllm:num_requests_running` / `_waiting` / `vllm:kv_cache_usage_perc`, SGLang's
  `sglang:num_running_reqs` / `num_queue_reqs` / `token_usage`; per node the last sample in
  each time bin, summed over nodes (KV use: their mean, as a percent).

From request times, at the end of each time bin of `width_s`: waiting = arrived and not yet
scheduled (t_arrival ≤ t < t_prefill_start), running = scheduled and not done
(t_prefill_start ≤ t < t_done); runs without schedule times get in_flight = arrived and
not done. The `requests` table holds finished requests, so requests still in flight at the
run's end are not counted. Event counts are binned in DuckDB (one GROUP BY per kind of event)
and summed cumulatively here.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run, switch_lines, time_bin_width

RECORDED_METRICS = {  # what the figure calls it <- the names runs store it under
    "running": ("running_reqs", "vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("waiting_reqs", "vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_cache_pct": ("kv_cache_pct", "vllm:kv_cache_usage_perc", "sglang:token_usage"),
}
_FRACTION_METRICS = ("vllm:kv_cache_usage_perc", "sglang:token_usage")  # 0..1, shown as %


class QueueSeries(NamedTuple):
    run_id: str
    recorded: pl.DataFrame  # t, metric ('running' | 'waiting' | 'kv_cache_pct'), value
    recorded_from: str | None  # where the recorded series came from (None: none recorded)
    derived: pl.DataFrame  # t, and running, waiting or in_flight (requests at t)
    width_s: float  # bin width of the derived series (and of engine_metrics)
    switch_times: list[float]
    missing: str | None


def _reference(run: Run) -> pl.DataFrame:
    names = {n: m for m, ns in RECORDED_METRICS.items() for n in ns[:1]}
    return run.df(
        "SELECT t, metric, value FROM reference_series WHERE run_id = ? AND source = 'real' "
        "AND scope = 'cluster' AND metric IN (SELECT unnest(?::VARCHAR[])) ORDER BY t",
        [run.run_id, list(names)],
    ).with_columns(pl.col("metric").replace_strict(names))


def _engine_metrics(run: Run, width: float) -> pl.DataFrame:
    names = {n: m for m, ns in RECORDED_METRICS.items() for n in ns[1:]}
    per_node = run.df(
        """
        WITH s AS (
            SELECT ceil(t / ?) * ? AS t, node_id, metric, coalesce(labels, '') AS labels,
                   arg_max(value, t) AS value
            FROM engine_metrics WHERE run_id = ? AND metric IN (SELECT unnest(?::VARCHAR[]))
            GROUP BY ALL
        )
        SELECT t, node_id, metric, sum(value) AS value FROM s GROUP BY ALL
        """,
        [width, width, run.run_id, list(names)],
    )
    if per_node.is_empty():
        return pl.DataFrame(schema={"t": pl.Float64, "metric": pl.Utf8, "value": pl.Float64})
    fraction = pl.col("metric").is_in(list(_FRACTION_METRICS))
    return (
        per_node.group_by("t", "metric")
        .agg(total=pl.col("value").sum(), mean=pl.col("value").mean())
        .select(
            "t",
            pl.col("metric").replace_strict(names),
            value=pl.when(fraction).then(100 * pl.col("mean")).otherwise(pl.col("total")),
        )
        .sort("t", "metric")
    )


def _derived(run: Run, width: float) -> pl.DataFrame:
    """Requests waiting and running (or in flight) at the end of each bin (module doc)."""
    scheduled = run.scalar(
        "SELECT count(t_prefill_start) FROM requests WHERE run_id = ?", [run.run_id]
    )
    kinds = {"arrived": "t_arrival", "done": "t_done"}
    if scheduled:
        kinds["scheduled"] = "t_prefill_start"
    # An event at time e counts from the first bin end k·w >= e on: bin ceil(e / w).
    parts = " UNION ALL ".join(
        f"SELECT '{k}' AS kind, ceil({c} / ?)::BIGINT AS k, count(*) AS n FROM requests "
        f"WHERE run_id = ? AND t_done IS NOT NULL AND {c} IS NOT NULL GROUP BY 2"
        for k, c in kinds.items()
    )
    params = [p for _ in kinds for p in (width, run.run_id)]
    events = run.df(parts, params)
    if events.is_empty():
        return pl.DataFrame()
    ks = events["k"].to_list()
    grid = pl.DataFrame({"k": range(min(ks), max(ks) + 1)})
    for kind in kinds:
        got = events.filter(pl.col("kind") == kind).select("k", pl.col("n").alias(kind))
        grid = grid.join(got, on="k", how="left")
    cum = grid.fill_null(0).with_columns(pl.col(k).cum_sum() for k in kinds)
    out = cum.select((pl.col("k") * width).alias("t"))
    if scheduled:
        return out.with_columns(
            waiting=(cum["arrived"] - cum["scheduled"]),
            running=(cum["scheduled"] - cum["done"]),
        )
    return out.with_columns(in_flight=(cum["arrived"] - cum["done"]))


def queue_series(run: Run, *, bins: int = 600) -> QueueSeries:
    """Recorded running/waiting/KV series of the run, and the series from its request times."""
    width = time_bin_width(run.t_end(), bins)
    recorded = _reference(run)
    source = "the engine's stat logger (bench timeseries.csv)" if recorded.height else None
    if not recorded.height:
        recorded = _engine_metrics(run, width)
        source = "the engines' Prometheus /metrics (pdlab attach)" if recorded.height else None
    derived = _derived(run, width)
    missing = None
    if recorded.is_empty() and derived.is_empty():
        missing = f"no finished requests or recorded engine series in run {run.run_id}"
    return QueueSeries(run.run_id, recorded, source, derived, width, switch_lines(run), missing)
