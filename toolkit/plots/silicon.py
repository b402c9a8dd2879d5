"""Predicted against measured on real deployments, per partition (`pdlab validate silicon`).

One panel per partition (system/backend/mode/family), log axes: each row's measured mean
TTFT and TPOT (x) against pdlab's twin (circles) and AIConfigurator's estimator (crosses),
with the diagonal where a perfect predictor puts every point. Data from
`toolkit.queries.silicon.silicon_points`.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, style
from toolkit.queries.run import Source, open_run
from toolkit.queries.silicon import SiliconPoints, silicon_points

TITLE = "Real deployments: predicted vs measured (AIConfigurator silicon sample)"
COLORS = {"ttft": "#1f77b4", "tpot": "#ff7f0e"}
TOOLS = {"pdlab": "circle-open", "aic": "x-thin"}
COLS = 4


def silicon_scatter(db: Source, run_id: str | None = None) -> go.Figure:
    """Per partition: predicted against measured TTFT and TPOT, log axes."""
    with open_run(db, run_id) as run:
        data = silicon_points(run)
    return draw_silicon_scatter(data)


def draw_silicon_scatter(data: SiliconPoints) -> go.Figure:
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    parts = data.points["partition"].unique(maintain_order=True).to_list()
    rows = math.ceil(len(parts) / COLS)
    fig = make_subplots(rows=rows, cols=COLS, subplot_titles=parts, vertical_spacing=0.3 / rows,
                        horizontal_spacing=0.06)  # fmt: skip
    shown: set[str] = set()
    for i, part in enumerate(parts):
        r, c = i // COLS + 1, i % COLS + 1
        p = data.points.filter(data.points["partition"] == part)
        vals = [p[k].drop_nulls().to_numpy() for k in p.columns[2:]]
        lo = float(min(v.min() for v in vals if v.size)) * 0.7
        hi = float(max(v.max() for v in vals if v.size)) * 1.4
        fig.add_trace(
            go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "#aaa", "dash": "dot"},
                       showlegend=False, hoverinfo="skip"),
            row=r, col=c,
        )  # fmt: skip
        for metric, color in COLORS.items():
            for tool, symbol in TOOLS.items():
                y = p[f"{tool}_{metric}_ms"].to_numpy()
                x = p[f"{metric}_ms"].to_numpy()
                keep = np.isfinite(y.astype(float))
                name = f"{'pdlab' if tool == 'pdlab' else 'AIConfigurator'} {metric.upper()}"
                fig.add_trace(
                    go.Scatter(
                        x=x[keep], y=y[keep], mode="markers", name=name, legendgroup=name,
                        showlegend=name not in shown,
                        marker={"color": color, "symbol": symbol, "size": 5, "opacity": 0.7},
                        text=p["row_id"].to_numpy()[keep], meta={"metric": metric, "tool": tool},
                    ),
                    row=r, col=c,
                )  # fmt: skip
                shown.add(name)
        fig.update_xaxes(type="log", row=r, col=c)
        fig.update_yaxes(type="log", row=r, col=c)
    fig.update_xaxes(title_text="measured (ms)", row=rows, col=1)
    fig.update_yaxes(title_text="predicted (ms)", row=1, col=1)
    return style(fig, TITLE, data.run_id, note=f"{data.points.height} rows replayed",
                 height=260 * rows + 140)  # fmt: skip
