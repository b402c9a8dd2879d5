"""Branch counts R_{b,n}: the block × node snapshot (paper 000 Fig. 4) and counts over time.

`branch_count_tree` shows, like Fig. 4, the counts per node of a set of blocks at one time
(the most-shared blocks, or those of one branch; `toolkit.queries.branches` chooses them).
Blocks are listed in the order they were first counted, which follows the prefix (parents
before children): sim kv_events carry no parent hashes, so the tree is drawn as this ordered
list. Cells show the count; hover shows which tiers of the node held the block at that time.
`branch_counts_over_time` draws, per node, the blocks with a positive count, and the cluster's
totals of those blocks and of Σ counts.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from toolkit.plots.common import no_data, style
from toolkit.queries.branches import CountsData, TreeData, count_tree_data, counts_data
from toolkit.queries.run import Source, open_run

TREE_TITLE = "Branch counts per block and node (Fig. 4 view)"
TIME_TITLE = "Branch counts over time"
PHASE_LETTER = {"prefill": "P", "decode": "D", "collocated": "C", "switching": "S", "unknown": "?"}


def branch_counts_over_time(db: Source, run_id: str | None = None, *, bins: int = 120) -> go.Figure:
    """Blocks referenced by active branches per node over time (heatmap) and cluster totals."""
    with open_run(db, run_id) as run:
        data = counts_data(run, bins=bins)
    return draw_counts(data)


def draw_counts(data: CountsData) -> go.Figure:
    """The figure of `branch_counts_over_time` from its data."""
    if data.missing:
        return no_data(TIME_TITLE, data.run_id, data.missing)
    t, nodes, blocks, refs = data.t, data.nodes, data.blocks, data.refs
    width, lines = data.width_s, data.switch_times
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        row_heights=[0.55, 0.45],
        subplot_titles=("blocks with count > 0, per node", "cluster totals"),
    )
    fig.add_trace(
        go.Heatmap(
            x=t,
            y=[f"node {n}" for n in nodes],
            z=blocks,
            colorscale="Blues",
            zmin=0,
            colorbar={"title": {"text": "blocks"}, "len": 0.5, "y": 0.78},
            name="blocks with count > 0",
            meta={"series": "blocks", "nodes": nodes},
            hovertemplate="%{y}, t ≤ %{x:.0f} s: %{z:,.0f} blocks with count > 0<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for series, values, color, dash in (
        ("blocks with count > 0", blocks, "#08519c", "solid"),
        ("Σ counts R_{b,n}", refs, "#e6550d", "dash"),
    ):
        fig.add_trace(
            go.Scatter(
                x=t,
                y=values.sum(axis=0).tolist(),
                mode="lines",
                line={"color": color, "width": 2, "shape": "hv", "dash": dash},
                name=series,
                meta={"series": series},
                hovertemplate="t ≤ %{x:.0f} s: %{y:,.0f}<extra>" + series + "</extra>",
            ),
            row=2,
            col=1,
        )
    for x in lines:
        fig.add_vline(x=x, line={"color": "#d62728", "width": 1, "dash": "dot"}, row=2, col=1)
    fig.update_yaxes(title_text="node", autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="blocks / references", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="time since run start (s; state at each bin's end)", row=2, col=1)
    fig.update_layout(legend={"y": 0.3, "yanchor": "middle"})
    note = f"{width:g} s bins; dotted: phase switches done"
    return style(fig, TIME_TITLE, data.run_id, note, height=max(520, 300 + 18 * len(nodes)))


def branch_count_tree(
    db: Source,
    run_id: str | None = None,
    *,
    t: float | None = None,
    branch_id: str | None = None,
    program_id: str | None = None,
    max_blocks: int = 30,
) -> go.Figure:
    """Fig. 4-style snapshot: counts R_{b,n} of selected blocks (rows) on each node (columns).

    `t` defaults to the instant with the most branch references cluster-wide (or, with
    `branch_id`, the branch's last placement); `program_id` names the branch's program
    (needed when the branch id occurs in several); `max_blocks` caps the rows.
    """
    with open_run(db, run_id) as run:
        data = count_tree_data(
            run, t=t, branch_id=branch_id, program_id=program_id, max_blocks=max_blocks
        )
    return draw_count_tree(data)


def draw_count_tree(data: TreeData) -> go.Figure:
    """The figure of `branch_count_tree` from its data."""
    if data.missing:
        return no_data(TREE_TITLE, data.run_id, data.missing)
    t, blocks, node_ids, phase = data.t, data.blocks, data.nodes, data.phase
    counts, held, branch_id, program = data.counts, data.held, data.branch_id, data.program_id
    cols = [f"{PHASE_LETTER.get(phase.get(n, 'unknown'), '?')}{n}" for n in node_ids]
    z = np.full((len(blocks), len(node_ids)), np.nan)
    text = [["" for _ in node_ids] for _ in blocks]
    hover = [["" for _ in node_ids] for _ in blocks]
    for i, b in enumerate(blocks):
        for j, n in enumerate(node_ids):
            tiers = held.get((n, b), "not held")
            c = counts.get((n, b))
            if c is not None:
                z[i, j] = c
                text[i][j] = str(c)
            hover[i][j] = (
                f"block {b}<br>node {n} ({phase.get(n, 'unknown')})<br>"
                f"R = {c if c is not None else '—'}<br>tiers: {tiers}"
            )
    rows = [f"{i + 1:>2}. …{b & 0xFFFFFF:06x}" for i, b in enumerate(blocks)]
    zmax = max(float(np.nanmax(z)) if np.isfinite(z).any() else 1.0, 1.0)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=cols,
            y=rows,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 11},
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale=[[0, "#f7fbff"], [0.2, "#c6dbef"], [1, "#08519c"]],
            zmin=0,
            zmax=zmax,
            xgap=2,
            ygap=2,
            colorbar={"title": {"text": "R_{b,n}"}, "dtick": max(1, round(zmax / 6))},
            meta={"t": t, "blocks": blocks, "nodes": node_ids},
        )
    )
    fig.update_xaxes(title_text="node at t (P prefill, D decode, C collocated, S switching)")
    fig.update_yaxes(title_text="block (first counted first; …hash)", autorange="reversed")
    fig.update_layout(plot_bgcolor="#eeeeee")
    what = (
        f"{len(blocks)} blocks of branch {program}/{branch_id}"
        if branch_id is not None
        else f"{len(blocks)} most-shared blocks"
    )
    note = f"{what} at t = {t:.1f} s; blank: no count logged on that node; hover: tiers holding it"
    return style(fig, TREE_TITLE, data.run_id, note, height=min(260 + 22 * len(blocks), 1100))
