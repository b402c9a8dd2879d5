"""TTFT, TPOT and end-to-end latency distributions of a run's requests (SPEC §5 metrics).

TTFT = t_first_token − t_arrival, TPOT = (t_done − t_first_token) / (t_out − 1) (requests
with at least two output tokens; vLLM's definition) and E2E = t_done − t_arrival of the
requests that arrived after the warmup and finished, as in the run summary. One scan builds
a fine log-binned histogram per group and metric (`BINS_PER_DECADE` bins per decade; a CDF
read from it is exact at every bin edge) with the sums for the means; quantiles are exact up
to `EXACT_QUANTILE_ROWS` requests and otherwise come from a deterministic hash sample of that
many requests. `by` groups per prefill or decode node instead of all requests together.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import SAMPLE_MOD, Run

BINS_PER_DECADE = 50
EXACT_QUANTILE_ROWS = 2_000_000
MIN_LATENCY_S = 1e-6  # latencies at or below this land in the first bin
METRICS = {
    "ttft": "t_first_token - t_arrival",
    "tpot": "CASE WHEN t_out > 1 THEN (t_done - t_first_token) / (t_out - 1) END",
    "e2e": "t_done - t_arrival",
}
GROUPS = {
    None: "'all'",
    "prefill_node": "prefill_node::VARCHAR",
    "decode_node": "decode_node::VARCHAR",
}


class LatencyData(NamedTuple):
    """Per group g: `stats` (n, and per metric m of ttft, tpot, e2e: n_m, m_mean, m_q =
    [P50, P95]) and `hist` (g, metric, bin k, count n; bin k covers [10^(k/B), 10^((k+1)/B))
    s). n_ttft < n when some requests logged no first token, n_tpot counts requests with
    at least two output tokens."""

    run_id: str
    by: str | None
    t0: float  # start of the measured period (the warmup's end, or 0)
    include_warmup: bool
    stats: pl.DataFrame
    hist: pl.DataFrame
    sample_rows: int | None  # quantiles from a hash sample of this many requests (else exact)
    missing: str | None


def _bin(col: str) -> str:
    # greatest() skips NULLs: an unlogged time must stay NULL, not land in the first bin.
    key = f"floor(log10(greatest({col}, {MIN_LATENCY_S})) * {BINS_PER_DECADE})::INTEGER"
    return f"CASE WHEN {col} IS NULL THEN NULL ELSE {key} END"


def latency_data(run: Run, *, by: str | None = None, include_warmup: bool = False) -> LatencyData:
    """Histograms, means and quantiles of TTFT, TPOT and E2E (all requests, or per node)."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of None, 'prefill_node', 'decode_node'; got {by!r}")
    t0 = 0.0 if include_warmup else run.warmup_s()
    base = f"""
        SELECT {GROUPS[by]} AS g, {METRICS["ttft"]} AS ttft, {METRICS["tpot"]} AS tpot,
               {METRICS["e2e"]} AS e2e, hash(t_arrival, t_done) AS h
        FROM requests
        WHERE run_id = ? AND t_arrival >= ? AND t_done IS NOT NULL
    """
    # One scan: per group, metric and bin, the count and sum (unnest makes a row per metric).
    cells = ", ".join(f"{{'m': '{m}', 'v': {m}}}" for m in METRICS)
    binned = run.df(
        f"""
        SELECT g, x.m AS metric, {_bin("x.v")} AS k, count(x.v) AS n, sum(x.v) AS total
        FROM (SELECT g, unnest([{cells}]) AS x FROM ({base}))
        WHERE x.v IS NOT NULL GROUP BY ALL
        """,
        [run.run_id, t0],
    )
    if binned.is_empty():
        when = "" if include_warmup else f" after the {t0:g} s warmup"
        missing = f"no finished requests{when} logged in run {run.run_id}"
        return LatencyData(run.run_id, by, t0, include_warmup, binned, binned, None, missing)
    per_metric = binned.group_by("g", "metric").agg(pl.col("n").sum(), pl.col("total").sum())
    # E2E is known for every finished request: its count is the group's request count.
    requests = per_metric.filter(pl.col("metric") == "e2e").select("g", "n")
    total = int(requests["n"].sum())
    keep = ""
    if total > EXACT_QUANTILE_ROWS:
        # The hash of the request's times picks the same sample on every call.
        keep = f"WHERE h % {SAMPLE_MOD} < {int(SAMPLE_MOD * EXACT_QUANTILE_ROWS / total)}"
    quantiles = run.df(
        f"""
        SELECT g, {", ".join(f"quantile_cont({m}, [0.5, 0.95]) AS {m}_q" for m in METRICS)}
        FROM ({base}) {keep} GROUP BY g
        """,
        [run.run_id, t0],
    )
    # Means and counts over all requests (not the sample), from the histograms' sums.
    stats = requests
    for m in METRICS:
        part = per_metric.filter(pl.col("metric") == m).select(
            "g", pl.col("n").alias(f"n_{m}"), (pl.col("total") / pl.col("n")).alias(f"{m}_mean")
        )
        stats = stats.join(part, on="g", how="left")
    stats = stats.join(quantiles, on="g", how="left").with_columns(
        pl.col(f"n_{m}").fill_null(0) for m in METRICS
    )
    stats = stats.sort("g")
    hist = binned.select("g", "metric", "k", "n").sort("g", "metric", "k")
    sample = EXACT_QUANTILE_ROWS if keep else None
    return LatencyData(run.run_id, by, t0, include_warmup, stats, hist, sample, None)
