"""TTFT and end-to-end latency distributions of a run's requests (SPEC §5 metrics).

TTFT = t_first_token − t_arrival and E2E = t_done − t_arrival of the requests that arrived
after the warmup and finished, as in the run summary. One scan builds a fine log-binned
histogram per group (`BINS_PER_DECADE` bins per decade; a CDF read from it is exact at every
bin edge) with the sums for the means; quantiles are exact up to `EXACT_QUANTILE_ROWS`
requests and otherwise come from a deterministic hash sample of that many requests. `by`
groups per prefill or decode node instead of all requests together.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import SAMPLE_MOD, Run

BINS_PER_DECADE = 50
EXACT_QUANTILE_ROWS = 2_000_000
MIN_LATENCY_S = 1e-6  # latencies at or below this land in the first bin
METRICS = {"ttft": "t_first_token - t_arrival", "e2e": "t_done - t_arrival"}
GROUPS = {
    None: "'all'",
    "prefill_node": "prefill_node::VARCHAR",
    "decode_node": "decode_node::VARCHAR",
}


class LatencyData(NamedTuple):
    """Per group g: `stats` (n, ttft_mean, e2e_mean, ttft_q, e2e_q = [P50, P95]) and `hist`
    (g, metric 'ttft'|'e2e', bin k, count n; bin k covers [10^(k/B), 10^((k+1)/B)) s)."""

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
    """Histograms, means and quantiles of TTFT and E2E (all requests, or per node with `by`)."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of None, 'prefill_node', 'decode_node'; got {by!r}")
    t0 = 0.0 if include_warmup else run.warmup_s()
    base = f"""
        SELECT {GROUPS[by]} AS g, {METRICS["ttft"]} AS ttft, {METRICS["e2e"]} AS e2e,
               hash(t_arrival, t_done) AS h
        FROM requests
        WHERE run_id = ? AND t_arrival >= ? AND t_done IS NOT NULL
    """
    # One scan: counts per (group, TTFT bin, E2E bin); each histogram is a roll-up.
    joint = run.df(
        f"""
        SELECT g, {_bin("ttft")} AS k_ttft, {_bin("e2e")} AS k_e2e, count(*) AS n,
               count(ttft) AS n_ttft, sum(ttft) AS sum_ttft, sum(e2e) AS sum_e2e
        FROM ({base}) GROUP BY ALL
        """,
        [run.run_id, t0],
    )
    if joint.is_empty():
        when = "" if include_warmup else f" after the {t0:g} s warmup"
        missing = f"no finished requests{when} logged in run {run.run_id}"
        return LatencyData(run.run_id, by, t0, include_warmup, joint, joint, None, missing)
    total = int(joint["n"].sum())
    keep = ""
    if total > EXACT_QUANTILE_ROWS:
        # The hash of the request's times picks the same sample on every call.
        keep = f"WHERE h % {SAMPLE_MOD} < {int(SAMPLE_MOD * EXACT_QUANTILE_ROWS / total)}"
    quantiles = run.df(
        f"""
        SELECT g, quantile_cont(ttft, [0.5, 0.95]) AS ttft_q,
               quantile_cont(e2e, [0.5, 0.95]) AS e2e_q
        FROM ({base}) {keep} GROUP BY g
        """,
        [run.run_id, t0],
    )
    # Means and counts over all requests (not the sample), from the joint histogram's sums.
    stats = (
        joint.group_by("g")
        .agg(
            n=pl.col("n").sum(),
            n_ttft=pl.col("n_ttft").sum(),
            ttft_mean=pl.col("sum_ttft").sum() / pl.col("n_ttft").sum(),
            e2e_mean=pl.col("sum_e2e").sum() / pl.col("n").sum(),
        )
        .join(quantiles, on="g", how="left")
        .sort("g")
    )
    hist = pl.concat(
        [
            joint.filter(pl.col(f"k_{m}").is_not_null())
            .group_by("g", f"k_{m}")
            .agg(pl.col("n").sum())
            .rename({f"k_{m}": "k"})
            .with_columns(metric=pl.lit(m))
            for m in ("ttft", "e2e")
        ]
    ).sort("g", "metric", "k")
    sample = EXACT_QUANTILE_ROWS if keep else None
    return LatencyData(run.run_id, by, t0, include_warmup, stats, hist, sample, None)
