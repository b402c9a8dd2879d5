"""The twin against the real run: CDF overlays and per-request scatter (SPEC §9 `pdlab twin`).

Both take a run written by `pdlab twin` (it names the run it replays) and read
`toolkit.queries.twin.twin_pairs`. `twin_cdf` overlays the real and simulated empirical
CDFs of TTFT, TPOT and E2E; `twin_scatter` puts each request's simulated E2E and TTFT
against its real one, with the diagonal where a perfect twin would put every point.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, panel_message, style
from toolkit.queries.run import Source, open_run
from toolkit.queries.twin import TwinPairs, twin_pairs

CDF_TITLE = "Twin vs real: latency CDFs"
SCATTER_TITLE = "Twin vs real: per request"
REAL, SIM = "#1f77b4", "#ff7f0e"
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def _note(data: TwinPairs) -> str:
    note = f"replay of run {data.real_run_id}"
    if data.forced:
        note += "; FORCED: replayed on a profile of another model or GPU"
    return note


def twin_cdf(db: Source, run_id: str | None = None) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and E2E: the real run and its twin."""
    with open_run(db, run_id) as run:
        data = twin_pairs(run)
    return draw_twin_cdf(data)


def draw_twin_cdf(data: TwinPairs) -> go.Figure:
    if data.missing:
        return no_data(CDF_TITLE, data.run_id, data.missing)
    fig = make_subplots(rows=1, cols=3, subplot_titles=tuple(NAMES.values()))
    for col, metric in enumerate(NAMES, start=1):
        for kind, color in (("real", REAL), ("sim", SIM)):
            v = data.pairs[f"{metric}_{kind}"].drop_nulls().sort().to_numpy()
            if not v.size:
                panel_message(fig, 1, col, f"no {NAMES[metric]} values")
                continue
            fig.add_trace(
                go.Scatter(
                    x=v,
                    y=np.arange(1, v.size + 1) / v.size,
                    mode="lines",
                    line={"color": color, "width": 2, "shape": "hv"},
                    name=f"real ({data.real_run_id})" if kind == "real" else "twin",
                    legendgroup=kind,
                    showlegend=col == 1,
                    meta={"metric": metric, "kind": kind},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text=f"{NAMES[metric]} (s)", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", tickformat=".0%", row=1, col=1)
    return style(fig, CDF_TITLE, data.run_id, note=_note(data))


def twin_scatter(db: Source, run_id: str | None = None) -> go.Figure:
    """Each request's simulated E2E and TTFT against the real ones."""
    with open_run(db, run_id) as run:
        data = twin_pairs(run)
    return draw_twin_scatter(data)


def draw_twin_scatter(data: TwinPairs) -> go.Figure:
    if data.missing:
        return no_data(SCATTER_TITLE, data.run_id, data.missing)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("E2E", "TTFT"))
    for col, metric in enumerate(("e2e", "ttft"), start=1):
        real, sim = data.pairs[f"{metric}_real"], data.pairs[f"{metric}_sim"]
        top = float(np.nanmax(np.concatenate([real.to_numpy(), sim.to_numpy()])))
        fig.add_trace(
            go.Scatter(
                x=[0, top],
                y=[0, top],
                mode="lines",
                line={"color": "#999", "dash": "dot"},
                name="sim = real",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=real.to_list(),
                y=sim.to_list(),
                mode="markers",
                marker={"color": SIM, "size": 5, "opacity": 0.7},
                name="request",
                showlegend=col == 1,
                text=data.pairs["request_id"].to_list(),
                hovertemplate="%{text}: real %{x:.3g} s, twin %{y:.3g} s<extra></extra>",
                meta={"metric": metric},
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text=f"real {NAMES[metric]} (s)", row=1, col=col)
        fig.update_yaxes(title_text=f"twin {NAMES[metric]} (s)", row=1, col=col)
    return style(fig, SCATTER_TITLE, data.run_id, note=_note(data))
