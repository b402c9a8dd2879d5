"""Lost KV reuse over time and per prefill node (SPEC §5 metrics; paper 000 §3.3, §6).

From `toolkit.queries.reuse`: the achieved hit rate h = Σt_c/Σt_in and the ideal one h* =
Σt_ideal_c/Σt_in per time bin of prefill start (top left), the lost KV reuse 1 − h/h* per
bin (bottom left), and h and h* per prefill node with each node's lost reuse (right). The
hit-rate axes hug the data, with as many decimals in their tick labels as the data's spread
needs: a run that loses 0.1% of its reuse shows that 0.1%. Without t_ideal_c in the log
(another engine) the figure shows h and says why h* and lost reuse are missing.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, panel_message, percent_axis, style
from toolkit.queries.reuse import ReuseData, reuse_data
from toolkit.queries.run import Source, open_run

TITLE = "Lost KV reuse"
COLORS = {"h": "#1f77b4", "h_star": "#7f7f7f", "lost": "#d62728"}
NO_IDEAL = "t_ideal_c not logged:<br>h* and lost KV reuse unknown"


def lost_kv_reuse(
    db: Source, run_id: str | None = None, *, bins: int = 40, include_warmup: bool = False
) -> go.Figure:
    """h and h* over time, lost KV reuse 1 − h/h* over time, and both per prefill node."""
    with open_run(db, run_id) as run:
        data = reuse_data(run, bins=bins, include_warmup=include_warmup)
    return draw_reuse(data)


def draw_reuse(data: ReuseData) -> go.Figure:
    """The figure of `lost_kv_reuse` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    totals, per_t, per_node, width = data.totals, data.per_t, data.per_node, data.width_s
    has_ideal = totals["with_ideal"] > 0
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
    else:
        panel_message(fig, 2, 1, NO_IDEAL)
    labels = [f"node {n}" if n is not None else "unknown" for n in per_node["node_id"].to_list()]
    # Dots, not bars: the axis is zoomed to the data, where bars would exaggerate.
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=per_node["h"].to_list(),
            mode="markers",
            name="h per node",
            marker={"color": COLORS["h"], "size": 11},
            showlegend=False,
            hovertemplate="%{x}: h %{y:.2%}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    if has_ideal:
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=per_node["h_star"].to_list(),
                mode="markers+text",
                name="h* per node",
                marker={"color": COLORS["h_star"], "size": 20, "symbol": "line-ew-open"},
                marker_line={"width": 3, "color": COLORS["h_star"]},
                showlegend=False,
                text=[lost_label(v) for v in per_node["lost"].to_list()],
                textposition="top center",
                textfont={"size": 10},
                hovertemplate="%{x}: h* %{y:.2%}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    rates = [*per_t["h"].to_list(), *(per_t["h_star"].to_list() if has_ideal else [])]
    node_rates = [*per_node["h"].to_list(), *(per_node["h_star"].to_list() if has_ideal else [])]
    lost = per_t["lost"].to_list() if has_ideal else []
    fig.update_yaxes(
        title_text="hit rate (cached / input tokens)", **percent_axis(rates), row=1, col=1
    )
    fig.update_yaxes(title_text="lost KV reuse", **percent_axis(lost, zero=True), row=2, col=1)
    fig.update_yaxes(title_text="hit rate", **percent_axis(node_rates, headroom=0.15), row=1, col=2)
    fig.update_xaxes(title_text="prefill start time (s since run start)", row=2, col=1)
    fig.update_xaxes(matches="x3", row=1, col=1)
    fig.update_xaxes(title_text="prefill node", row=1, col=2)
    fig = style(fig, TITLE, data.run_id, _note(totals, data.t0, data.include_warmup), height=560)
    fig.layout.meta["totals"] = {
        k: totals[k] for k in ("requests", "t_in", "t_c", "t_ideal_c", "h", "h_star", "lost")
    }
    return fig


def lost_label(lost: float | None) -> str:
    """'lost 3.2%', with two decimals below 1% (a 0.04% loss is not 'lost 0.0%')."""
    if lost is None:
        return ""
    return f"lost {lost:.1%}" if abs(lost) >= 0.01 else f"lost {lost:.2%}"


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
