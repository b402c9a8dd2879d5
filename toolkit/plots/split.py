"""PD split over time with phase-switch markers (paper 000 §4.1–4.2, §5.3; SPEC §5 metrics).

The top panel counts nodes per phase (the split) with a marker at each switch decision, the
bottom one draws each node's phases as bands. The phases come from
`toolkit.queries.split` (rebuilt from the config and `phase_switches`).
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import PHASE_COLORS, no_data, style
from toolkit.queries.run import Source, open_run
from toolkit.queries.split import PHASE_ORDER, SplitData, split_data

TITLE = "PD split over time"


def pd_split(db: Source, run_id: str | None = None) -> go.Figure:
    """Nodes per phase over time (step lines, switch markers) and each node's phase bands."""
    with open_run(db, run_id) as run:
        data = split_data(run)
    return draw_split(data)


def draw_split(data: SplitData) -> go.Figure:
    """The figure of `pd_split` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    segs, switches, counts, labels = (
        data.timeline.segments,
        data.timeline.switches,
        data.counts,
        data.labels,
    )
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.45, 0.55],
        vertical_spacing=0.12,
        subplot_titles=("nodes per phase", "phase of each node"),
    )
    for phase in PHASE_ORDER:
        if phase not in counts.columns:
            continue
        fig.add_trace(
            go.Scatter(
                x=counts["t"].to_list(),
                y=counts[phase].to_list(),
                mode="lines",
                line={"shape": "hv", "color": PHASE_COLORS[phase], "width": 2.5},
                name=f"{phase} nodes",
                legendgroup=phase,
                hovertemplate="t=%{x:.1f} s: %{y} " + phase + " nodes<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if switches.height:
        pcol = "prefill" if "prefill" in counts.columns else counts.columns[1]
        at = [_count_at(counts, pcol, float(t)) for t in switches["t_decided"].to_list()]
        text = [
            f"node {r['node_id']}: {r['from_phase']} → {r['to_phase']} ({r['trigger']})<br>"
            f"decided {r['t_decided']:.1f} s, done "
            + (f"{r['t_done']:.1f} s" if r["t_done"] is not None else "—")
            + f"<br>drained {r['drained']} requests"
            for r in switches.iter_rows(named=True)
        ]
        fig.add_trace(
            go.Scatter(
                x=switches["t_decided"].to_list(),
                y=at,
                mode="markers",
                marker={"symbol": "triangle-down", "size": 12, "color": PHASE_COLORS["switching"]},
                name="phase switch (decided)",
                text=text,
                hovertemplate="%{text}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for phase in PHASE_ORDER:
        mine = [s for s in segs if s.phase == phase]
        if not mine:
            continue
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=[s.t0 for s in mine],
                x=[s.t1 - s.t0 for s in mine],
                y=[labels.get(s.node_id, f"node {s.node_id}") for s in mine],
                marker={"color": PHASE_COLORS[phase], "line": {"width": 0}},
                name=phase,
                legendgroup=phase,
                showlegend=False,
                customdata=[[s.t0, s.t1] for s in mine],
                hovertemplate="%{y}: "
                + phase
                + " %{customdata[0]:.1f}–%{customdata[1]:.1f} s<extra></extra>",
            ),
            row=2,
            col=1,
        )
    order = [labels.get(n, f"node {n}") for n in sorted({s.node_id for s in segs})]
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_yaxes(title_text="nodes", rangemode="tozero", dtick=1, row=1, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], row=2, col=1)
    fig.update_xaxes(title_text="time since run start (s)", row=2, col=1)
    final = {p: int(counts[p][-1]) for p in PHASE_ORDER if p in counts.columns}
    note = f"{switches.height} switches; final: " + ", ".join(
        f"{v} {p}" for p, v in final.items() if v
    )
    height = 360 + 22 * len(order)
    return style(fig, TITLE, data.run_id, note, height=min(height, 900))


def _count_at(counts: pl.DataFrame, col: str, t: float) -> int:
    before = counts.filter(pl.col("t") <= t)
    return int(before[col][-1]) if before.height else 0
