"""The house look of every figure pdlab shows (SPEC §7 figures): template, colors, titles,
empty figures and panels, percent axes.

`TEMPLATE` ("pdlab", registered with plotly.io) is plotly_white with the node palette as
its colorway, one font and hover labels that keep long request lists readable; `style`
applies it with a title (and the run id) to the library's figures, `house` to any other
figure a user sees (notebooks, the dashboard) from its title and axis titles.

A figure function of `toolkit.plots` runs one query function of `toolkit.queries` (DuckDB
in, polars and plain values out) and one drawing function (that data in, a plotly `Figure`
out). The drawing functions share what is here: node and phase colors, `style` (title with
the run id and a note), `no_data` (a figure that only says why there is nothing to draw),
`panel_message` (the same for one panel of a figure with several) and `percent_axis` (a
fraction axis zoomed to the data with tick labels that never repeat).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

# Plotly's and D3's qualitative palettes: 20 distinguishable node colors, then they repeat.
NODE_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#e6550d",
    "#31a354",
    "#843c39",
    "#7b4173",
    "#636363",
    "#bd9e39",
    "#3182bd",
    "#de9ed6",
    "#74c476",
)
PHASE_COLORS = {
    "prefill": "#1f77b4",
    "decode": "#ff7f0e",
    "collocated": "#2ca02c",
    "switching": "#d62728",
    "unknown": "#bbbbbb",
}


PANEL_MESSAGE = "panel-message"  # the `name` of a panel_message annotation
FONT = "Inter, 'Helvetica Neue', Arial, 'DejaVu Sans', sans-serif"


def _template() -> go.layout.Template:
    t = go.layout.Template(pio.templates["plotly_white"])
    t.layout.colorway = NODE_COLORS
    t.layout.font = {"family": FONT, "size": 12, "color": "#222"}
    t.layout.title = {"font": {"size": 16}, "x": 0.01, "xanchor": "left"}
    t.layout.hoverlabel = {"align": "left", "font": {"family": FONT, "size": 11}}
    t.layout.legend = {"tracegroupgap": 2, "font": {"size": 11}}
    return t


TEMPLATE = "pdlab"
pio.templates[TEMPLATE] = _template()


def node_color(node_id: int) -> str:
    return NODE_COLORS[int(node_id) % len(NODE_COLORS)]


def title_text(title: str, run_id: str | None, note: str | None = None) -> str:
    sub = " · ".join(x for x in (f"run {run_id}" if run_id else None, note) if x)
    return f"{title}<br><sup>{sub}</sup>" if sub else title


def house(
    fig: go.Figure,
    title: str,
    *,
    x: str | None = None,
    y: str | None = None,
    note: str | None = None,
    height: int | None = None,
    legend: str | None = None,
) -> go.Figure:
    """The house look for a figure built outside the library (a notebook's, the
    dashboard's): the template, a title with an optional note, axis titles with their units
    (`x`, `y`: "what (unit)"), the legend's title (`legend`, or none)."""
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title_text(title, None, note)},
        legend_title_text=legend or "",
        meta={"pdlab_title": title},
    )
    if height is not None:
        fig.update_layout(height=height)
    if x is not None:
        fig.update_xaxes(title_text=x)
    if y is not None:
        fig.update_yaxes(title_text=y)
    return fig


def style(
    fig: go.Figure, title: str, run_id: str, note: str | None = None, height: int = 480
) -> go.Figure:
    """The house look: the template, title with the run id, legend on the right."""
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title_text(title, run_id, note), "x": 0.01, "xanchor": "left"},
        height=height,
        margin={"l": 70, "r": 30, "t": 90, "b": 60},
        legend={"tracegroupgap": 2},
        meta={"pdlab_title": title, "run_id": run_id},
    )
    return fig


def no_data(title: str, run_id: str | None, message: str, height: int = 360) -> go.Figure:
    """A figure whose only content is `message` (no rows to plot); never an exception."""
    fig = go.Figure()
    fig.add_annotation(
        text=message,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font={"size": 15, "color": "#555"},
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    sub = f"<br><sup>run {run_id}</sup>" if run_id is not None else ""
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title + sub, "x": 0.01, "xanchor": "left"},
        height=height,
        meta={"pdlab_title": title, "run_id": run_id, "empty": message},
    )
    return fig


def is_empty(fig: go.Figure) -> bool:
    """True for a `no_data` figure."""
    meta = fig.layout.meta
    return isinstance(meta, dict) and "empty" in meta


def panel_message(fig: go.Figure, row: int, col: int, message: str) -> None:
    """Say in the middle of one subplot why it has nothing drawn (e.g. a column not logged).

    Placed in paper coordinates at the centre of the subplot's domain: plotly.js does not
    draw the axes of a subplot without traces, so axis-relative positions would drift."""
    sub = fig.get_subplot(row, col)
    fig.add_annotation(
        text=message,
        x=sum(sub.xaxis.domain) / 2,
        y=sum(sub.yaxis.domain) / 2,
        xref="paper",
        yref="paper",
        showarrow=False,
        font={"size": 12, "color": "#777"},
        name=PANEL_MESSAGE,
    )


def percent_axis(
    values: Iterable[float | None], *, zero: bool = False, headroom: float = 0.0, ticks: int = 5
) -> dict[str, Any]:
    """Axis settings (`update_yaxes(**...)`) for fractions shown as percents.

    The range hugs the data (a 0.1% difference is not drawn on a 0–100% axis) unless `zero`
    (bars) or the data lie closer to 0 than their spread; it stays within [0, 1] plus
    `headroom` (a share of the range added on top, for labels). Ticks are a round step
    (1, 2, 5 x 10^k) with as many decimals as the step needs, so no two labels repeat."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    pad = max(0.1 * (hi - lo), 5e-4)
    lo_r, hi_r = max(lo - pad, 0.0), min(hi + pad, 1.0)
    if zero or lo_r <= hi - lo:
        lo_r = 0.0
    hi_r += headroom * (hi_r - lo_r)
    step = round_step((hi_r - lo_r) / ticks)
    decimals = max(0, -math.floor(math.log10(100 * step) + 1e-9))
    return {
        "range": [lo_r, hi_r],
        "tick0": 0.0,
        "dtick": step,
        "tickformat": f".{decimals}%",
    }


def round_step(raw: float) -> float:
    """The 1, 2, 5 x 10^k step nearest to `raw` (on a log scale)."""
    exp = math.floor(math.log10(raw))
    steps = [m * 10.0**exp for m in (1.0, 2.0, 5.0, 10.0)]
    return min(steps, key=lambda s: abs(math.log(s / raw)))
