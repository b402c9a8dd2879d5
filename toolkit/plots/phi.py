"""Expert coverage phi(B) of the run's MoE shapes (paper 000 App. B.3, the d1 term of Eq. 2).

phi(B) = 1 − (1 − k/E)^(t_fwd·B) is the expected fraction of the E routed experts that the
t_fwd·B tokens of a decode iteration select (k per token). One curve per distinct
(k, E, t_fwd) among the run's nodes (`toolkit.queries.phi`); behind the curves, the share of
decode iterations at each batch size, so one sees where on the curve the run operated; and,
where the engines logged real routing (`experts_active`), the measured coverage per B as
markers with ±1 standard deviation, against the modelled curve.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from models.iteration import phi
from toolkit.plots.common import NODE_COLORS, no_data, style
from toolkit.queries.phi import PhiData, phi_data
from toolkit.queries.run import Source, open_run

TITLE = "Expert coverage φ(B)"


def phi_curve(db: Source, run_id: str | None = None, *, max_batch: int | None = None) -> go.Figure:
    """phi(B) per distinct MoE shape of the run's nodes, over the observed batch sizes.

    `max_batch` sets the right end of B (default: 1.5x the largest logged batch, >= 64).
    """
    with open_run(db, run_id) as run:
        data = phi_data(run)
    return draw_phi(data, max_batch=max_batch)


def draw_phi(data: PhiData, *, max_batch: int | None = None) -> go.Figure:
    """The figure of `phi_curve` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    hist = data.batch_hist
    b_obs = max((b for b, _ in hist), default=0)
    b_max = max_batch or max(64, int(np.ceil(1.5 * b_obs)))
    grid = np.arange(1, b_max + 1, dtype=float)
    fig = go.Figure()
    total = sum(c for _, c in hist)
    if total:
        fig.add_trace(
            go.Bar(
                x=[b for b, _ in hist],
                y=[c / total for _, c in hist],
                name="decode iterations at B (right axis)",
                marker={"color": "#cccccc"},
                hovertemplate="B=%{x}: %{y:.1%} of decode iterations<extra></extra>",
            )
        )
    for i, shape in enumerate(data.shapes):
        k, e, t_fwd = shape.top_k, shape.num_experts, shape.t_fwd
        members = ", ".join(str(n) for n in shape.nodes)
        if e == 0:
            y = np.zeros_like(grid)
            label = f"dense (φ ≡ 0) · nodes {members}"
        else:
            y = np.asarray(phi(grid, k, e, t_fwd))
            label = f"k={k} of E={e}, t_fwd={t_fwd:g} · nodes {members}"
        fig.add_trace(
            go.Scatter(
                x=grid.tolist(),
                y=y.tolist(),
                mode="lines",
                line={"color": NODE_COLORS[i % len(NODE_COLORS)], "width": 2.5},
                name=label,
                yaxis="y2",
                meta={"top_k": k, "num_experts": e, "t_fwd": t_fwd, "nodes": shape.nodes},
                hovertemplate="B=%{x}<br>φ=%{y:.3f}<extra></extra>",
            )
        )
        if shape.measured:
            m = shape.measured
            fig.add_trace(
                go.Scatter(
                    x=[p.batch_size for p in m],
                    y=[p.mean for p in m],
                    error_y={"type": "data", "array": [p.std for p in m]},
                    customdata=[p.iterations for p in m],
                    mode="markers",
                    marker={"color": NODE_COLORS[i % len(NODE_COLORS)], "symbol": "x", "size": 9},
                    name=f"measured: experts_active / E · nodes {members}",
                    yaxis="y2",
                    meta={"measured": True, "nodes": shape.nodes},
                    hovertemplate="B=%{x}<br>measured φ=%{y:.3f} over %{customdata} "
                    "iterations<extra></extra>",
                )
            )
    fig.update_layout(
        xaxis={"title": {"text": "running requests B"}},
        # The histogram sits on the base axis (drawn first, behind); the curves overlay it.
        yaxis={
            "title": {"text": "share of decode iterations"},
            "side": "right",
            "showgrid": False,
            "tickformat": ".0%",
            "rangemode": "tozero",
        },
        yaxis2={
            "title": {"text": "φ(B): fraction of routed experts read"},
            "overlaying": "y",
            "side": "left",
            "range": [0, 1.02],
            "tickmode": "linear",
            "tick0": 0,
            "dtick": 0.2,
        },
        legend={
            "x": 0.98,
            "xanchor": "right",
            "y": 0.05,
            "yanchor": "bottom",
            "bgcolor": "rgba(255,255,255,0.8)",
        },
        bargap=0.1,
    )
    note = "φ(B) = 1 − (1 − k/E)^(t_fwd·B)" + (
        " · " + "; ".join(data.invalid) if data.invalid else ""
    )
    return style(fig, TITLE, data.run_id, note, height=420)
