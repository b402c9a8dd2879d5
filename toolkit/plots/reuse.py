"""Lost KV reuse over time and per prefill node (SPEC §5 metrics; paper 000 §3.3, §6).

h = Σt_c / Σt_in is the KV hit rate the run achieved (cached prefix used at prefill over
input tokens), h* = Σt_ideal_c / Σt_in the ideal one (unlimited KV shared by all nodes, no
switches: the prefix some earlier request produced), and lost KV reuse = 1 − h/h*. Sums run
over the requests that started prefill and arrived after the warmup, as in the run summary;
the time panels bin them by prefill start, the node panel by prefill node. Σ(t_ideal_c − t_c)
is the number of input tokens prefilled again although their KV had existed.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import Run, Source, no_data, open_run, style, time_bin_width

TITLE = "Lost KV reuse"
COLORS = {"h": "#1f77b4", "h_star": "#7f7f7f", "lost": "#d62728"}


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


def lost_kv_reuse(
    db: Source, run_id: str | None = None, *, bins: int = 40, include_warmup: bool = False
) -> go.Figure:
    """h and h* over time, lost KV reuse 1 − h/h* over time, and both per prefill node."""
    with open_run(db, run_id) as run:
        totals = reuse_totals(run, include_warmup)
        if not totals["requests"]:
            return no_data(
                TITLE, run, f"no requests that started prefill logged in run {run.run_id}"
            )
        t0 = 0.0 if include_warmup else run.warmup_s()
        width = time_bin_width(run.t_end(), bins)
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
            f"SELECT prefill_node AS node_id, {sums} FROM requests WHERE {where} "
            "GROUP BY 1 ORDER BY 1",
            [run.run_id, t0],
        )
    has_ideal = totals["with_ideal"] > 0
    per_t = _with_rates(per_t)
    per_node = _with_rates(per_node)
    fig = make_subplots(
        rows=2,
        cols=2,
        column_widths=[0.68, 0.32],
        specs=[[{}, {"rowspan": 2}], [{}, None]],
        shared_xaxes=False,
        vertical_spacing=0.14,
        horizontal_spacing=0.1,
        subplot_titles=("KV hit rate over time", "per prefill node", "lost KV reuse over time"),
    )
    mid = (per_t["t"] + width / 2).to_list()
    fig.add_trace(_line(mid, per_t["h"], "achieved h = Σt_c/Σt_in", COLORS["h"]), row=1, col=1)
    if has_ideal:
        fig.add_trace(
            _line(
                mid, per_t["h_star"], "ideal h* = Σt_ideal_c/Σt_in", COLORS["h_star"], dash="dash"
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=mid,
                y=per_t["lost"].to_list(),
                width=width * 0.9,
                marker={"color": COLORS["lost"]},
                name="lost KV reuse 1 − h/h*",
                customdata=list(zip(per_t["lost_tokens"], per_t["n"], strict=True)),
                hovertemplate="t=%{x:.0f} s: lost %{y:.2%}<br>%{customdata[0]:,} tokens recomputed"
                "<br>%{customdata[1]} requests<extra></extra>",
            ),
            row=2,
            col=1,
        )
    labels = [f"node {n}" if n is not None else "unknown" for n in per_node["node_id"].to_list()]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=per_node["h"].to_list(),
            name="h per node",
            marker={"color": COLORS["h"]},
            showlegend=False,
            hovertemplate="%{x}: h %{y:.2%}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    if has_ideal:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=per_node["h_star"].to_list(),
                name="h* per node",
                marker={"color": COLORS["h_star"]},
                showlegend=False,
                text=[f"lost {v:.1%}" if v is not None else "" for v in per_node["lost"].to_list()],
                textposition="outside",
                textfont={"size": 10},
                hovertemplate="%{x}: h* %{y:.2%}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_layout(barmode="group", bargap=0.2)
    fig.update_yaxes(title_text="hit rate (cached / input tokens)", tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="lost KV reuse", tickformat=".1%", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="hit rate", tickformat=".0%", range=[0, 1.12], row=1, col=2)
    fig.update_xaxes(title_text="prefill start time (s since run start)", row=2, col=1)
    fig.update_xaxes(matches="x3", row=1, col=1)
    fig.update_xaxes(title_text="prefill node", row=1, col=2)
    note = _note(totals, t0, include_warmup)
    fig = style(fig, TITLE, run, note, height=560)
    fig.layout.meta["totals"] = {
        k: totals[k] for k in ("requests", "t_in", "t_c", "t_ideal_c", "h", "h_star", "lost")
    }
    return fig


def _with_rates(df: pl.DataFrame) -> pl.DataFrame:
    h = pl.col("t_c") / pl.col("t_in")
    hs = pl.col("t_ideal_c") / pl.col("t_in")
    return df.with_columns(
        h=pl.when(pl.col("t_in") > 0).then(h),
        h_star=pl.when(pl.col("t_in") > 0).then(hs),
        lost=pl.when((pl.col("t_in") > 0) & (pl.col("t_ideal_c") > 0)).then(1 - h / hs),
        lost_tokens=(pl.col("t_ideal_c") - pl.col("t_c")).clip(lower_bound=0).cast(pl.Int64),
    )


def _line(x: list[float], y: pl.Series, name: str, color: str, dash: str = "solid") -> go.Scatter:
    return go.Scatter(
        x=x,
        y=y.to_list(),
        mode="lines+markers",
        line={"color": color, "width": 2, "dash": dash},
        marker={"size": 4},
        name=name,
        hovertemplate="t=%{x:.0f} s: %{y:.2%}<extra>" + name.split(" ")[0] + "</extra>",
    )


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _note(totals: dict[str, Any], t0: float, include_warmup: bool) -> str:
    scope = "all requests" if include_warmup else f"requests arriving after the {t0:g} s warmup"
    if not totals["with_ideal"]:
        return (
            f"h = {_pct(totals['h'])} over {scope}; "
            "t_ideal_c not logged, so h* and lost reuse are unknown"
        )
    lost_tokens = max((totals["t_ideal_c"] or 0) - (totals["t_c"] or 0), 0)
    return (
        f"h = {_pct(totals['h'])}, h* = {_pct(totals['h_star'])}, "
        f"lost KV reuse = {_pct(totals['lost'])} "
        f"({lost_tokens:,.0f} tokens recomputed) over {totals['requests']:,} {scope}"
    )
