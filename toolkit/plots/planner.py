"""Planner gains per candidate split per window (paper 000 §5.2, Eq. 6; Alg. E.3 outer loop).

Bars are the mean gain mean(g) = Θ(candidate) − Θ(current) per candidate prefill count and
window, with the gain test's threshold 2·std(g)/√m as error bars (from
`toolkit.queries.planner`): a bar whose lower whisker stays above zero qualified. Solid bars
qualified, hatched ones did not; the chosen candidate (the qualifying one with the largest
mean gain) has a black outline. Θ is in requests per second (μ = 1/T^req, Eq. 3–5).
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from toolkit.plots.common import NODE_COLORS, no_data, style
from toolkit.queries.planner import PlannerData, planner_data
from toolkit.queries.run import Source, open_run

TITLE = "Planner gain test per window (Eq. 6)"


def planner_gains(db: Source, run_id: str | None = None) -> go.Figure:
    """Mean gain per candidate prefill count per window, with ±2σ/√m bars."""
    with open_run(db, run_id) as run:
        data = planner_data(run)
    return draw_planner(data)


def draw_planner(data: PlannerData) -> go.Figure:
    """The figure of `planner_gains` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    rows = data.windows
    fig = go.Figure()
    windows = rows["t"].unique().sort().to_list()
    for i, cand in enumerate(rows["candidate_prefill"].unique().sort().to_list()):
        part = rows.filter(pl.col("candidate_prefill") == cand)
        bars = part["threshold"].to_list()
        qualified = part["qualified"].to_list()
        chosen = part["chosen"].to_list()
        color = NODE_COLORS[i % len(NODE_COLORS)]
        fig.add_trace(
            go.Bar(
                x=[f"{t:g}" for t in part["t"].to_list()],
                y=part["mean_gain"].to_list(),
                error_y={
                    "type": "data",
                    "array": bars,
                    "thickness": 1.5,
                    "width": 4,
                    "color": "#333",
                },
                name=f"{cand} prefill nodes",
                legendgroup=f"cand{cand}",
                showlegend=False,
                marker={
                    "color": color,
                    "pattern": {
                        "shape": ["" if q else "/" for q in qualified],
                        "fillmode": "overlay",
                        "solidity": 0.4,
                    },
                    "line": {
                        "color": ["#000" if c else color for c in chosen],
                        "width": [3 if c else 1 for c in chosen],
                    },
                },
                customdata=list(
                    zip(
                        part["current_prefill"],
                        part["std_gain"],
                        part["slices"],
                        bars,
                        qualified,
                        chosen,
                        strict=True,
                    )
                ),
                hovertemplate=(
                    f"candidate {cand}P"
                    + " (current %{customdata[0]}P)<br>mean gain %{y:.4f} req/s"
                    "<br>std %{customdata[1]:.4f}, m=%{customdata[2]}"
                    "<br>2σ/√m = %{customdata[3]:.4f}"
                    "<br>qualified %{customdata[4]}, chosen %{customdata[5]}<extra>t=%{x} s</extra>"
                ),
            )
        )
        # Legend entry in the plain color (a bar's legend swatch copies its first bar's style).
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"symbol": "square", "size": 12, "color": color},
                name=f"candidate {cand} prefill nodes",
                legendgroup=f"cand{cand}",
            )
        )
    fig.add_hline(y=0, line={"color": "#666", "width": 1})
    fig.update_layout(barmode="group", bargap=0.25, bargroupgap=0.05)
    fig.update_xaxes(
        title_text="planning window end (s since run start)",
        type="category",
        categoryorder="array",
        categoryarray=[f"{t:g}" for t in windows],
    )
    fig.update_yaxes(title_text="mean throughput gain Θ(cand) − Θ(current) (req/s)")
    num_switch = int(rows.filter(pl.col("chosen"))["t"].n_unique())
    note = (
        f"{len(windows)} windows, {num_switch} with a chosen switch · bars ±2σ/√m · "
        "solid: qualified, hatched: not, black outline: chosen"
    )
    return style(fig, TITLE, data.run_id, note, height=440)
