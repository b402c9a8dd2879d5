"""Eviction timeline: zero-count vs referenced blocks and the reuse they cost (paper 000 §5.3).

Branch-aware eviction evicts host blocks in ascending (1[R_b > 0], T_b): blocks no active
branch references (count 0 on that node) first, LRU within each group. Each `evictions` row
carries the block's count at eviction. Per tier and time bin the figure stacks the evicted
blocks with count 0 and with count > 0, and draws how many of them the node needed again.

"Needed again" (the recompute an eviction caused) is defined as: a later `kv_events` row
'stored' of the same block_hash on the same node and tier (the first one after the
eviction, found by an ASOF join). For the host tier — the node's last copy, since GPU KV
stays within host KV — that block was prefilled again or fetched from a peer; for the GPU
tier it was reloaded (restored from host, fetched or recomputed). Evictions near the run's
end are right-censored: their re-use would fall after the run. Without kv_events (compact
telemetry) only the eviction counts are drawn.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import Run, Source, no_data, open_run, style, switch_lines, time_bin_width

TITLE = "KV eviction timeline"
COLORS = {"zero": "#9ecae1", "referenced": "#d62728", "again": "#000000"}


def eviction_stats(run: Run, width: float) -> tuple[pl.DataFrame, bool]:
    """Per tier, time bin and referenced flag: evicted blocks, re-stored ones, mean gap (s).

    The flag says whether kv_events were logged (otherwise n_again is 0 by construction).
    """
    has_kv = run.count("kv_events", "kind = 'stored'") > 0
    stats = run.df(
        """
        WITH e AS (
            SELECT t, node_id, tier, block_hash, branch_count > 0 AS referenced
            FROM evictions WHERE run_id = ?
        ), s AS (
            SELECT t, node_id, tier, block_hash FROM kv_events WHERE run_id = ? AND kind = 'stored'
        ), j AS (
            SELECT e.*, s.t AS t_again FROM e ASOF LEFT JOIN s
              ON e.node_id = s.node_id AND e.tier = s.tier AND e.block_hash = s.block_hash
             AND s.t > e.t
        )
        SELECT tier, floor(t / ?) * ? AS t_bin, referenced, count(*) AS n,
               count(t_again) AS n_again, avg(t_again - t) AS gap_s
        FROM j GROUP BY ALL ORDER BY tier, t_bin, referenced
        """,
        [run.run_id, run.run_id, width, width],
    )
    return stats, has_kv


def eviction_timeline(db: Source, run_id: str | None = None, *, bins: int = 60) -> go.Figure:
    """Evicted blocks per time bin (count 0 vs > 0) per tier, and those needed again later."""
    with open_run(db, run_id) as run:
        if run.count("evictions") == 0:
            return no_data(TITLE, run, f"no evictions logged in run {run.run_id}")
        width = time_bin_width(run.t_end(), bins)
        stats, has_kv = eviction_stats(run, width)
        lines = switch_lines(run)
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
    return style(fig, TITLE, run, note, height=250 + 230 * len(tiers))


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
