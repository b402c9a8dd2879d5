"""KV hit rates and lost KV reuse of a run's requests (SPEC §5 metrics; paper 000 §3.3, §6).

h = Σt_c / Σt_in is the KV hit rate the run achieved (cached prefix used at prefill over
input tokens), h* = Σt_ideal_c / Σt_in the ideal one (unlimited KV shared by all nodes, no
switches: the prefix some earlier request produced), and lost KV reuse = 1 − h/h*. Sums run
over the requests that started prefill and arrived after the warmup, as in the run summary;
`reuse_data` also bins them by prefill start and groups them by prefill node.
Σ(t_ideal_c − t_c) is the number of input tokens prefilled again although their KV had
existed. Logs without t_ideal_c (other engines) give h only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import polars as pl

from toolkit.queries.run import Run, time_bin_width


class ReuseData(NamedTuple):
    run_id: str
    t0: float  # start of the measured period
    include_warmup: bool
    width_s: float  # time bin width
    totals: dict[str, Any]  # reuse_totals
    per_t: pl.DataFrame  # t (bin start), t_in, t_c, t_ideal_c, n, h, h_star, lost, lost_tokens
    per_node: pl.DataFrame  # node_id and the same sums and rates
    missing: str | None


def reuse_totals(run: Run, include_warmup: bool = False) -> dict[str, Any]:
    """h, h*, lost KV reuse and token sums over the run's measured requests."""
    t0 = 0.0 if include_warmup else run.warmup_s()
    row = run.df(
        """
        SELECT count(*) AS requests, sum(t_in)::DOUBLE AS t_in, sum(t_c)::DOUBLE AS t_c,
               sum(t_ideal_c)::DOUBLE AS t_ideal_c, count(t_ideal_c) AS with_ideal
        FROM requests WHERE run_id = ? AND t_prefill_start IS NOT NULL AND t_arrival >= ?
        """,
        [run.run_id, t0],
    ).row(0, named=True)
    return {
        **row,
        **_rates(row["t_in"], row["t_c"], row["t_ideal_c"] if row["with_ideal"] else None),
    }


def _rates(t_in: float | None, t_c: float | None, t_ideal: float | None) -> dict[str, float | None]:
    h = t_c / t_in if t_in and t_c is not None else None
    h_star = t_ideal / t_in if t_in and t_ideal is not None else None
    lost = 1.0 - h / h_star if h is not None and h_star else None
    return {"h": h, "h_star": h_star, "lost": lost}


def with_rates(df: pl.DataFrame) -> pl.DataFrame:
    """h, h*, lost reuse and recomputed tokens of each row of token sums."""
    h = pl.col("t_c") / pl.col("t_in")
    hs = pl.col("t_ideal_c") / pl.col("t_in")
    return df.with_columns(
        h=pl.when(pl.col("t_in") > 0).then(h),
        h_star=pl.when(pl.col("t_in") > 0).then(hs),
        lost=pl.when((pl.col("t_in") > 0) & (pl.col("t_ideal_c") > 0)).then(1 - h / hs),
        lost_tokens=(pl.col("t_ideal_c") - pl.col("t_c")).clip(lower_bound=0).cast(pl.Int64),
    )


def reuse_data(run: Run, *, bins: int = 40, include_warmup: bool = False) -> ReuseData:
    """Totals, per time bin of prefill start and per prefill node."""
    totals = reuse_totals(run, include_warmup)
    t0 = 0.0 if include_warmup else run.warmup_s()
    width = time_bin_width(run.t_end(), bins)
    if not totals["requests"]:
        empty = pl.DataFrame()
        missing = f"no requests that started prefill logged in run {run.run_id}"
        return ReuseData(run.run_id, t0, include_warmup, width, totals, empty, empty, missing)
    where = "run_id = ? AND t_prefill_start IS NOT NULL AND t_arrival >= ?"
    sums = (
        "sum(t_in)::DOUBLE AS t_in, sum(t_c)::DOUBLE AS t_c, "
        "sum(t_ideal_c)::DOUBLE AS t_ideal_c, count(*) AS n"
    )
    per_t = run.df(
        f"SELECT floor(t_prefill_start / ?) * ? AS t, {sums} FROM requests WHERE {where} "
        "GROUP BY 1 ORDER BY 1",
        [width, width, run.run_id, t0],
    )
    per_node = run.df(
        f"SELECT prefill_node AS node_id, {sums} FROM requests WHERE {where} GROUP BY 1 ORDER BY 1",
        [run.run_id, t0],
    )
    return ReuseData(
        run.run_id,
        t0,
        include_warmup,
        width,
        totals,
        with_rates(per_t),
        with_rates(per_node),
        None,
    )
