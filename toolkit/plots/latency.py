"""TTFT, TPOT and end-to-end latency distributions (SPEC §5 metrics; paper 000 §6 evaluation).

Each panel (time to first token, time per output token after the first, end-to-end) is an
empirical CDF on a log time axis, read from the log-binned histograms of
`toolkit.queries.latency` (exact at every bin edge), with dotted lines at the mean, P50 and
P95; the subtitle says when the quantiles come from a hash sample. `by` draws one curve per
prefill or decode node instead of one for all requests.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, node_color, panel_message, style
from toolkit.queries.latency import (
    BINS_PER_DECADE,
    MIN_LATENCY_S,
    LatencyData,
    latency_data,
)
from toolkit.queries.run import Source, open_run

TITLE = "TTFT, TPOT and E2E latency distributions"
PANELS = {
    "ttft": "time to first token (TTFT)",
    "tpot": "time per output token (TPOT)",
    "e2e": "end-to-end latency (E2E)",
}


def latency_distributions(
    db: Source,
    run_id: str | None = None,
    *,
    by: str | None = None,
    include_warmup: bool = False,
) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and E2E (all requests, or one curve per node with `by`)."""
    with open_run(db, run_id) as run:
        data = latency_data(run, by=by, include_warmup=include_warmup)
    return draw_latency(data)


def draw_latency(data: LatencyData) -> go.Figure:
    """The figure of `latency_distributions` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    stats, hist, by, t0 = data.stats, data.hist, data.by, data.t0
    fig = make_subplots(
        rows=1, cols=len(PANELS), subplot_titles=list(PANELS.values()), horizontal_spacing=0.06
    )
    groups = stats["g"].to_list()
    in_legend: set[str] = set()
    for gi, g in enumerate(groups):
        srow = stats.filter(pl.col("g") == g).row(0, named=True)
        color = "#1f77b4" if by is None else node_color(_node_index(g, gi))
        label = "all requests" if by is None else f"{by.replace('_', ' ')} {g}"
        for col, metric in enumerate(PANELS, start=1):
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
                    showlegend=str(g) not in in_legend,
                    meta={"metric": metric, "group": g, "requests": int(n[-1])},
                    hovertemplate="≤ %{x:.3g} s: %{y:.1%}<extra>" + label + "</extra>",
                ),
                row=1,
                col=col,
            )
            in_legend.add(str(g))
            q = srow[f"{metric}_q"] or [None, None]
            marks = {"mean": srow[f"{metric}_mean"], "P50": q[0], "P95": q[1]}
            if len(groups) == 1:
                _mark_stats(fig, marks, col)
    for col, metric in enumerate(PANELS, start=1):
        what = "s per token" if metric == "tpot" else "s"
        fig.update_xaxes(title_text=f"{metric.upper()} ({what}, log scale)", type="log", col=col)
        fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1, col=col)
    fig.update_yaxes(title_text="share of requests ≤ x", row=1, col=1)
    if not int(stats["n_ttft"].sum()):
        panel_message(fig, 1, 1, "no request logged t_first_token: TTFT unknown")
    if not int(stats["n_tpot"].sum()):
        panel_message(fig, 1, 2, "no request with t_first_token and ≥ 2 output tokens")
    all_n = int(stats["n"].sum())
    note = f"{all_n:,} finished requests" + (
        "" if data.include_warmup else f" arriving after the {t0:g} s warmup"
    )
    if data.sample_rows is not None:
        note += f"; quantiles from a {data.sample_rows:,}-request hash sample"
    fig = style(fig, TITLE, data.run_id, note, height=440)
    fig.update_layout(legend={"orientation": "h", "y": -0.2, "x": 0})
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
        entry: dict[str, float | None] = {"requests": r["n"]}
        for m in PANELS:
            q = r[f"{m}_q"] or [None, None]
            entry |= {f"mean_{m}_s": r[f"{m}_mean"], f"p50_{m}_s": q[0], f"p95_{m}_s": q[1]}
        out[str(r["g"])] = entry
    return out
