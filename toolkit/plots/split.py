"""PD split over time with phase-switch markers (paper 000 §4.1–4.2, §5.3; SPEC §5 metrics).

Each node's phase is rebuilt from `phase_switches` (decision and completion times, from and
to phase): before a switch the node serves its `from_phase`, between decision and completion
it is switching (draining, or out of service for a relaunch), after it its `to_phase`. A node
that never switched serves its initial phase, taken from the run's config (`split` 'XPYD':
the first X node ids prefill, as the simulator assigns them; the gain planner's warmup runs
collocated) or, for logs without a config, from which iteration tables hold its rows. The
top panel counts nodes per phase (the split), the bottom one draws each node's phases.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import PHASE_COLORS, Run, Source, no_data, open_run, style

TITLE = "PD split over time"
PHASE_ORDER = ("prefill", "decode", "collocated", "switching", "unknown")


class Segment(NamedTuple):
    node_id: int
    t0: float
    t1: float
    phase: str


def _initial_phases(run: Run, node_ids: list[int]) -> tuple[dict[int, str], float]:
    """(phase per node at the start of disaggregation, end of the collocated warmup)."""
    cfg = run.config()
    split = str(cfg.get("split") or "")
    warmup = run.warmup_s()
    if split == "collocated":
        return dict.fromkeys(node_ids, "collocated"), 0.0
    s = split.upper()
    if s.endswith("D") and "P" in s:
        p_str, _, d_str = s[:-1].partition("P")
        if p_str.isdigit() and d_str.isdigit() and int(p_str) + int(d_str) == len(node_ids):
            phases = {
                n: ("prefill" if i < int(p_str) else "decode") for i, n in enumerate(node_ids)
            }
            gain_warmup = cfg.get("planner") == "gain" and warmup > 0
            return phases, (warmup if gain_warmup else 0.0)
    # No usable config: a node's phase is what it logged (both tables: collocated).
    rows = run.rows(
        """
        SELECT n.node_id,
               EXISTS (SELECT 1 FROM prefill_iterations p
                       WHERE p.run_id = ? AND p.node_id = n.node_id),
               EXISTS (SELECT 1 FROM decode_iterations d
                       WHERE d.run_id = ? AND d.node_id = n.node_id)
        FROM (SELECT unnest(?::INTEGER[]) AS node_id) n
        """,
        [run.run_id, run.run_id, node_ids],
    )
    phases = {}
    for n, has_p, has_d in rows:
        phases[int(n)] = (
            "collocated"
            if has_p and has_d
            else "prefill"
            if has_p
            else "decode"
            if has_d
            else "unknown"
        )
    return phases, 0.0


class Timeline(NamedTuple):
    segments: list[Segment]  # every node's phase intervals over [0, t_end]
    switches: pl.DataFrame  # the run's phase_switches rows, by decision time
    final: dict[int, str]  # each node's phase at t_end, after every switch done by then
    t_end: float


def phase_segments(run: Run) -> Timeline:
    """Rebuild every node's phases from the run's config and phase_switches."""
    switches = run.df(
        "SELECT node_id, t_decided, t_done, from_phase, to_phase, trigger, drained "
        "FROM phase_switches WHERE run_id = ? ORDER BY t_decided, node_id",
        [run.run_id],
    )
    node_ids = sorted(set(run.nodes()["node_id"].to_list()) | set(switches["node_id"].to_list()))
    last_switch = float(switches["t_decided"].to_numpy().max()) if switches.height else 0.0
    t_end = max(run.t_end(), last_switch)
    initial, warmup_end = _initial_phases(run, node_ids)
    segs: list[Segment] = []
    final: dict[int, str] = {}
    for n in node_ids:
        t = 0.0
        if warmup_end > 0:
            segs.append(Segment(n, 0.0, warmup_end, "collocated"))
            t = warmup_end
        phase = initial.get(n, "unknown")
        for sw in switches.filter(pl.col("node_id") == n).iter_rows(named=True):
            t_dec = float(sw["t_decided"])
            done = sw["t_done"] is not None
            t_done = float(sw["t_done"]) if done else t_end
            # The log is the truth about what the node served before it switched.
            if t_dec > t:
                segs.append(Segment(n, t, t_dec, sw["from_phase"]))
            if t_done > t_dec:
                segs.append(Segment(n, t_dec, t_done, "switching"))
            t, phase = max(t, t_done), (sw["to_phase"] if done else "switching")
        if t_end > t:
            segs.append(Segment(n, t, t_end, phase))
        final[n] = phase
    return Timeline(segs, switches, final, t_end)


def split_counts(timeline: Timeline) -> pl.DataFrame:
    """Nodes per phase from every change time on: columns t and one per phase present.

    A sweep over segment starts (+1) and ends (−1); the last row, at the run's end, holds
    the final phases (a switch completing exactly at the end counts).
    """
    segs = timeline.segments
    phases = [
        p for p in PHASE_ORDER if any(s.phase == p for s in segs) or p in timeline.final.values()
    ]
    deltas: dict[float, dict[str, int]] = {}
    for s in segs:
        deltas.setdefault(s.t0, dict.fromkeys(phases, 0))[s.phase] += 1
        deltas.setdefault(s.t1, dict.fromkeys(phases, 0))[s.phase] -= 1
    state = dict.fromkeys(phases, 0)
    rows: list[dict[str, Any]] = []
    times = sorted(deltas)
    for t in times[:-1]:
        for p, d in deltas[t].items():
            state[p] += d
        rows.append({"t": t, **state})
    end = {"t": max(timeline.t_end, times[-1] if times else 0.0), **dict.fromkeys(phases, 0)}
    for p in timeline.final.values():
        end[p] += 1
    rows.append(end)
    return pl.DataFrame(rows)


def pd_split(db: Source, run_id: str | None = None) -> go.Figure:
    """Nodes per phase over time (step lines, switch markers) and each node's phase bands."""
    with open_run(db, run_id) as run:
        timeline = phase_segments(run)
        segs, switches = timeline.segments, timeline.switches
        if not segs and not timeline.final:
            return no_data(TITLE, run, f"no nodes or phase switches logged in run {run.run_id}")
        labels = {
            int(r["node_id"]): str(r["name"] or f"node {r['node_id']}")
            for r in run.nodes().iter_rows(named=True)
        }
    counts = split_counts(timeline)
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
    return style(fig, TITLE, run, note, height=min(height, 900))


def _count_at(counts: pl.DataFrame, col: str, t: float) -> int:
    before = counts.filter(pl.col("t") <= t)
    return int(before[col][-1]) if before.height else 0
