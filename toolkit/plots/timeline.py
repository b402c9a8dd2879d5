"""Per-node iteration timeline (Gantt): prefill and decode passes with the requests in each
(paper 000 §4.1: where prefill and decode passes of a node interfere).

One lane per node and phase. A window of up to `max_passes` passes is drawn pass by pass
(hover: the pass, its duration, batch, tokens and request ids); a larger one as each lane's
busy share per time bin (`toolkit.queries.timeline`). `pass_timeline` adds, above the
window, that busy share over the whole run with the window marked, so a report shows where
the window lies; `draw_pass_window` draws a window alone (the dashboard's live view).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import PHASE_COLORS, no_data, style
from toolkit.queries.run import Source, open_run
from toolkit.queries.timeline import (
    MAX_PASSES,
    PassWindow,
    busy_overview,
    default_window,
    pass_window,
)

TITLE = "Iteration timeline per node"
BUSY_SCALE = [[0.0, "#f7fbff"], [0.5, "#6baed6"], [1.0, "#08306b"]]


def pass_timeline(
    db: Source,
    run_id: str | None = None,
    *,
    window: tuple[float, float] | None = None,
    max_passes: int = MAX_PASSES,
) -> go.Figure:
    """The passes of `window` (default: a few hundred around the busiest moment after the
    warmup), under the whole run's busy share per node with the window marked."""
    with open_run(db, run_id) as run:
        t0, t1 = window if window is not None else default_window(run)
        data = pass_window(run, t0, t1, max_passes=max_passes)
        overview = busy_overview(run) if data.missing is None else None
    return draw_pass_window(data, overview)


def lanes(data: PassWindow, frame: pl.DataFrame) -> list[tuple[int, str]]:
    """(node, phase) of every lane with passes, top to bottom."""
    have = {(int(n), str(p)) for n, p in frame.select("node_id", "phase").unique().iter_rows()}
    return sorted(have, key=lambda x: (x[0], x[1] != "prefill"))


def _lane_name(data: PassWindow, node: int, phase: str) -> str:
    return f"{data.labels.get(node, f'node {node}')} · {phase}"


def draw_pass_window(
    data: PassWindow, overview: tuple[pl.DataFrame, float] | None = None, height: int | None = None
) -> go.Figure:
    """The figure of `pass_timeline` from its data (`overview`: `busy_overview`'s)."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    frame = data.passes if data.exact else data.bins
    top = overview is not None and overview[0].height > 0
    if top:
        assert overview is not None
        frame = pl.concat(
            [frame.select("node_id", "phase"), overview[0].select("node_id", "phase")]
        )
    order = lanes(data, frame)
    names = [_lane_name(data, n, p) for n, p in order]
    rows = 2 if top else 1
    lane_px = 30 if data.exact else 24
    plot_px = (
        [16 * len(names) + 10, lane_px * len(names) + 20] if top else [lane_px * len(names) + 20]
    )
    fig = make_subplots(
        rows=rows,
        cols=1,
        row_heights=[p / sum(plot_px) for p in plot_px],
        vertical_spacing=min(0.3, 80 / (sum(plot_px) + 80)) if top else 0.0,
        subplot_titles=(
            ("busy share per time bin over the whole run; the red box is the window below",)
            if top
            else ()
        )
        + (("passes in the window",) if data.exact else ("busy share per bin in the window",)),
    )
    if top:
        assert overview is not None
        _busy_heatmap(fig, data, overview[0], overview[1], names, row=1, colorbar=False)
        fig.add_shape(
            type="rect", x0=data.t0, x1=data.t1, y0=-0.5, y1=len(names) - 0.5,
            line={"color": "#d62728", "width": 2}, row=1, col=1,
        )  # fmt: skip
    if data.exact:
        _bars(fig, data, rows)
    else:
        assert data.width_s is not None
        _busy_heatmap(fig, data, data.bins, data.width_s, names, row=rows, colorbar=True)
    for r in range(1, rows + 1):
        fig.update_yaxes(
            title_text="node · phase",
            categoryorder="array",
            categoryarray=names[::-1],
            type="category",
            row=r,
            col=1,
        )
    fig.update_xaxes(title_text="time since run start (s)", row=rows, col=1)
    fig.update_xaxes(range=[data.t0, data.t1], row=rows, col=1)
    what = (
        f"{data.total:,} passes in [{data.t0:.3f}, {data.t1:.3f}) s"
        if data.exact
        else f"{data.total:,} passes in [{data.t0:.1f}, {data.t1:.1f}) s, "
        f"shown as busy share per {data.width_s:g} s bin (zoom to a window of at most "
        f"{MAX_PASSES:,} passes for single passes)"
    )
    h = height or min(190 + sum(plot_px) + (80 if top else 0), 1200)
    fig = style(fig, TITLE, data.run_id, what, height=h)
    fig.update_layout(
        barmode="overlay",
        bargap=0.3,
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1.0, "xanchor": "right"},
    )
    return fig


def _bars(fig: go.Figure, data: PassWindow, row: int) -> None:
    p = data.passes
    for phase in ("prefill", "decode"):
        part = p.filter(pl.col("phase") == phase)
        if not part.height:
            continue
        rows = list(part.iter_rows(named=True))
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=part["t_start"].to_list(),
                x=part["duration_s"].to_list(),
                y=[_lane_name(data, r["node_id"], phase) for r in rows],
                marker={"color": PHASE_COLORS[phase], "line": {"width": 0}},
                name=f"{phase} pass",
                hovertext=[hover(r) for r in rows],
                hovertemplate="%{hovertext}<extra></extra>",
                meta={"phase": phase},
            ),
            row=row,
            col=1,
        )


def hover(r: dict[str, Any]) -> str:
    """What the hover of one pass says: pass, time, batch, tokens, request ids."""
    ms = 1e3 * r["duration_s"]
    head = f"<b>{r['phase']} pass {r['iter_id']}</b> on node {r['node_id']}<br>"
    head += f"starts {r['t_start']:.4f} s, takes {ms:.2f} ms<br>"
    if r["phase"] == "prefill":
        reqs = "1 request" if r["size"] == 1 else f"{r['size']} requests"
        head += f"{reqs}, {r['tokens']:,} new tokens ({r['ctx_tokens']:,} cached)"
    else:
        head += f"batch {r['size']}, {r['tokens']:,} tokens, context {r['ctx_tokens']:,} tokens"
    ids = r.get("request_ids") or []
    if not ids:
        return head + "<br>requests: none found"
    toks = r.get("request_tokens")
    listed = [
        f"{rid}: {t:,} new tokens" if toks is not None else str(rid)
        for rid, t in zip(ids, toks if toks is not None else [None] * len(ids), strict=True)
    ]
    more = r["n_requests"] - len(ids)
    src = "" if r["requests_from"] == "logged" else " (from request times)"
    return (
        head
        + f"<br>requests{src}:<br>"
        + "<br>".join(listed)
        + (f"<br>… and {more} more" if more > 0 else "")
    )


def _busy_heatmap(
    fig: go.Figure,
    data: PassWindow,
    bins: pl.DataFrame,
    width: float,
    names: list[str],
    *,
    row: int,
    colorbar: bool,
) -> None:
    """Busy share of each lane per time bin (a lane without passes in a bin: 0)."""
    t = sorted(set(bins["t_bin"].to_list()))
    col = {v: i for i, v in enumerate(t)}
    lane_of = {n: i for i, n in enumerate(names)}
    z = [[0.0] * len(t) for _ in names]
    text = [[""] * len(t) for _ in names]
    for r in bins.iter_rows(named=True):
        name = _lane_name(data, int(r["node_id"]), str(r["phase"]))
        if name not in lane_of:
            continue
        i, j = lane_of[name], col[r["t_bin"]]
        z[i][j] = float(r["busy"])
        text[i][j] = (
            f"{r['passes']:,} passes, {int(r['tokens'] or 0):,} tokens, "
            f"mean batch {r['mean_size']:.1f}"
        )
    fig.add_trace(
        go.Heatmap(
            x=[v + width / 2 for v in t],
            y=names,
            z=z,
            text=text,
            zmin=0,
            zmax=1,
            colorscale=BUSY_SCALE,
            showscale=colorbar,
            colorbar={"title": {"text": "busy"}, "tickformat": ".0%", "len": 0.6},
            hovertemplate="%{y}, %{x:.1f} s: busy %{z:.0%}<br>%{text}<extra></extra>",
            xgap=0,
            ygap=2,
        ),
        row=row,
        col=1,
    )
