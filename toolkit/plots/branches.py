"""Branch counts R_{b,n}: the block × node snapshot (paper 000 Fig. 4) and counts over time.

`branch_counts` logs every change of R_{b,n}, the number of active branches that reference
block b on node n (Alg. E.2). A (node, block) can change twice at one instant (a release
and a count); such rows are applied in logged order, which DuckDB's scans preserve
(`row_number() OVER ()` over the unsorted view), so the state at any time is the last row
at or before it.

`branch_count_tree` shows, like Fig. 4, the counts per node of a set of blocks at one time:
by default the most-shared blocks (largest Σ_n R_{b,n}); with `branch_id`, the blocks whose
counts rose when that branch was placed on a node (its router decisions and decode bindings
— shared instants with other requests can add their blocks too). Blocks are listed in the
order they were first counted, which follows the prefix (parents before children): sim
kv_events carry no parent hashes, so the tree is drawn as this ordered list. Cells show the
count; hover shows which tiers of the node held the block at that time (from kv_events).
`branch_counts_over_time` draws, per node, the blocks with a positive count and Σ counts.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import (
    Run,
    Source,
    no_data,
    open_run,
    style,
    switch_lines,
    time_bin_width,
)
from toolkit.plots.split import phase_segments

TREE_TITLE = "Branch counts per block and node (Fig. 4 view)"
TIME_TITLE = "Branch counts over time"
PHASE_LETTER = {"prefill": "P", "decode": "D", "collocated": "C", "switching": "S", "unknown": "?"}

# Every change with its delta, in logged order within (node, block).
_DELTAS = """
    WITH b AS (
        SELECT node_id, block_hash, t, count, row_number() OVER () AS rn
        FROM branch_counts WHERE run_id = ?
    )
    SELECT node_id, block_hash, t, count,
           count - lag(count, 1, 0) OVER w AS d_refs,
           (count > 0)::INTEGER - (lag(count, 1, 0) OVER w > 0)::INTEGER AS d_blocks
    FROM b WINDOW w AS (PARTITION BY node_id, block_hash ORDER BY t, rn)
"""


def counts_over_time(run: Run, width: float) -> pl.DataFrame:
    """Per node and time bin end: referenced blocks (count > 0) and Σ counts."""
    return run.df(
        f"""
        WITH c AS ({_DELTAS}),
        g AS (
            SELECT node_id, floor(t / ?)::BIGINT AS k,
                   sum(d_refs) AS d_refs, sum(d_blocks) AS d_blocks
            FROM c GROUP BY ALL
        )
        SELECT node_id, (k + 1) * ? AS t,
               sum(d_refs) OVER (PARTITION BY node_id ORDER BY k) AS refs,
               sum(d_blocks) OVER (PARTITION BY node_id ORDER BY k) AS blocks
        FROM g ORDER BY node_id, t
        """,
        [run.run_id, width, width],
    )


def _grid(df: pl.DataFrame, col: str) -> tuple[list[float], list[int], np.ndarray]:
    """(bin ends, node ids, values[node, bin]) with each node's value carried over bins
    in which it did not change (0 before its first change)."""
    wide = (
        df.pivot(on="node_id", index="t", values=col)
        .sort("t")
        .fill_null(strategy="forward")
        .fill_null(0)
    )
    nodes = sorted(int(c) for c in wide.columns if c != "t")
    values = np.array([wide[str(n)].to_numpy() for n in nodes], dtype=float)
    return wide["t"].to_list(), nodes, values


def branch_counts_over_time(db: Source, run_id: str | None = None, *, bins: int = 120) -> go.Figure:
    """Blocks referenced by active branches per node over time (heatmap) and cluster totals."""
    with open_run(db, run_id) as run:
        if run.count("branch_counts") == 0:
            return no_data(TIME_TITLE, run, f"no branch counts logged in run {run.run_id}")
        width = time_bin_width(run.t_end(), bins)
        df = counts_over_time(run, width)
        lines = switch_lines(run)
    t, nodes, blocks = _grid(df, "blocks")
    _, _, refs = _grid(df, "refs")
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
    return style(fig, TIME_TITLE, run, note, height=max(520, 300 + 18 * len(nodes)))


def _peak_time(run: Run) -> float | None:
    """The bin end with the most branch references cluster-wide (a busy, telling instant)."""
    width = time_bin_width(run.t_end(), 200)
    df = counts_over_time(run, width)
    if df.is_empty():
        return None
    t, _, refs = _grid(df, "refs")
    return float(t[int(np.argmax(refs.sum(axis=0)))])


def _most_shared(run: Run, t: float, limit: int) -> list[int]:
    """The `limit` blocks with the largest Σ_n R_{b,n} at time t (ties: on more nodes)."""
    rows = run.rows(
        """
        WITH b AS (
            SELECT node_id, block_hash, t, count, row_number() OVER () AS rn
            FROM branch_counts WHERE run_id = ? AND t <= ?
        ), s AS (
            SELECT node_id, block_hash, arg_max(count, [t, rn]) AS count FROM b GROUP BY ALL
        )
        SELECT block_hash, sum(count) AS total, count(*) FILTER (WHERE count > 0) AS nodes
        FROM s GROUP BY 1 HAVING total > 0
        ORDER BY total DESC, nodes DESC, block_hash LIMIT ?
        """,
        [run.run_id, t, limit],
    )
    return [int(r[0]) for r in rows]


def _state_at(run: Run, t: float, blocks: list[int]) -> pl.DataFrame:
    """R_{b,n} at time t (last logged value) of `blocks` on every node that counted them."""
    return run.df(
        """
        WITH b AS (
            SELECT node_id, block_hash, t, count, row_number() OVER () AS rn
            FROM branch_counts
            WHERE run_id = ? AND t <= ? AND block_hash IN (SELECT unnest(?::BIGINT[]))
        )
        SELECT node_id, block_hash, arg_max(count, [t, rn]) AS count, max(t) AS t_change
        FROM b GROUP BY ALL
        """,
        [run.run_id, t, blocks],
    )


def _branch_program(run: Run, branch_id: str, program_id: str | None) -> str | None:
    """The program of `branch_id` (branch ids repeat across programs, e.g. 'root')."""
    if program_id is not None:
        return program_id
    progs = [
        r[0]
        for r in run.rows(
            "SELECT DISTINCT program_id FROM requests WHERE run_id = ? AND branch_id = ? "
            "ORDER BY 1",
            [run.run_id, branch_id],
        )
    ]
    if len(progs) > 1:
        shown = ", ".join(progs[:5]) + (f" ... ({len(progs)} in all)" if len(progs) > 5 else "")
        raise ValueError(
            f"branch {branch_id!r} occurs in {len(progs)} programs of run {run.run_id}; "
            f"pass program_id, one of: {shown}"
        )
    return progs[0] if progs else None


def _branch_blocks(run: Run, program_id: str, branch_id: str) -> tuple[list[int], float | None]:
    """Blocks whose count rose at the placements of the branch (first counted first), and
    the time of its last such placement."""
    rows = run.rows(
        f"""
        WITH p AS (
            SELECT d.t, d.node_id FROM router_decisions d JOIN requests r USING (run_id, request_id)
            WHERE d.run_id = ? AND r.program_id = ? AND r.branch_id = ?
            UNION
            SELECT t_prefill_start, decode_node FROM requests
            WHERE run_id = ? AND program_id = ? AND branch_id = ?
              AND t_prefill_start IS NOT NULL AND decode_node IS NOT NULL
        ), c AS ({_DELTAS})
        SELECT c.block_hash, min(c.t) AS first_t, max(c.t) AS last_t
        FROM c JOIN p ON c.t = p.t AND c.node_id = p.node_id
        WHERE c.d_refs > 0 GROUP BY 1 ORDER BY first_t, 1
        """,
        [run.run_id, program_id, branch_id, run.run_id, program_id, branch_id, run.run_id],
    )
    return [int(r[0]) for r in rows], max((float(r[2]) for r in rows), default=None)


def _held(run: Run, t: float, blocks: list[int]) -> dict[tuple[int, int], str]:
    """Tiers holding each (node, block) at time t from kv_events (after the node's last clear)."""
    rows = run.rows(
        """
        WITH cl AS (
            SELECT node_id, max(t) AS t_clear FROM kv_events
            WHERE run_id = ? AND kind = 'cleared' AND t <= ? GROUP BY 1
        ), last AS (
            SELECT node_id, block_hash, tier, arg_max(kind, t) AS kind, max(t) AS t_last
            FROM kv_events
            WHERE run_id = ? AND t <= ? AND kind <> 'cleared'
              AND block_hash IN (SELECT unnest(?::BIGINT[]))
            GROUP BY ALL
        )
        SELECT l.node_id, l.block_hash, string_agg(l.tier, '+' ORDER BY l.tier) FROM last l
        LEFT JOIN cl USING (node_id)
        WHERE l.kind = 'stored' AND (cl.t_clear IS NULL OR l.t_last > cl.t_clear)
        GROUP BY ALL
        """,
        [run.run_id, t, run.run_id, t, blocks],
    )
    return {(int(n), int(b)): str(tiers) for n, b, tiers in rows}


def _first_counted(run: Run, blocks: list[int]) -> dict[int, float]:
    rows = run.rows(
        "SELECT block_hash, min(t) FROM branch_counts WHERE run_id = ? "
        "AND block_hash IN (SELECT unnest(?::BIGINT[])) GROUP BY 1",
        [run.run_id, blocks],
    )
    return {int(b): float(t) for b, t in rows}


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
    if max_blocks < 1:
        raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
    with open_run(db, run_id) as run:
        if run.count("branch_counts") == 0:
            return no_data(TREE_TITLE, run, f"no branch counts logged in run {run.run_id}")
        program: str | None = None
        if branch_id is not None:
            program = _branch_program(run, branch_id, program_id)
            blocks, last_placed = (
                ([], None) if program is None else _branch_blocks(run, program, branch_id)
            )
            if not blocks:
                return no_data(
                    TREE_TITLE,
                    run,
                    f"no counted blocks found for branch {branch_id!r}"
                    + (f" of program {program!r}" if program else "")
                    + f" in run {run.run_id}",
                )
            if t is None:
                t = last_placed if last_placed is not None else run.t_end()
            blocks = blocks[:max_blocks]
        else:
            if t is None:
                t = _peak_time(run)
            t = float(t or 0.0)
            blocks = _most_shared(run, t, max_blocks)
            if not blocks:
                return no_data(
                    TREE_TITLE,
                    run,
                    f"no block has a positive count at t = {t:.1f} s in run {run.run_id}",
                )
        state = _state_at(run, t, blocks)
        first = _first_counted(run, blocks)
        held = _held(run, t, blocks)
        timeline = phase_segments(run)
        node_ids = sorted(int(n) for n in run.nodes()["node_id"].to_list()) or sorted(
            set(state["node_id"].to_list())
        )
    blocks = sorted(blocks, key=lambda b: (first.get(b, float("inf")), b))
    phase = {s.node_id: s.phase for s in timeline.segments if s.t0 <= t < s.t1}
    if t >= timeline.t_end:
        phase = dict(timeline.final)
    cols = [f"{PHASE_LETTER.get(phase.get(n, 'unknown'), '?')}{n}" for n in node_ids]
    counts = {
        (int(r["node_id"]), int(r["block_hash"])): int(r["count"])
        for r in state.iter_rows(named=True)
    }
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
    return style(fig, TREE_TITLE, run, note, height=min(260 + 22 * len(blocks), 1100))
