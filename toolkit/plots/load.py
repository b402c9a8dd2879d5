"""Per-node queueing and load balance (SPEC §5 metrics; paper 000 §5.3 router, §6).

Over the measured period (after the warmup unless `include_warmup`):
- busy share: Σ iteration durations of each phase on the node / length of the period — how
  evenly the router and decode binder spread work, and how busy each phase is;
- prefill queue wait t_prefill_start − t_arrival of the requests each node prefilled, as box
  statistics computed in DuckDB (box: quartiles, whiskers: P5–P95, ◆ mean);
- mean queue wait per node over time (time-binned by arrival), which shows queues building
  on some nodes, e.g. around phase switches (dotted lines);
- the time-averaged running batch of each node's decode iterations, Σ B·T / Σ T.
The subtitle gives the imbalance max/mean of the nodes' mean queue waits (as in the run
summary's prefill_queue_imbalance) and of their decode batches.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import (
    PHASE_COLORS,
    Source,
    no_data,
    node_color,
    open_run,
    style,
    switch_lines,
    time_bin_width,
)

TITLE = "Per-node queueing and load balance"


def _imbalance(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    if not vals or sum(vals) <= 0:
        return None
    return max(vals) / (sum(vals) / len(vals))


def node_load(
    db: Source, run_id: str | None = None, *, bins: int = 40, include_warmup: bool = False
) -> go.Figure:
    """Busy share, queue-wait distribution and trend per node, and decode batch per node."""
    with open_run(db, run_id) as run:
        t0 = 0.0 if include_warmup else run.warmup_s()
        t_end = run.t_end()
        span = max(t_end - t0, 1e-9)
        busy = run.df(
            """
            SELECT node_id, 'prefill' AS phase, sum(duration_s) AS busy_s FROM prefill_iterations
            WHERE run_id = ? AND t_start >= ? GROUP BY ALL
            UNION ALL
            SELECT node_id, 'decode', sum(duration_s) FROM decode_iterations
            WHERE run_id = ? AND t_start >= ? GROUP BY ALL
            ORDER BY node_id, phase
            """,
            [run.run_id, t0, run.run_id, t0],
        )
        waits = run.df(
            """
            WITH w AS (
                SELECT prefill_node AS node_id, t_arrival, t_prefill_start - t_arrival AS wait_s
                FROM requests WHERE run_id = ? AND t_arrival >= ? AND t_prefill_start IS NOT NULL
                  AND prefill_node IS NOT NULL
            )
            SELECT node_id, count(*) AS n, avg(wait_s) AS mean_s,
                   quantile_cont(wait_s, [0.05, 0.25, 0.5, 0.75, 0.95]) AS q
            FROM w GROUP BY node_id ORDER BY node_id
            """,
            [run.run_id, t0],
        )
        width = time_bin_width(span, bins)
        trend = run.df(
            """
            SELECT prefill_node AS node_id, floor((t_arrival - ?) / ?) * ? + ? AS t_bin,
                   avg(t_prefill_start - t_arrival) AS mean_s, count(*) AS n
            FROM requests WHERE run_id = ? AND t_arrival >= ? AND t_prefill_start IS NOT NULL
              AND prefill_node IS NOT NULL
            GROUP BY ALL ORDER BY node_id, t_bin
            """,
            [t0, width, width, t0, run.run_id, t0],
        )
        batch = run.df(
            """
            SELECT node_id, sum(batch_size * duration_s) / sum(duration_s) AS mean_batch,
                   count(*) AS iterations
            FROM decode_iterations WHERE run_id = ? AND t_start >= ? GROUP BY 1 ORDER BY 1
            """,
            [run.run_id, t0],
        )
        lines = [t for t in switch_lines(run) if t >= t0]
    if busy.is_empty() and waits.is_empty():
        return no_data(
            TITLE, run, f"no iterations or prefilled requests logged in run {run.run_id}"
        )
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
    wait_imb = _imbalance(waits["mean_s"].to_list()) if waits.height else None
    batch_imb = _imbalance(batch["mean_batch"].to_list()) if batch.height else None
    scope = "whole run" if include_warmup else f"after the {t0:g} s warmup"
    note = f"{scope}; imbalance max/mean: queue wait " + (f"{wait_imb:.2f}" if wait_imb else "n/a")
    note += ", decode batch " + (f"{batch_imb:.2f}" if batch_imb else "n/a")
    fig = style(fig, TITLE, run, note, height=720)
    fig.layout.meta["imbalance"] = {"prefill_queue_wait": wait_imb, "decode_batch": batch_imb}
    return fig
