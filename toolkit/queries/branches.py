"""Branch counts R_{b,n} of a run: per node over time, and the counts of chosen blocks at one
instant (paper 000 Fig. 4; Alg. E.2).

`branch_counts` logs every change of R_{b,n}, the number of active branches that reference
block b on node n. A (node, block) can change twice at one instant (a release and a count);
such rows are applied in logged order, which DuckDB's scans preserve (`row_number() OVER ()`
over the unsorted view), so the state at any time is the last row at or before it.

`counts_data` gives, per node and time bin, the blocks with a positive count and Σ counts.
`count_tree_data` gives the counts of a set of blocks on every node at one time: by default
the most-shared blocks (largest Σ_n R_{b,n}) at the busiest instant; with `branch_id`, the
blocks whose counts rose when that branch was placed on a node (its router decisions and
decode bindings — shared instants with other requests can add their blocks too), at its
last placement. Blocks are listed in the order they were first counted, which follows the
prefix (parents before children), with the tiers of each node that held them (kv_events)
and each node's phase at that time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import polars as pl

from toolkit.queries.run import Run, switch_lines, time_bin_width
from toolkit.queries.split import phase_segments


class CountsData(NamedTuple):
    run_id: str
    width_s: float  # time bin width
    t: list[float]  # bin ends
    nodes: list[int]
    blocks: np.ndarray  # [node, bin]: blocks with count > 0 at the bin's end
    refs: np.ndarray  # [node, bin]: Σ counts at the bin's end
    switch_times: list[float]
    missing: str | None


class TreeData(NamedTuple):
    run_id: str
    t: float  # the instant shown
    blocks: list[int]  # first counted first
    nodes: list[int]
    phase: dict[int, str]  # each node's phase at t
    counts: dict[tuple[int, int], int]  # (node, block) -> R at t (absent: never counted there)
    held: dict[tuple[int, int], str]  # (node, block) -> tiers holding it at t, e.g. 'gpu+host'
    program_id: str | None  # with branch_id: the branch's program
    branch_id: str | None
    missing: str | None


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


def counts_data(run: Run, *, bins: int = 120) -> CountsData:
    """Blocks with a positive count and Σ counts per node, at the end of each time bin."""
    width = time_bin_width(run.t_end(), bins)
    if run.count("branch_counts") == 0:
        none = np.zeros((0, 0))
        missing = f"no branch counts logged in run {run.run_id}"
        return CountsData(run.run_id, width, [], [], none, none, [], missing)
    df = counts_over_time(run, width)
    t, nodes, blocks = _grid(df, "blocks")
    _, _, refs = _grid(df, "refs")
    return CountsData(run.run_id, width, t, nodes, blocks, refs, switch_lines(run), None)


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


def count_tree_data(
    run: Run,
    *,
    t: float | None = None,
    branch_id: str | None = None,
    program_id: str | None = None,
    max_blocks: int = 30,
) -> TreeData:
    """Counts R_{b,n} of the chosen blocks on every node at time t (see module docstring).

    `t` defaults to the instant with the most branch references cluster-wide (or, with
    `branch_id`, the branch's last placement); `program_id` names the branch's program
    (needed when the branch id occurs in several); `max_blocks` caps the blocks.
    """
    if max_blocks < 1:
        raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")

    def nothing(at: float, message: str, program: str | None = None) -> TreeData:
        return TreeData(run.run_id, at, [], [], {}, {}, {}, program, branch_id, message)

    if run.count("branch_counts") == 0:
        return nothing(t or 0.0, f"no branch counts logged in run {run.run_id}")
    program: str | None = None
    if branch_id is not None:
        program = _branch_program(run, branch_id, program_id)
        blocks, last_placed = (
            ([], None) if program is None else _branch_blocks(run, program, branch_id)
        )
        if not blocks:
            return nothing(
                t or 0.0,
                f"no counted blocks found for branch {branch_id!r}"
                + (f" of program {program!r}" if program else "")
                + f" in run {run.run_id}",
                program,
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
            return nothing(t, f"no block has a positive count at t = {t:.1f} s in run {run.run_id}")
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
    counts = {
        (int(r["node_id"]), int(r["block_hash"])): int(r["count"])
        for r in state.iter_rows(named=True)
    }
    return TreeData(run.run_id, t, blocks, node_ids, phase, counts, held, program, branch_id, None)
