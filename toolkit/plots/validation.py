"""Real vs twin vs peer series of one validated run (`pdlab validate`, notebook 07).

`validation_series(table, run)` draws what `toolkit.validate.run.validate_runs` computed for a
run (`ValidationTable.series[run]`: t, metric, node_id, source, value): one panel per
metric and instance (generation throughput per tick; GPU memory in use and prefix hit %
per instance; the shared CPU pool's), the real run solid, the twin dashed, each peer
dotted. The data is computed apart from the drawing (`draw_validation_series` takes the
frame), so it is testable without a browser.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, style

TITLE = "Validation: real vs twin vs peers"
LABELS = {
    "throughput_tok_s": "generation throughput (tokens/s)",
    "gpu_mem_mb": "GPU memory in use (MiB)",
    "prefix_hit_pct": "prefix hit (%)",
    "cpu_mem_mb": "CPU pool (MiB)",
    "cpu_prefix_hit_pct": "CPU pool hit (%)",
}
LINES = {"real": ("#1f77b4", "solid"), "twin": ("#ff7f0e", "dash")}
PEER_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def validation_series(table: object, run: str) -> go.Figure:
    """The figure of one run of a ValidationTable (module docstring)."""
    series = getattr(table, "series", {})
    return draw_validation_series(series.get(run, pl.DataFrame()), run)


def _panels(frame: pl.DataFrame) -> list[tuple[str, int | None]]:
    keys = frame.select("metric", "node_id").unique().to_dicts()
    order = {m: i for i, m in enumerate(LABELS)}
    keys.sort(
        key=lambda k: (order.get(k["metric"], 99), -1 if k["node_id"] is None else k["node_id"])
    )
    return [(k["metric"], k["node_id"]) for k in keys]


def draw_validation_series(frame: pl.DataFrame, run: str) -> go.Figure:
    if frame.height == 0:
        return no_data(TITLE, run, "no series to compare (the run has no reference series)")
    panels = _panels(frame)
    titles = [
        LABELS.get(m, m) + ("" if node is None else f" · instance {node}") for m, node in panels
    ]
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=titles, shared_xaxes=True)
    peers = [s for s in frame["source"].unique().sort().to_list() if s not in LINES]
    shown: set[str] = set()
    for row, (metric, node) in enumerate(panels, start=1):
        sel = frame.filter(pl.col("metric") == metric)
        sel = sel.filter(pl.col("node_id").is_null() if node is None else pl.col("node_id") == node)
        for src in ("real", "twin", *peers):
            s = sel.filter(pl.col("source") == src).sort("t")
            if s.height == 0:
                continue
            if src in LINES:
                color, dash = LINES[src]
            else:
                color, dash = PEER_COLORS[peers.index(src) % len(PEER_COLORS)], "dot"
            fig.add_trace(
                go.Scatter(
                    x=s["t"].to_list(),
                    y=s["value"].to_list(),
                    mode="lines",
                    line={"color": color, "dash": dash, "width": 2 if src == "real" else 1.6},
                    name=src,
                    legendgroup=src,
                    showlegend=src not in shown,
                    meta={"metric": metric, "node_id": node, "source": src},
                ),
                row=row,
                col=1,
            )
            shown.add(src)
        fig.update_yaxes(
            title_text=LABELS.get(metric, metric).split(" (")[-1].rstrip(")"), row=row, col=1
        )
    fig.update_xaxes(title_text="time since the first arrival (s)", row=len(panels), col=1)
    return style(
        fig,
        TITLE,
        run,
        note="solid: real · dashed: twin · dotted: peers",
        height=260 * len(panels) + 120,
    )
