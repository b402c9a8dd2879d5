"""Eviction timeline: zero-count vs referenced blocks and the reuse they cost (paper 000 §5.3).

Per tier and time bin the figure stacks the evicted blocks with count 0 (no active branch
referenced them on that node) and with count > 0, and draws how many of them the node
needed again (stored again later on the same node and tier; see `toolkit.queries.eviction`
for the definition and its right-censoring). Without kv_events (compact telemetry) only the
eviction counts are drawn, and the subtitle says so.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, style
from toolkit.queries.eviction import EvictionData, eviction_data
from toolkit.queries.run import Source, open_run

TITLE = "KV eviction timeline"
COLORS = {"zero": "#9ecae1", "referenced": "#d62728", "again": "#000000"}


def eviction_timeline(db: Source, run_id: str | None = None, *, bins: int = 60) -> go.Figure:
    """Evicted blocks per time bin (count 0 vs > 0) per tier, and those needed again later."""
    with open_run(db, run_id) as run:
        data = eviction_data(run, bins=bins)
    return draw_eviction(data)


def draw_eviction(data: EvictionData) -> go.Figure:
    """The figure of `eviction_timeline` from its data."""
    if data.missing:
        return no_data(TITLE, data.run_id, data.missing)
    stats, has_kv, width, lines = data.stats, data.has_kv_events, data.width_s, data.switch_times
    tiers = [t for t in ("gpu", "host") if t in stats["tier"].to_list()]
    tiers += sorted(set(stats["tier"].to_list()) - set(tiers))
    fig = make_subplots(
        rows=len(tiers),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.16 if len(tiers) > 1 else 0.1,
        subplot_titles=[_tier_title(stats, t, has_kv) for t in tiers],
    )
    for row, tier in enumerate(tiers, start=1):
        part = stats.filter(pl.col("tier") == tier)
        for referenced, name, color in (
            (False, "count 0 (no active branch)", COLORS["zero"]),
            (True, "count > 0 (referenced)", COLORS["referenced"]),
        ):
            p = part.filter(pl.col("referenced") == referenced)
            if p.is_empty():
                continue
            fig.add_trace(
                go.Bar(
                    x=(p["t_bin"] + width / 2).to_list(),
                    y=p["n"].to_list(),
                    width=width * 0.92,
                    marker={"color": color, "line": {"width": 0}},
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    meta={"tier": tier, "referenced": referenced},
                    customdata=list(
                        zip(p["n_again"], p["gap_s"].fill_null(float("nan")), strict=True)
                    ),
                    hovertemplate="t=%{x:.0f} s: %{y} blocks evicted"
                    "<br>%{customdata[0]} needed again "
                    "(after %{customdata[1]:.1f} s on average)<extra>"
                    + tier
                    + ", "
                    + name
                    + "</extra>",
                ),
                row=row,
                col=1,
            )
        if has_kv:
            again = part.group_by("t_bin").agg(pl.col("n_again").sum()).sort("t_bin")
            fig.add_trace(
                go.Scatter(
                    x=(again["t_bin"] + width / 2).to_list(),
                    y=again["n_again"].to_list(),
                    mode="lines+markers",
                    line={"color": COLORS["again"], "width": 1.5},
                    marker={"size": 4},
                    name="needed again later (re-stored on the node)",
                    legendgroup="again",
                    showlegend=row == 1,
                    meta={"tier": tier, "needed_again": True},
                    hovertemplate="t=%{x:.0f} s: %{y} of the evicted blocks stored again"
                    " later<extra>" + tier + "</extra>",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text=f"{tier} blocks evicted", row=row, col=1)
        for t in lines:
            fig.add_vline(x=t, line={"color": "#888", "width": 1, "dash": "dot"}, row=row, col=1)
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_xaxes(title_text="eviction time (s since run start)", row=len(tiers), col=1)
    note = f"bins of {width:g} s; dotted: phase switches done"
    if not has_kv:
        note += "; no kv_events logged (compact telemetry), so re-use after eviction is unknown"
    return style(fig, TITLE, data.run_id, note, height=250 + 230 * len(tiers))


def _tier_title(stats: pl.DataFrame, tier: str, has_kv: bool) -> str:
    part = stats.filter(pl.col("tier") == tier)
    tot: dict[Any, tuple[int, int]] = {}
    for ref in (False, True):
        p = part.filter(pl.col("referenced") == ref)
        tot[ref] = (int(p["n"].sum()), int(p["n_again"].sum()))
    n = tot[False][0] + tot[True][0]
    text = f"{tier}: {n:,} blocks evicted, {tot[False][0] / n:.0%} with count 0"
    if has_kv:
        parts = [
            f"{label} {a / m:.0%}"
            for label, (m, a) in (("count 0", tot[False]), ("count > 0", tot[True]))
            if m
        ]
        text += " · needed again: " + ", ".join(parts)
    return text
