"""Expert coverage phi(B) of the run's MoE shapes (paper 000 App. B.3, the d1 term of Eq. 2).

phi(B) = 1 − (1 − k/E)^(t_fwd·B) is the expected fraction of the E routed experts that the
t_fwd·B tokens of a decode iteration select (k per token). One curve per distinct
(k, E, t_fwd) among the run's nodes, t_fwd being each node's mean logged tokens per request
per iteration (1 without speculative decoding); behind the curves, the share of decode
iterations at each batch size, so one sees where on the curve the run operated.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from models.iteration import phi
from toolkit.plots.common import NODE_COLORS, Source, no_data, open_run, style

TITLE = "Expert coverage φ(B)"


def phi_curve(db: Source, run_id: str | None = None, *, max_batch: int | None = None) -> go.Figure:
    """phi(B) per distinct MoE shape of the run's nodes, over the observed batch sizes.

    `max_batch` sets the right end of B (default: 1.5x the largest logged batch, >= 64).
    """
    with open_run(db, run_id) as run:
        nodes = run.nodes()
        if nodes.is_empty():
            return no_data(TITLE, run, f"no nodes rows (MoE shapes) logged in run {run.run_id}")
        tf = dict(
            run.rows(
                "SELECT node_id, avg(t_fwd) FROM decode_iterations WHERE run_id = ? "
                "GROUP BY node_id",
                [run.run_id],
            )
        )
        hist = run.rows(
            "SELECT batch_size, count(*) FROM decode_iterations WHERE run_id = ? "
            "GROUP BY batch_size ORDER BY batch_size",
            [run.run_id],
        )
    groups: dict[tuple[int, int, float], list[int]] = {}
    for r in nodes.iter_rows(named=True):
        k, e = int(r["moe_top_k"] or 0), int(r["moe_experts"] or 0)
        t_fwd = round(float(tf.get(r["node_id"]) or 1.0), 3)
        groups.setdefault((k, e, t_fwd), []).append(int(r["node_id"]))
    b_obs = max((int(b) for b, _ in hist), default=0)
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
    notes = []
    for i, ((k, e, t_fwd), ids) in enumerate(sorted(groups.items())):
        members = ", ".join(str(n) for n in ids)
        if e == 0:
            y = np.zeros_like(grid)
            label = f"dense (φ ≡ 0) · nodes {members}"
        elif not 0 < k <= e:
            notes.append(f"nodes {members}: invalid MoE shape k={k}, E={e}")
            continue
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
                meta={"top_k": k, "num_experts": e, "t_fwd": t_fwd, "nodes": ids},
                hovertemplate="B=%{x}<br>φ=%{y:.3f}<extra></extra>",
            )
        )
    if len(fig.data) == (1 if total else 0):
        return no_data(TITLE, run, "; ".join(notes) or "no MoE shapes to plot")
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
    note = "φ(B) = 1 − (1 − k/E)^(t_fwd·B)" + (" · " + "; ".join(notes) if notes else "")
    return style(fig, TITLE, run, note, height=420)
