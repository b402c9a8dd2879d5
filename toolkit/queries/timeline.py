"""Every node's prefill and decode passes over a window of time, with the requests in each
(the per-node iteration timeline: where prefill and decode interfere, paper 000 §4.1).

`pass_window(run, t0, t1)` reads the passes that start in [t0, t1). Up to `max_passes` it
returns them one by one with their requests: a prefill pass's from
`prefill_iteration_requests` (each request's new tokens, t_uc), or where an engine logged
none, the requests the node was prefilling then (prefill_node, t_prefill_start ≤ t <
t_first_token); a decode pass's are the requests the node was decoding when it started
(decode_node, t_first_token ≤ t < t_done: the batch rows carry no request ids), listed up
to `max_ids` per pass with their count. Above `max_passes` the window is downsampled in
DuckDB: per node, phase and time bin, the busy share (Σ pass time / bin width, passes
placed at their start), pass count, tokens and mean batch. `busy_overview` is the same
binning over the whole run; `default_window` picks the window a report shows (about
`DEFAULT_PASSES` passes around the busiest moment after the warmup).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run, time_bin_width

MAX_PASSES = 3000  # above: downsampled
DEFAULT_PASSES = 400  # what a report window holds: single passes stay visible
MAX_IDS = 8
# One row per pass: node, phase, id, start, duration, batch (requests), tokens computed.
_PASSES = """
    SELECT node_id, 'prefill' AS phase, iter_id, t_start, duration_s, num_reqs AS size,
           t_uc AS tokens, t_c AS ctx_tokens FROM prefill_iterations
    WHERE run_id = ? AND t_start >= ? AND t_start < ?
    UNION ALL
    SELECT node_id, 'decode', iter_id, t_start, duration_s, batch_size,
           round(batch_size * t_fwd)::BIGINT, ctx_tokens FROM decode_iterations
    WHERE run_id = ? AND t_start >= ? AND t_start < ?
"""


class PassWindow(NamedTuple):
    run_id: str
    t0: float
    t1: float
    total: int  # passes starting in the window
    # exact: node_id, phase, iter_id, t_start, duration_s, size, tokens, ctx_tokens,
    # request_ids (first max_ids), request_tokens (their new tokens; prefill only),
    # n_requests, requests_from ('logged' | 'request times')
    passes: pl.DataFrame
    # downsampled (else empty): node_id, phase, t_bin, busy, passes, tokens, mean_size
    bins: pl.DataFrame
    width_s: float | None  # bin width when downsampled
    labels: dict[int, str]  # node id -> name
    missing: str | None

    @property
    def exact(self) -> bool:
        return self.width_s is None


def _labels(run: Run) -> dict[int, str]:
    return {
        int(r["node_id"]): str(r["name"] or f"node {r['node_id']}")
        for r in run.nodes().iter_rows(named=True)
    }


def _params(run: Run, t0: float, t1: float) -> list[object]:
    return [run.run_id, t0, t1, run.run_id, t0, t1]


def binned_passes(run: Run, t0: float, t1: float, width: float) -> pl.DataFrame:
    """Per node, phase and bin of `width` from t0: busy share, passes, tokens, mean batch."""
    return run.df(
        f"""
        SELECT node_id, phase, ? + floor((t_start - ?) / ?) * ? AS t_bin,
               least(sum(duration_s) / ?, 1.0) AS busy, count(*) AS passes,
               sum(tokens) AS tokens, avg(size) AS mean_size
        FROM ({_PASSES}) GROUP BY ALL ORDER BY node_id, phase, t_bin
        """,
        [t0, t0, width, width, width, *_params(run, t0, t1)],
    )


def _exact(run: Run, t0: float, t1: float, max_ids: int) -> pl.DataFrame:
    """The passes with their requests (module docstring)."""
    logged = run.count("prefill_iteration_requests") > 0
    prefill_reqs = (
        f"""
        SELECT p.node_id, p.iter_id, 'prefill' AS phase,
               list(r.request_id ORDER BY r.request_id)[1:{max_ids}] AS request_ids,
               list(r.t_uc ORDER BY r.request_id)[1:{max_ids}] AS request_tokens,
               count(*) AS n_requests, 'logged' AS requests_from
        FROM p JOIN prefill_iteration_requests r
          ON r.run_id = ? AND r.node_id = p.node_id AND r.iter_id = p.iter_id
        WHERE p.phase = 'prefill' GROUP BY ALL
        """
        if logged
        else f"""
        SELECT p.node_id, p.iter_id, 'prefill' AS phase,
               list(q.request_id ORDER BY q.request_id)[1:{max_ids}] AS request_ids,
               NULL::BIGINT[] AS request_tokens, count(*) AS n_requests,
               'request times' AS requests_from
        FROM p JOIN q ON q.prefill_node = p.node_id
          AND q.t_prefill_start <= p.t_start AND p.t_start < q.t_first_token
        WHERE p.phase = 'prefill' GROUP BY ALL
        """
    )
    sql = f"""
        WITH p AS ({_PASSES}),
        q AS (
            SELECT request_id, prefill_node, decode_node, t_prefill_start, t_first_token, t_done
            FROM requests WHERE run_id = ? AND t_done >= ? AND t_arrival < ?
        ),
        pr AS ({prefill_reqs}),
        dr AS (
            SELECT p.node_id, p.iter_id, 'decode' AS phase,
                   list(q.request_id ORDER BY q.request_id)[1:{max_ids}] AS request_ids,
                   NULL::BIGINT[] AS request_tokens, count(*) AS n_requests,
                   'request times' AS requests_from
            FROM p JOIN q ON q.decode_node = p.node_id
              AND q.t_first_token <= p.t_start AND p.t_start < q.t_done
            WHERE p.phase = 'decode' GROUP BY ALL
        ),
        r AS (SELECT * FROM pr UNION ALL SELECT * FROM dr)
        SELECT p.*, r.request_ids, r.request_tokens, coalesce(r.n_requests, 0) AS n_requests,
               r.requests_from
        FROM p LEFT JOIN r USING (node_id, iter_id, phase)
        ORDER BY p.node_id, p.phase DESC, p.t_start
    """
    params = [*_params(run, t0, t1), run.run_id, t0, t1]
    if logged:
        params.append(run.run_id)
    return run.df(sql, params)


def pass_window(
    run: Run,
    t0: float | None = None,
    t1: float | None = None,
    *,
    max_passes: int = MAX_PASSES,
    max_ids: int = MAX_IDS,
    bins: int = 200,
) -> PassWindow:
    """The passes starting in [t0, t1) (default: the whole run), exact or downsampled."""
    lo = 0.0 if t0 is None else max(float(t0), 0.0)
    hi = run.t_end() if t1 is None else float(t1)
    if hi <= lo:
        raise ValueError(f"the window must end after it starts, got [{lo:g}, {hi:g}) s")
    labels = _labels(run)
    total = int(run.scalar(f"SELECT count(*) FROM ({_PASSES})", _params(run, lo, hi)))
    empty = pl.DataFrame()
    if total == 0:
        missing = f"no prefill or decode passes logged in [{lo:g}, {hi:g}) s of run {run.run_id}"
        return PassWindow(run.run_id, lo, hi, 0, empty, empty, None, labels, missing)
    if total > max_passes:
        width = time_bin_width(hi - lo, bins)
        got = binned_passes(run, lo, hi, width)
        return PassWindow(run.run_id, lo, hi, total, empty, got, width, labels, None)
    got = _exact(run, lo, hi, max_ids)
    return PassWindow(run.run_id, lo, hi, total, got, empty, None, labels, None)


def busy_overview(run: Run, *, bins: int = 240) -> tuple[pl.DataFrame, float]:
    """`binned_passes` over the whole run, and the bin width."""
    width = time_bin_width(run.t_end(), bins)
    return binned_passes(run, 0.0, run.t_end() + width, width), width


def default_window(run: Run, *, passes: int = DEFAULT_PASSES) -> tuple[float, float]:
    """A window of about `passes` passes around the busiest bin of the measured period
    (after the warmup: the most busy share summed over lanes); the whole run when it has
    fewer passes."""
    t_end = run.t_end()
    start = min(run.warmup_s(), t_end)
    total = int(run.scalar(f"SELECT count(*) FROM ({_PASSES})", _params(run, 0.0, t_end + 1)))
    if total <= passes or t_end <= start:
        return 0.0, t_end + 1e-9
    width = time_bin_width(t_end - start, 100)
    per_bin = (
        binned_passes(run, start, t_end + width, width)
        .group_by("t_bin")
        .agg(pl.col("busy").sum(), pl.col("passes").sum())
        .sort(["busy", "t_bin"], descending=[True, False])
    )
    if per_bin.is_empty():
        return start, t_end + 1e-9
    best = per_bin.row(0, named=True)
    span = min(t_end - start, passes * width / max(int(best["passes"]), 1))
    mid = best["t_bin"] + width / 2
    lo = min(max(mid - span / 2, start), t_end - span)
    return lo, lo + span


def last_pass_start(run: Run) -> float | None:
    """When the run's last logged pass started (a live run: what is written so far)."""
    got = run.scalar(
        "SELECT greatest((SELECT max(t_start) FROM prefill_iterations WHERE run_id = ?), "
        "(SELECT max(t_start) FROM decode_iterations WHERE run_id = ?))",
        [run.run_id, run.run_id],
    )
    return None if got is None else float(got)
