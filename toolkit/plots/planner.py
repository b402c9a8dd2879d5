"""Planner gains per candidate split per window (paper 000 §5.2, Eq. 6; Alg. E.3 outer loop).

Every planning window logs, per candidate prefill count, the mean and standard deviation of
the per-slice throughput gains g_i = Θ(candidate) − Θ(current) over m slices. A candidate
qualifies when mean(g) > 2·std(g)/√m, so the bars carry exactly that threshold as error
bars: a bar whose lower whisker stays above zero qualified. Solid bars qualified, hatched
ones did not; the chosen candidate (the qualifying one with the largest mean gain) has a
black outline. Θ is in requests per second (μ = 1/T^req, Eq. 3–5).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl

from toolkit.plots.common import NODE_COLORS, Source, no_data, open_run, style

TITLE = "Planner gain test per window (Eq. 6)"


def gain_threshold(std_gain: float, slices: int) -> float:
    """2·std/√m, the margin mean(g) must exceed (0 when there are no slices)."""
    return 2.0 * std_gain / math.sqrt(slices) if slices > 0 else 0.0


def planner_gains(db: Source, run_id: str | None = None) -> go.Figure:
    """Mean gain per candidate prefill count per window, with ±2σ/√m bars."""
    with open_run(db, run_id) as run:
        rows = run.df(
            "SELECT t, current_prefill, candidate_prefill, mean_gain, std_gain, slices, "
            "qualified, chosen "
            "FROM planner_windows WHERE run_id = ? ORDER BY t, candidate_prefill",
            [run.run_id],
        )
        if rows.is_empty():
            return no_data(
                TITLE,
                run,
                f"no planner windows logged in run {run.run_id} "
                "(static planner, or the run ended before the first window)",
            )
    fig = go.Figure()
    windows = rows["t"].unique().sort().to_list()
    for i, cand in enumerate(rows["candidate_prefill"].unique().sort().to_list()):
        part = rows.filter(pl.col("candidate_prefill") == cand)
        bars = [
            gain_threshold(float(s), int(m))
            for s, m in zip(part["std_gain"], part["slices"], strict=True)
        ]
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
    return style(fig, TITLE, run, note, height=440)
