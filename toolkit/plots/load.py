"""Per-node queueing and load balance (SPEC §5 metrics; paper 000 §5.3 router, §6).

Four panels over the measured period, from `toolkit.queries.load`: the busy share of each
node per phase (Σ iteration durations / length of the period); the prefill queue wait of the
requests each node prefilled (box: quartiles, whiskers: P5–P95, ◆ mean); the mean queue wait
per node over time (by arrival), which shows queues building on some nodes, e.g. around
phase switches (dotted lines); and the time-averaged running batch of each node's decode
iterations. The subtitle gives the imbalance max/mean of the nodes' mean queue waits and of
their decode batches. A panel whose columns a log lacks says so.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import PHASE_COLORS, no_data, node_color, panel_message, style
from toolkit.queries.load import LoadData, load_data
from toolkit.queries.run import Source, open_run

TITLE = "Per-node queueing and load balance"
NO_WAITS = "no request logged both t_prefill_start and prefill_node:<br>queue waits unknown"


def node_load(
    db: Source, run_id: str | None = None, *, bins: int = 40, include_warmup: bool = False
) -> go.Figure:
    """Busy share, queue-wait distribution and trend per node, and decode batch per node."""
    with open_run(db, run_id) as run:
        data = load_data(run, bins=bins, include_warmup=include_warmup)
    return draw_load(data)


def draw_load(data: LoadData) -> go.Figure:
    """The figure of `node_load` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    busy, waits, trend, batch = data.busy, data.waits, data.trend, data.batch
    span, width, lines, t0 = data.span_s, data.width_s, data.switch_times, data.t0
    fig = make_subplots(
        rows=2,
        cols=2,
        vertical_spacing=0.17,
        horizontal_spacing=0.09,
        subplot_titles=(
            "busy share of the period per node",
            "prefill queue wait per node",
            "mean prefill queue wait over time",
            "time-averaged running batch per node (decode iterations)",
        ),
    )
    for phase in ("prefill", "decode"):
        p = busy.filter(pl.col("phase") == phase)
        if p.is_empty():
            continue
        fig.add_trace(
            go.Bar(
                x=[f"node {n}" for n in p["node_id"].to_list()],
                y=(p["busy_s"] / span).to_list(),
                name=f"{phase} iterations",
                marker={"color": PHASE_COLORS[phase]},
                customdata=p["busy_s"].to_list(),
                hovertemplate="%{x}: %{y:.1%} busy (%{customdata:.0f} s) in "
                + phase
                + "<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if waits.height:
        q = waits["q"].to_list()
        fig.add_trace(
            go.Box(
                x=[f"node {n}" for n in waits["node_id"].to_list()],
                lowerfence=[v[0] for v in q],
                q1=[v[1] for v in q],
                median=[v[2] for v in q],
                q3=[v[3] for v in q],
                upperfence=[v[4] for v in q],
                mean=waits["mean_s"].to_list(),
                name="queue wait (P5–P95)",
                marker={"color": PHASE_COLORS["prefill"]},
                showlegend=False,
            ),
            row=1,
            col=2,
        )
    for node in trend["node_id"].unique().sort().to_list():
        p = trend.filter(pl.col("node_id") == node)
        fig.add_trace(
            go.Scatter(
                x=(p["t_bin"] + width / 2).to_list(),
                y=p["mean_s"].to_list(),
                mode="lines+markers",
                marker={"size": 4},
                line={"color": node_color(node), "width": 1.5},
                name=f"node {node}",
                customdata=p["n"].to_list(),
                hovertemplate="t=%{x:.0f} s: mean wait %{y:.3f} s"
                " over %{customdata} requests<extra>node " + str(node) + "</extra>",
            ),
            row=2,
            col=1,
        )
    for x in lines:
        fig.add_vline(x=x, line={"color": "#888", "width": 1, "dash": "dot"}, row=2, col=1)
    if batch.height:
        fig.add_trace(
            go.Bar(
                x=[f"node {n}" for n in batch["node_id"].to_list()],
                y=batch["mean_batch"].to_list(),
                marker={"color": PHASE_COLORS["decode"]},
                name="mean running batch",
                showlegend=False,
                customdata=batch["iterations"].to_list(),
                hovertemplate="%{x}: B̄ = %{y:.2f} over %{customdata} iterations<extra></extra>",
            ),
            row=2,
            col=2,
        )
    fig.update_layout(barmode="stack", legend={"tracegroupgap": 0, "traceorder": "normal"})
    fig.update_yaxes(title_text="share of time busy", tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="queue wait (s)", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="mean queue wait (s)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="arrival time (s since run start)", row=2, col=1)
    fig.update_yaxes(
        title_text="requests per iteration (time-weighted)", rangemode="tozero", row=2, col=2
    )
    scope = "whole run" if data.include_warmup else f"after the {t0:g} s warmup"
    if busy.is_empty():
        panel_message(fig, 1, 1, "no prefill or decode iterations logged in the period")
    if waits.is_empty():
        panel_message(fig, 1, 2, NO_WAITS)
        panel_message(fig, 2, 1, NO_WAITS)
    if batch.is_empty():
        panel_message(fig, 2, 2, "no decode iterations logged in the period")
    wait_imb, batch_imb = data.wait_imbalance, data.batch_imbalance
    note = f"{scope}; imbalance max/mean: queue wait " + (f"{wait_imb:.2f}" if wait_imb else "n/a")
    note += ", decode batch " + (f"{batch_imb:.2f}" if batch_imb else "n/a")
    fig = style(fig, TITLE, data.run_id, note, height=720)
    fig.layout.meta["imbalance"] = {"prefill_queue_wait": wait_imb, "decode_batch": batch_imb}
    return fig
