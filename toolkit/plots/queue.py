"""Running and waiting requests over time (SPEC §5 metrics): what the engines recorded, and
what the request timestamps say (`toolkit.queries.series`).

Top panel: requests running and waiting, recorded by the engines (solid) and rebuilt from
the requests' times (dotted; the two agree when the clocks do). Bottom panel, when the
engines recorded it: the share of GPU KV cache blocks in use (%).
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, style
from toolkit.queries.run import Source, open_run, time_bin_width
from toolkit.queries.series import QueueSeries, queue_series

TITLE = "Running and waiting requests over time"
COLORS = {"running": "#1f77b4", "waiting": "#ff7f0e", "in_flight": "#7f7f7f"}
NAMES = {"running": "running", "waiting": "waiting", "in_flight": "in flight"}


def queue_over_time(db: Source, run_id: str | None = None, *, bins: int = 600) -> go.Figure:
    """Running and waiting requests (recorded and from request times) and KV cache use."""
    with open_run(db, run_id) as run:
        data = queue_series(run, bins=bins)
    return draw_queue(data)


def draw_queue(data: QueueSeries) -> go.Figure:
    """The figure of `queue_over_time` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    rec, der = data.recorded, data.derived
    kv = rec.filter(pl.col("metric") == "kv_cache_pct") if rec.height else rec
    rows = 2 if kv.height else 1
    fig = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.68, 0.32] if rows == 2 else [1.0],
        vertical_spacing=0.08,
    )
    for metric in ("running", "waiting"):
        part = rec.filter(pl.col("metric") == metric) if rec.height else rec
        if not part.height:
            continue
        fig.add_trace(
            go.Scatter(
                x=part["t"].to_list(),
                y=part["value"].to_list(),
                mode="lines",
                line={"color": COLORS[metric], "width": 2},
                name=f"{NAMES[metric]} (recorded)",
                hovertemplate="t=%{x:.1f} s: %{y:.0f} " + metric + "<extra>recorded</extra>",
            ),
            row=1,
            col=1,
        )
    alone = rec.is_empty()  # the only series: drawn solid
    for metric in ("running", "waiting", "in_flight"):
        if metric not in der.columns:
            continue
        fig.add_trace(
            go.Scatter(
                x=der["t"].to_list(),
                y=der[metric].to_list(),
                mode="lines",
                line={
                    "color": COLORS[metric],
                    "width": 2 if alone else 1.3,
                    "dash": None if alone else "dot",
                    "shape": "hv",
                },
                name=f"{NAMES[metric]} (from request times)",
                hovertemplate="t=%{x:.1f} s: %{y} "
                + NAMES[metric]
                + "<extra>from request times</extra>",
            ),
            row=1,
            col=1,
        )
    if kv.height:
        fig.add_trace(
            go.Scatter(
                x=kv["t"].to_list(),
                y=(kv["value"] / 100).to_list(),
                mode="lines",
                line={"color": "#2ca02c", "width": 1.8},
                name="KV cache in use (recorded)",
                hovertemplate="t=%{x:.1f} s: %{y:.1%} of GPU KV blocks<extra></extra>",
            ),
            row=2,
            col=1,
        )
        fig.update_yaxes(
            title_text="GPU KV in use", tickformat=".0%", range=[0, 1.05], row=2, col=1
        )
    for t in data.switch_times:
        fig.add_vline(x=t, line={"color": "#d62728", "width": 1, "dash": "dot"})
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="time since run start (s)", row=rows, col=1)
    parts = []
    if data.recorded_from:
        parts.append(f"solid: recorded by {data.recorded_from}")
    if der.height:
        how = "" if alone else "dotted: "
        parts.append(f"{how}from request times at {data.width_s:g} s steps")
    title = TITLE
    if "in_flight" in der.columns and not data.recorded_from:
        title = "Requests in flight over time"
        parts.append("no schedule times logged: running and waiting not told apart")
    fig = style(fig, title, data.run_id, "; ".join(parts), height=460 if rows == 2 else 380)
    fig.update_layout(showlegend=True, legend={"orientation": "h", "y": -0.18, "x": 0})
    return fig


TWIN_TITLE = "Running and waiting requests: the real run and its twin"


def twin_queue(
    db: Source,
    run_id: str,
    trace: pl.DataFrame | list[tuple[float, int, int, int]],
    *,
    kv_blocks: int | None = None,
    points: int = 2000,
) -> go.Figure:
    """The real run's running/waiting (recorded by its engine, else from its request times)
    under the twin's engine trace (t_s, running, waiting, kv_blocks after every iteration;
    `toolkit.twin.run.TwinResult.engines[i].trace`), kept to about `points` steps (each step's
    last state). With `kv_blocks` (the twin's KV capacity) its KV use joins the recorded one.
    """
    with open_run(db, run_id) as run:
        data = queue_series(run)
    if data.missing:
        return no_data(TWIN_TITLE, data.run_id, data.missing)
    twin = trace if isinstance(trace, pl.DataFrame) else pl.DataFrame(
        trace, schema=["t_s", "running", "waiting", "kv_blocks"], orient="row"
    )  # fmt: skip
    span = max(twin["t_s"].to_list(), default=0.0)
    if twin.height > points and span > 0:
        width = time_bin_width(span, points)
        twin = (
            twin.with_columns(k=(pl.col("t_s") / width).ceil())
            .group_by("k")
            .agg(pl.all().sort_by("t_s").last())
            .sort("t_s")
        )
    fig = draw_queue(
        data._replace(derived=data.derived if data.recorded.is_empty() else pl.DataFrame())
    )
    real = "recorded" if not data.recorded.is_empty() else "from request times"
    for trace_ in fig.data:
        trace_.name = f"real run: {trace_.name}"
        trace_.line.dash = None  # the real run solid, the twin dashed
    for metric in ("running", "waiting"):
        fig.add_trace(
            go.Scatter(
                x=twin["t_s"].to_list(),
                y=twin[metric].to_list(),
                mode="lines",
                line={"color": COLORS[metric], "width": 1.5, "dash": "dash", "shape": "hv"},
                name=f"twin: {metric}",
                hovertemplate="t=%{x:.1f} s: %{y} " + metric + "<extra>twin</extra>",
            ),
            row=1,
            col=1,
        )
    if kv_blocks and "yaxis2" in fig.layout:
        fig.add_trace(
            go.Scatter(
                x=twin["t_s"].to_list(),
                y=(twin["kv_blocks"] / kv_blocks).to_list(),
                mode="lines",
                line={"color": "#2ca02c", "width": 1.5, "dash": "dash"},
                name="twin: KV cache in use",
                hovertemplate="t=%{x:.1f} s: %{y:.1%} of GPU KV blocks<extra>twin</extra>",
            ),
            row=2,
            col=1,
        )
    note = f"solid: the real run ({real}); dashed: the twin's engine after every iteration"
    return style(fig, TWIN_TITLE, data.run_id, note, height=fig.layout.height or 460)
