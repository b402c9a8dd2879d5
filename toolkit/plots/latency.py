"""TTFT and end-to-end latency distributions (SPEC §5 metrics; paper 000 §6 evaluation).

TTFT = t_first_token − t_arrival and E2E = t_done − t_arrival of the requests that arrived
after the warmup and finished, as in the run summary. Each panel is an empirical CDF on a
log time axis, built in DuckDB from a fine log-binned histogram (`BINS_PER_DECADE` bins per
decade; the CDF is exact at every bin edge), with dotted lines at the mean, P50 and P95.
Quantiles are exact up to `EXACT_QUANTILE_ROWS` requests and otherwise come from a
deterministic hash sample of that many requests (said in the subtitle). `by` draws one
curve per prefill or decode node instead of one for all requests.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import SAMPLE_MOD, Source, no_data, node_color, open_run, style

TITLE = "TTFT and E2E latency distributions"
BINS_PER_DECADE = 50
EXACT_QUANTILE_ROWS = 2_000_000
MIN_LATENCY_S = 1e-6  # latencies at or below this land in the first bin
METRICS = {"ttft": "t_first_token - t_arrival", "e2e": "t_done - t_arrival"}
GROUPS = {
    None: "'all'",
    "prefill_node": "prefill_node::VARCHAR",
    "decode_node": "decode_node::VARCHAR",
}


def latency_distributions(
    db: Source,
    run_id: str | None = None,
    *,
    by: str | None = None,
    include_warmup: bool = False,
) -> go.Figure:
    """Empirical CDFs of TTFT and E2E (all requests, or one curve per node with `by`)."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of None, 'prefill_node', 'decode_node'; got {by!r}")
    with open_run(db, run_id) as run:
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
            return no_data(TITLE, run, f"no finished requests{when} logged in run {run.run_id}")
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
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("time to first token (TTFT)", "end-to-end latency (E2E)"),
        horizontal_spacing=0.09,
    )
    groups = stats["g"].to_list()
    for gi, g in enumerate(groups):
        srow = stats.filter(pl.col("g") == g).row(0, named=True)
        color = "#1f77b4" if by is None else node_color(_node_index(g, gi))
        label = "all requests" if by is None else f"{by.replace('_', ' ')} {g}"
        for col, metric in enumerate(("ttft", "e2e"), start=1):
            part = hist.filter((pl.col("g") == g) & (pl.col("metric") == metric))
            if part.is_empty():
                continue
            n = part["n"].cum_sum()
            edges = [10 ** ((k + 1) / BINS_PER_DECADE) for k in part["k"].to_list()]
            first = 10 ** (part["k"][0] / BINS_PER_DECADE)
            x = [first, *edges]
            y = [0.0, *(n / n[-1]).to_list()]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line={"color": color, "width": 2, "shape": "linear"},
                    name=label,
                    legendgroup=str(g),
                    showlegend=col == 1,
                    meta={"metric": metric, "group": g, "requests": int(n[-1])},
                    hovertemplate="≤ %{x:.3g} s: %{y:.1%}<extra>" + label + "</extra>",
                ),
                row=1,
                col=col,
            )
            q = srow[f"{metric}_q"] or [None, None]
            marks = {"mean": srow[f"{metric}_mean"], "P50": q[0], "P95": q[1]}
            if len(groups) == 1:
                _mark_stats(fig, marks, col)
    for col in (1, 2):
        fig.update_xaxes(title_text="latency (s, log scale)", type="log", row=1, col=col)
    fig.update_yaxes(
        title_text="fraction of requests ≤ x", tickformat=".0%", range=[0, 1.02], row=1, col=1
    )
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1, col=2)
    all_n = int(stats["n"].sum())
    note = f"{all_n:,} finished requests" + (
        "" if include_warmup else f" arriving after the {t0:g} s warmup"
    )
    if keep:
        note += f"; quantiles from a {EXACT_QUANTILE_ROWS:,}-request hash sample"
    fig = style(fig, TITLE, run, note, height=440)
    fig.layout.meta["stats"] = _stats_meta(stats)
    return fig


def _mark_stats(fig: go.Figure, marks: dict[str, float | None], col: int) -> None:
    """Dotted lines at mean, P50, P95 with labels at heights that do not collide."""
    ys = {"mean": 0.3, "P50": 0.55, "P95": 0.8}
    for (name, value), dash in zip(marks.items(), ("dot", "dash", "dashdot"), strict=True):
        if value is None:
            continue
        x = max(float(value), MIN_LATENCY_S)
        fig.add_vline(x=x, line={"color": "#555", "width": 1, "dash": dash}, row=1, col=col)
        # Annotations on a log axis take log10(x) (shapes take x itself).
        fig.add_annotation(
            x=math.log10(x),
            y=ys[name],
            text=f"{name} {_fmt_s(float(value))}",
            showarrow=False,
            xanchor="left",
            xshift=3,
            font={"size": 10, "color": "#333"},
            bgcolor="rgba(255,255,255,0.7)",
            row=1,
            col=col,
        )


def _bin(col: str) -> str:
    return f"floor(log10(greatest({col}, {MIN_LATENCY_S})) * {BINS_PER_DECADE})::INTEGER"


def _fmt_s(v: float) -> str:
    return f"{1e3 * v:.0f} ms" if v < 1 else f"{v:.2f} s"


def _node_index(g: Any, fallback: int) -> int:
    try:
        return int(g)
    except (TypeError, ValueError):
        return fallback


def _stats_meta(stats: pl.DataFrame) -> dict[str, dict[str, float | None]]:
    out = {}
    for r in stats.iter_rows(named=True):
        tq, eq = r["ttft_q"] or [None, None], r["e2e_q"] or [None, None]
        out[str(r["g"])] = {
            "requests": r["n"],
            "mean_ttft_s": r["ttft_mean"],
            "p50_ttft_s": tq[0],
            "p95_ttft_s": tq[1],
            "mean_e2e_s": r["e2e_mean"],
            "p50_e2e_s": eq[0],
            "p95_e2e_s": eq[1],
        }
    return out
