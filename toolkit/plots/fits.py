"""Iteration-time fit figures (paper 000 §5.1, Eq. 1-2; Fig. 5 and Fig. B.1).

`prefill_fit` and `decode_fit` show, per node, how the fitted models track the logged
iterations: measured vs predicted (prefill) and iteration time vs running requests B with
the model curve (decode, Fig. 5(d)), then the relative error (measured − predicted) /
measured binned by tokens and by batch size — Σt_uc and requests per prefill batch, B and
context tokens per decode iteration (the context term Eq. 2 omits shows up as a trend in the
last panel). Coefficients come from `toolkit.fitting.fit_run` (held-out MAPE in the legend)
unless a `RunFit` is passed. Predictions and bins are computed in DuckDB with the
coefficients as query parameters; the scatter points are a per-node hash sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from models.iteration import DecodeModel
from toolkit.fit_sql import PHASE_SQL, PhaseSql, values_list
from toolkit.fitting import FitInputError, PhaseFit, RunFit, fit_run
from toolkit.plots.common import Run, Source, hash_sample, no_data, node_color, open_run, style

PREFILL_TITLE = "Prefill iteration-time fit (Eq. 1)"
DECODE_TITLE = "Decode iteration-time fit (Eq. 2)"
BINS_PER_OCTAVE = 2  # token bins are half-octaves: fine enough to show a trend, >10 rows each


def _fits(run: Run, fit: RunFit | None, phase: str) -> tuple[dict[int, PhaseFit], list[str]]:
    """The successful fits of `phase` per node, and notes for nodes that failed."""
    if fit is None:
        fit = fit_run(run.reader, run.run_id, bootstrap=0)
    elif fit.run_id != run.run_id:
        raise ValueError(f"the RunFit passed is of run {fit.run_id!r}, not {run.run_id!r}")
    ok: dict[int, PhaseFit] = {}
    notes = []
    for node in fit.nodes:
        pf = node.prefill if phase == "prefill" else node.decode
        if pf.ok:
            ok[node.node_id] = pf
        elif pf.samples or pf.samples_test:
            notes.append(f"node {node.node_id}: {pf.message}")
    return ok, notes


def _model_sql(run: Run, spec: PhaseSql, fits: dict[int, PhaseFit]) -> tuple[str, str, list[Any]]:
    """(FROM clause joining the coefficients, prediction expression, its parameters)."""
    shapes = {
        int(r["node_id"]): (int(r["moe_top_k"] or 0), int(r["moe_experts"] or 0))
        for r in run.nodes().iter_rows(named=True)
    }
    rows = []
    for n, f in fits.items():
        k, e = shapes.get(n, (0, 0))
        log_base = float(np.log1p(-k / e)) if e > 0 and 0 < k <= e else 0.0
        rows.append((n, *(f.coef or ()), log_base))
    cols = ["node_id", *(f"c{i}" for i in range(len(spec.terms))), "log_base"]
    values, params = values_list(rows, cols)
    pred = " + ".join(["m.c0", *(f"m.c{i + 1} * ({f})" for i, f in enumerate(spec.features))])
    source = f"{spec.table} t JOIN {values} ON m.node_id = t.node_id"
    return source, pred, params


def _legend_name(node: int, f: PhaseFit) -> str:
    mape = f"held-out MAPE {100 * f.mape:.1f}%" if f.mape is not None else "no held-out MAPE"
    return f"node {node} · {mape}"


def _binned(
    run: Run,
    source: str,
    pred: str,
    params: list[Any],
    spec: PhaseSql,
    dims: dict[str, tuple[str, str]],
) -> pl.DataFrame:
    """Relative error statistics per node and bin for each binning in `dims`, in one scan.

    `dims` maps a name to (SQL of the bin key, SQL of the binned quantity); x is the mean of
    the quantity within the bin. Every binning covers every valid row once.
    """
    cols = ", ".join(f"{key} AS k_{name}, {x} AS x_{name}" for name, (key, x) in dims.items())
    sets = ", ".join(f"(node_id, k_{name})" for name in dims)
    dim = " ".join(f"WHEN grouping(k_{name}) = 0 THEN '{name}'" for name in dims)
    xs = " ".join(f"WHEN grouping(k_{name}) = 0 THEN avg(x_{name})" for name in dims)
    q = f"""
        SELECT node_id, CASE {dim} END AS dim, CASE {xs} END AS x, count(*) AS n,
               avg(y) AS y_mean, avg(r) AS rel_err, coalesce(stddev_samp(r), 0) AS rel_sd
        FROM (
            SELECT t.node_id, t.duration_s AS y, (t.duration_s - ({pred})) / t.duration_s AS r,
                   {cols}
            FROM {source}
            WHERE t.run_id = ? AND coalesce({spec.valid}, false)
        )
        GROUP BY GROUPING SETS ({sets})
        ORDER BY node_id, dim, x
    """
    return run.df(q, [*params, run.run_id])


def _log_bin(col: str) -> str:
    return f"floor(log2(greatest({col}, 1)) * {BINS_PER_OCTAVE})"


def _sample(
    run: Run,
    source: str,
    pred: str,
    params: list[Any],
    spec: PhaseSql,
    counts: dict[int, int],
    columns: str,
    limit: int,
) -> pl.DataFrame:
    where, sparams = hash_sample("t.node_id, t.iter_id", counts, "t.node_id", limit)
    q = f"""
        SELECT t.node_id, t.iter_id, t.duration_s AS y, {pred} AS yhat, {columns}
        FROM {source}
        WHERE t.run_id = ? AND coalesce({spec.valid}, false) AND {where}
        QUALIFY row_number() OVER (PARTITION BY t.node_id ORDER BY hash(t.node_id, t.iter_id)) <= ?
        ORDER BY t.node_id, t.iter_id
    """
    return run.df(q, [*params, run.run_id, *sparams, limit])


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


def _fits_or_message(
    run: Run, fit: RunFit | None, phase: str, title: str
) -> tuple[dict[int, PhaseFit], list[str]] | go.Figure:
    """The phase's per-node fits, or a figure saying why there are none."""
    if run.count(f"{phase}_iterations") == 0:
        return no_data(title, run, f"no {phase} iterations logged in run {run.run_id}")
    try:
        fits, notes = _fits(run, fit, phase)
    except FitInputError as exc:
        return no_data(title, run, f"cannot fit run {run.run_id}: {exc}")
    if not fits:
        return no_data(title, run, f"no node's {phase} model could be fitted: " + "; ".join(notes))
    return fits, notes


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
        got = _fits_or_message(run, fit, "prefill", PREFILL_TITLE)
        if isinstance(got, go.Figure):
            return got
        fits, notes = got
        spec = PHASE_SQL["prefill"]
        source, pred, params = _model_sql(run, spec, fits)
        stats = _binned(
            run,
            source,
            pred,
            params,
            spec,
            {
                "tokens": (_log_bin("t.t_uc"), "t.t_uc::DOUBLE"),
                "batch": ("t.num_reqs", "t.num_reqs::DOUBLE"),
            },
        )
        counts = _counts(stats)
        pts = _sample(
            run,
            source,
            pred,
            params,
            spec,
            counts,
            "t.t_uc, t.attn_pairs, t.t_rst, t.num_reqs",
            sample,
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
        f"{sum(counts.values()):,} iterations, up to {sample:,} points per node drawn; bars ±1 SD"
    )
    if notes:
        note += _not_fitted_note(notes)
    fig = style(fig, PREFILL_TITLE, run, note, height=460)
    fig.update_layout(legend={"itemsizing": "constant"})
    fig.layout.meta["not_fitted"] = notes
    return fig


def _counts(stats: pl.DataFrame) -> dict[int, int]:
    """Rows per node (from one binning, which covers every row once)."""
    first = stats["dim"][0] if stats.height else None
    part = stats.filter(pl.col("dim") == first)
    return {int(n): int(c) for n, c in part.group_by("node_id").agg(pl.col("n").sum()).iter_rows()}


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
        got = _fits_or_message(run, fit, "decode", DECODE_TITLE)
        if isinstance(got, go.Figure):
            return got
        fits, notes = got
        spec = PHASE_SQL["decode"]
        source, pred, params = _model_sql(run, spec, fits)
        stats = _binned(
            run,
            source,
            pred,
            params,
            spec,
            {
                "batch": ("t.batch_size", "t.batch_size::DOUBLE"),
                "tokens": (_log_bin("t.ctx_tokens"), "t.ctx_tokens::DOUBLE"),
            },
        )
        counts = _counts(stats)
        pts = _sample(
            run, source, pred, params, spec, counts, "t.batch_size, t.t_fwd, t.ctx_tokens", sample
        )
        shape = {
            int(r["node_id"]): (int(r["moe_top_k"] or 0), int(r["moe_experts"] or 0))
            for r in run.nodes().iter_rows(named=True)
        }
        tf = dict(
            run.rows(
                "SELECT node_id, avg(t_fwd) FROM decode_iterations WHERE run_id = ? "
                "GROUP BY node_id",
                [run.run_id],
            )
        )
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
    fig = style(fig, DECODE_TITLE, run, note, height=460)
    fig.update_layout(legend={"itemsizing": "constant"})
    fig.layout.meta["not_fitted"] = notes
    return fig
