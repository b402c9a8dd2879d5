"""The dashboard's plotly figures: PD split, latency and planner gains.

Each builder returns an empty `go.Figure` and each updater rewrites its traces in one
`batch_update`; the dashboard shows each through a `live_plot.LivePlot`. The gains plot
shows paper 000 Eq. 6: every candidate prefill count's mean gain with error bars of
2·std/√m (a candidate qualifies when its mean exceeds that bar).
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

PREFILL_COLOR = "#1f77b4"
DECODE_COLOR = "#ff7f0e"
_LAYOUT = {
    "height": 260,
    "width": 510,  # two side by side fit a notebook beside the file browser
    "margin": {"l": 50, "r": 10, "t": 36, "b": 36},
    "template": "plotly_white",
}


def split_figure() -> go.Figure:
    fig = go.Figure(layout={**_LAYOUT, "title": "PD split", "yaxis_title": "nodes"})
    for name, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        fig.add_scatter(x=[], y=[], name=name, mode="lines", line={"shape": "hv", "color": color})
    fig.update_xaxes(title_text="simulated time (s)")
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
    fig = go.Figure(layout={**_LAYOUT, "title": "latency (rolling)", "yaxis_title": "s"})
    for name in ("TTFT p50", "TTFT p95", "E2E p50"):
        fig.add_scatter(x=[], y=[], name=name, mode="lines")
    fig.update_xaxes(title_text="simulated time (s)")
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
            "title": "planner candidates: mean gain ± 2·std/√m",
            "yaxis_title": "Θ gain (req/s)",
            "showlegend": False,
        }
    )
    fig.add_bar(x=[], y=[], error_y={"type": "data", "array": []}, marker={"color": []})
    fig.update_xaxes(title_text="prefill nodes", dtick=1)
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
        fig.layout.title.text = "planner candidates: mean gain ± 2·std/√m" + (
            f" (window ending t={t:.0f} s)" if t is not None else " (no evaluation yet)"
        )
