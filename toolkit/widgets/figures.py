"""The dashboard's plotly figures: PD split, latency and planner gains.

Each builder returns an empty `go.Figure` in the house template (`toolkit.plots.common`)
and each updater rewrites its traces in one `batch_update`; the dashboard shows each
through a `live_plot.LivePlot`. Time axes say which clock they show (`time_axis`: the
simulator's, or wall time for real engines). The gains plot shows paper 000 Eq. 6: every
candidate prefill count's mean gain with error bars of 2·std/√m (a candidate qualifies when
its mean exceeds that bar).
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from toolkit.plots.common import TEMPLATE, title_text

PREFILL_COLOR = "#1f77b4"
DECODE_COLOR = "#ff7f0e"
_LAYOUT = {
    "height": 270,
    "width": 510,  # two side by side fit a notebook beside the file browser
    "margin": {"l": 56, "r": 10, "t": 58, "b": 40},
    "template": TEMPLATE,
}
SIMULATED = "simulated time (s)"
WALL = "wall time since the run started (s)"
GAINS_TITLE = "Planner candidates (Eq. 6)"


def time_axis(fig: go.Figure, simulated: bool) -> None:
    """Name the x axis after the clock the cluster runs on."""
    fig.update_xaxes(title_text=SIMULATED if simulated else WALL)


def split_figure() -> go.Figure:
    fig = go.Figure(layout={**_LAYOUT, "title": {"text": "PD split over time"}})
    for name, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        fig.add_scatter(
            x=[], y=[], name=f"{name} nodes", mode="lines", line={"shape": "hv", "color": color}
        )
    fig.update_yaxes(title_text="nodes", dtick=1, tick0=0, rangemode="tozero", tickformat="d")
    time_axis(fig, simulated=True)
    return fig


def update_split(fig: go.Figure, split: list[dict[str, Any]], now: float) -> None:
    if not split:
        return
    t = [s["t"] for s in split] + [now]
    p = [s["prefill"] for s in split] + [split[-1]["prefill"]]
    d = [s["decode"] for s in split] + [split[-1]["decode"]]
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = t, p
        fig.data[1].x, fig.data[1].y = t, d


def latency_figure() -> go.Figure:
    title = title_text("Latency of recent requests", None, "over the server's rolling window")
    fig = go.Figure(layout={**_LAYOUT, "title": {"text": title}})
    for name in ("median TTFT", "P95 TTFT", "median E2E"):
        fig.add_scatter(x=[], y=[], name=name, mode="lines")
    fig.update_yaxes(title_text="latency (s)", rangemode="tozero")
    time_axis(fig, simulated=True)
    return fig


def update_latency(fig: go.Figure, samples: dict[str, list[Any]]) -> None:
    t = samples.get("t", [])
    with fig.batch_update():
        for trace, key in zip(fig.data, ("ttft_p50_s", "ttft_p95_s", "e2e_p50_s"), strict=True):
            trace.x, trace.y = t, samples.get(key, [])


def gains_figure() -> go.Figure:
    fig = go.Figure(
        layout={
            **_LAYOUT,
            "title": {"text": title_text(GAINS_TITLE, None, "no evaluation yet")},
            "yaxis_title": "gain Θ (requests/s)",
            "showlegend": False,
        }
    )
    fig.add_bar(x=[], y=[], error_y={"type": "data", "array": []}, marker={"color": []})
    fig.update_xaxes(title_text="prefill nodes of the candidate split", dtick=1, tickformat="d")
    return fig


def update_gains(fig: go.Figure, decision: dict[str, Any] | None) -> None:
    cands = (decision or {}).get("candidates") or []
    x = [c["prefill_count"] for c in cands]
    y = [c["mean_gain"] if c["mean_gain"] is not None else 0.0 for c in cands]
    err = [
        2.0 * (c["std_gain"] or 0.0) / math.sqrt(c["slices"]) if c["slices"] else 0.0 for c in cands
    ]
    chosen = (decision or {}).get("chosen_prefill")
    colors = [
        "#2ca02c" if c["prefill_count"] == chosen else ("#98df8a" if c["qualified"] else "#bbbbbb")
        for c in cands
    ]
    with fig.batch_update():
        bar = fig.data[0]
        bar.x, bar.y = x, y
        bar.error_y.array = err
        bar.marker.color = colors
        t = (decision or {}).get("t")
        sub = "mean gain ± 2·std/√m per candidate" + (
            f", window ending t={t:.0f} s" if t is not None else ": no evaluation yet"
        )
        fig.layout.title.text = title_text(GAINS_TITLE, None, sub)
