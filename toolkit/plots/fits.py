"""Iteration-time fit figures (paper 000 §5.1, Eq. 1-2; Fig. 5 and Fig. B.1).

`prefill_fit` and `decode_fit` show, per node, how the fitted models track the logged
iterations: measured vs predicted (prefill) and iteration time vs running requests B with
the model curve (decode, Fig. 5(d)), then the relative error (measured − predicted) /
measured binned by tokens and by batch size — Σt_uc and requests per prefill batch, B and
context tokens per decode iteration (the context term Eq. 2 omits shows up as a trend in the
last panel). The fits, binned errors and sampled points come from `toolkit.queries.fits`
(held-out MAPE in the legend).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from models.iteration import DecodeModel
from toolkit.fit.run import PhaseFit, RunFit
from toolkit.plots.common import no_data, node_color, style
from toolkit.queries.fits import FitData, fit_data
from toolkit.queries.run import Source, open_run

PREFILL_TITLE = "Prefill iteration-time fit (Eq. 1)"
DECODE_TITLE = "Decode iteration-time fit (Eq. 2)"


def _legend_name(node: int, f: PhaseFit) -> str:
    mape = f"held-out MAPE {100 * f.mape:.1f}%" if f.mape is not None else "no held-out MAPE"
    return f"node {node} · {mape}"


def _residual_traces(
    fig: go.Figure, stats: pl.DataFrame, node: int, dim: str, col: int, mode: str = "lines+markers"
) -> None:
    part = stats.filter((pl.col("node_id") == node) & (pl.col("dim") == dim))
    if part.is_empty():
        return
    fig.add_trace(
        go.Scatter(
            x=part["x"].to_numpy(),
            y=(100 * part["rel_err"]).to_numpy(),
            error_y={
                "type": "data",
                "array": (100 * part["rel_sd"]).to_numpy(),
                "thickness": 1,
                "width": 3,
                "color": _alpha(node_color(node), 0.45),
            },
            mode=mode,
            marker={"color": node_color(node), "size": 6},
            line={"width": 1},
            name=f"node {node}",
            legendgroup=f"node{node}",
            showlegend=False,
            customdata=part["n"].to_numpy(),
            hovertemplate="x=%{x:.4g}<br>error %{y:.2f}% ± %{error_y.array:.2f}"
            "<br>%{customdata} iterations<extra>node " + str(node) + "</extra>",
        ),
        row=1,
        col=col,
    )


def _alpha(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _not_fitted_note(notes: list[str]) -> str:
    """Short subtitle text; the full reasons are in the figure's meta and `pdlab fit`."""
    nodes = [n.split(":")[0] for n in notes]
    return " · not fitted: " + ", ".join(nodes) + " (see pdlab fit)"


def _zero_lines(fig: go.Figure, cols: tuple[int, ...]) -> None:
    for c in cols:
        fig.add_hline(y=0, line={"color": "#888", "width": 1, "dash": "dot"}, row=1, col=c)


def prefill_fit(
    db: Source,
    run_id: str | None = None,
    *,
    fit: RunFit | None = None,
    sample: int = 1500,
) -> go.Figure:
    """Eq. 1 per node: measured vs predicted (sampled), error by Σt_uc and by batch size.

    `fit` reuses a `fit_run` result; `sample` caps the scatter points per node.
    """
    with open_run(db, run_id) as run:
        data = fit_data(run, "prefill", fit=fit, sample=sample)
    return draw_prefill_fit(data)


def draw_prefill_fit(data: FitData) -> go.Figure:
    """The figure of `prefill_fit` from its data."""
    if data.missing:
        return no_data(PREFILL_TITLE, data.run_id, data.missing)
    fits, notes, stats, pts, counts = (
        data.fits,
        data.not_fitted,
        data.stats,
        data.points,
        data.counts,
    )
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "measured vs predicted",
            "error by uncached tokens Σt_uc",
            "error by requests per batch",
        ),
        horizontal_spacing=0.08,
    )
    lo, hi = float("inf"), 0.0
    for node in sorted(fits):
        p = pts.filter(pl.col("node_id") == node)
        if p.is_empty():
            continue
        both = np.concatenate([p["y"].to_numpy(), p["yhat"].to_numpy()])
        lo, hi = min(lo, float(both.min())), max(hi, float(both.max()))
        fig.add_trace(
            go.Scattergl(
                x=(1e3 * p["yhat"]).to_numpy(),
                y=(1e3 * p["y"]).to_numpy(),
                mode="markers",
                marker={"color": node_color(node), "size": 4, "opacity": 0.5},
                name=_legend_name(node, fits[node]),
                legendgroup=f"node{node}",
                customdata=np.column_stack(
                    [
                        p["t_uc"].to_numpy(),
                        p["attn_pairs"].to_numpy(),
                        p["t_rst"].to_numpy(),
                        p["num_reqs"].to_numpy(),
                        p["iter_id"].to_numpy(),
                    ]
                ),
                hovertemplate="predicted %{x:.2f} ms<br>measured %{y:.2f} ms"
                "<br>Σt_uc=%{customdata[0]}<br>ΣA=%{customdata[1]:.3s}"
                "<br>Σt_rst=%{customdata[2]}<br>%{customdata[3]} requests"
                "<br>iteration %{customdata[4]}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        _residual_traces(fig, stats, node, "tokens", 2)
        _residual_traces(fig, stats, node, "batch", 3)
    if hi > 0:
        fig.add_trace(
            go.Scatter(
                x=[1e3 * lo, 1e3 * hi],
                y=[1e3 * lo, 1e3 * hi],
                mode="lines",
                line={"color": "#444", "dash": "dash", "width": 1},
                name="measured = predicted",
            ),
            row=1,
            col=1,
        )
    _zero_lines(fig, (2, 3))
    fig.update_xaxes(title_text="predicted T_P (ms)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="measured T_P (ms)", type="log", row=1, col=1)
    fig.update_xaxes(title_text="Σt_uc per iteration (tokens, log)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="requests per prefill iteration", row=1, col=3)
    fig.update_yaxes(title_text="(measured − predicted) / measured (%)", row=1, col=2)
    note = (
        f"{sum(counts.values()):,} iterations, up to {data.sample:,} points per node drawn; "
        "bars ±1 SD"
    )
    if notes:
        note += _not_fitted_note(notes)
    fig = style(fig, PREFILL_TITLE, data.run_id, note, height=460)
    fig.update_layout(legend={"itemsizing": "constant"})
    fig.layout.meta["not_fitted"] = notes
    return fig


def decode_fit(
    db: Source,
    run_id: str | None = None,
    *,
    fit: RunFit | None = None,
    sample: int = 1500,
) -> go.Figure:
    """Eq. 2 per node: time vs B with the model curve (Fig. 5(d)), error by B and by context.

    The curve evaluates T_D(B) = d0 + d1·phi(B) + d2·B at each node's mean t_fwd.
    """
    with open_run(db, run_id) as run:
        data = fit_data(run, "decode", fit=fit, sample=sample)
    return draw_decode_fit(data)


def draw_decode_fit(data: FitData) -> go.Figure:
    """The figure of `decode_fit` from its data."""
    if data.missing:
        return no_data(DECODE_TITLE, data.run_id, data.missing)
    fits, notes, stats, pts, counts = (
        data.fits,
        data.not_fitted,
        data.stats,
        data.points,
        data.counts,
    )
    shape, tf = data.shapes, data.t_fwd
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "iteration time vs running requests B",
            "error by B",
            "error by context tokens (omitted term)",
        ),
        horizontal_spacing=0.08,
    )
    for node in sorted(fits):
        p = pts.filter(pl.col("node_id") == node)
        color = node_color(node)
        fig.add_trace(
            go.Scattergl(
                x=p["batch_size"].to_numpy(),
                y=(1e3 * p["y"]).to_numpy(),
                mode="markers",
                marker={"color": color, "size": 3, "opacity": 0.25},
                name=_legend_name(node, fits[node]),
                legendgroup=f"node{node}",
                customdata=np.column_stack(
                    [
                        1e3 * p["yhat"].to_numpy(),
                        p["t_fwd"].to_numpy(),
                        p["ctx_tokens"].to_numpy(),
                        p["iter_id"].to_numpy(),
                    ]
                ),
                hovertemplate="B=%{x}<br>measured %{y:.2f} ms<br>predicted %{customdata[0]:.2f} ms"
                "<br>t_fwd=%{customdata[1]}<br>context %{customdata[2]} tokens"
                "<br>iteration %{customdata[3]}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        s = stats.filter((pl.col("node_id") == node) & (pl.col("dim") == "batch"))
        fig.add_trace(
            go.Scatter(
                x=s["x"].to_numpy(),
                y=(1e3 * s["y_mean"]).to_numpy(),
                mode="markers",
                marker={"color": color, "size": 6, "symbol": "circle-open"},
                name=f"node {node} mean per B",
                legendgroup=f"node{node}",
                showlegend=False,
                hovertemplate="B=%{x}<br>mean measured %{y:.2f} ms<extra>node "
                + str(node)
                + "</extra>",
            ),
            row=1,
            col=1,
        )
        k, e = shape.get(node, (0, 0))
        coef = fits[node].coef or (0.0, 0.0, 0.0)
        model = DecodeModel.from_coef(
            coef, top_k=max(k, 1) if e else 8, num_experts=e, t_fwd=float(tf.get(node) or 1.0)
        )
        b_max = max(int(s["x"].to_numpy().max(initial=1)), 1)
        grid = (
            np.unique(np.round(np.geomspace(1, b_max, 120))).astype(float)
            if b_max > 1
            else np.array([1.0])
        )
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=1e3 * model.predict(grid),
                mode="lines",
                line={"color": color, "width": 2},
                name=f"node {node} model",
                legendgroup=f"node{node}",
                showlegend=False,
                meta={"model": "decode", "node_id": node, "t_fwd": model.t_fwd},
                hovertemplate="B=%{x}<br>model %{y:.2f} ms<extra>node " + str(node) + "</extra>",
            ),
            row=1,
            col=1,
        )
        _residual_traces(fig, stats, node, "batch", 2, mode="markers")
        _residual_traces(fig, stats, node, "tokens", 3)
    _zero_lines(fig, (2, 3))
    fig.update_xaxes(title_text="running requests B", row=1, col=1)
    fig.update_yaxes(title_text="decode iteration time T_D (ms)", row=1, col=1)
    fig.update_xaxes(title_text="running requests B", row=1, col=2)
    fig.update_xaxes(title_text="context tokens per iteration (log)", type="log", row=1, col=3)
    fig.update_yaxes(title_text="(measured − predicted) / measured (%)", row=1, col=2)
    note = (
        f"{sum(counts.values()):,} iterations; lines: model at each node's mean t_fwd; bars ±1 SD"
    )
    if notes:
        note += _not_fitted_note(notes)
    fig = style(fig, DECODE_TITLE, data.run_id, note, height=460)
    fig.update_layout(legend={"itemsizing": "constant"})
    fig.layout.meta["not_fitted"] = notes
    return fig
