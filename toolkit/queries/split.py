"""Each node's phase over time, rebuilt from the logs (paper 000 §4.1–4.2, §5.3).

Each node's phase is rebuilt from `phase_switches` (decision and completion times, from and
to phase): before a switch the node serves its `from_phase`, between decision and completion
it is switching (draining, or out of service for a relaunch), after it its `to_phase`. A node
that never switched serves its initial phase, taken from the run's config (`split` 'XPYD':
the first X node ids prefill, as the simulator assigns them; the gain planner's warmup runs
collocated) or, for logs without a config, from which iteration tables hold its rows.
`split_counts` counts the nodes per phase from every change time on (the split).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import polars as pl

from toolkit.queries.run import Run

PHASE_ORDER = ("prefill", "decode", "collocated", "switching", "unknown")


class Segment(NamedTuple):
    node_id: int
    t0: float
    t1: float
    phase: str


class Timeline(NamedTuple):
    segments: list[Segment]  # every node's phase intervals over [0, t_end]
    switches: pl.DataFrame  # the run's phase_switches rows, by decision time
    final: dict[int, str]  # each node's phase at t_end, after every switch done by then
    t_end: float


class SplitData(NamedTuple):
    """What the PD split figure draws; `missing` says why there is nothing (else None)."""

    run_id: str
    timeline: Timeline
    counts: pl.DataFrame  # split_counts(timeline)
    labels: dict[int, str]  # node id -> its name in `nodes`
    missing: str | None


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


def split_data(run: Run) -> SplitData:
    """The phase timeline, the split over time and the node names of the run."""
    timeline = phase_segments(run)
    labels = {
        int(r["node_id"]): str(r["name"] or f"node {r['node_id']}")
        for r in run.nodes().iter_rows(named=True)
    }
    missing = None
    if not timeline.segments and not timeline.final:
        missing = f"no nodes or phase switches logged in run {run.run_id}"
    return SplitData(run.run_id, timeline, split_counts(timeline), labels, missing)
