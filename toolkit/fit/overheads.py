"""The serving overheads of a live PD cluster run: each stage's durations, fitted and stored.

A live run's `request_stages` (the proxy's and the engines' stamps) with its `requests`
give each request's time in every stage the forward passes do not account for, and its
iteration rows give each pass's CPU overhead (`overhead_s`). `stage_samples` reads them
(models.overheads names the stages):

- ingress = t_prefill_queued - t_arrival (proxy routing, HTTP, the engine's intake)
- prefill_wait = t_prefill_forward - t_prefill_queued, for requests the prefill engine
  queued while idle (no other request's prefill ran across or after its queueing, before
  its own pass): its wake-up and scheduling. Behind busy passes the wait is queueing, which
  the simulator prices itself from the passes and their overhead.
- handoff = t_kv_ready - t_prefill_done (the prefill's hand-over and the KV transfer)
- join = t_decode_join - t_kv_ready, for requests whose KV reached an idle decode engine
  (no other request was decoding there then); behind running passes the simulator waits
  for the pass in progress itself. Idleness is judged by the engines' own stamps (one
  clock per engine), not by the iteration rows' receive times.
- first_out = t_first_token - t_first_emit (the first token's trip from the decode
  engine's scheduler through its HTTP server and the proxy), prefill_out =
  t_prefill_answer - t_prefill_done (the prefill engine's answer reaching the proxy), and
  last_out = t_done - max(t_last_emit, t_prefill_answer): the proxy finishes a request
  once both engines answered, so a short answer often waits for the prefill's
- prefill_pass, decode_pass = each pass's overhead_s, against its sequences (num_reqs,
  batch_size), so the per-sequence cost is separated

`fit_overheads` fits every stage with samples
(`models.overheads.StageFit`), `save_overheads` stores them in `overhead_fits` (replacing
the run's previous rows), `load_overheads` reads them back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import numpy.typing as npt

from models.overheads import ServingOverheads, StageFit
from telemetry import TelemetryError, store
from telemetry.validate import validate_batch
from toolkit.fit.run import FitInputError
from toolkit.queries.run import Run, open_run

MIN_SAMPLES = 5  # a stage with fewer is not fitted (its consumers add nothing for it)
Samples = dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]]

_STAGE_SQL = """
WITH s AS (
  SELECT r.request_id, r.prefill_node AS p, r.decode_node AS d, r.t_arrival,
         r.t_first_token, r.t_done, q.* EXCLUDE (run_id, request_id)
  FROM requests r JOIN request_stages q USING (run_id, request_id)
  WHERE r.run_id = $run AND r.t_done IS NOT NULL
)
SELECT
  t_prefill_queued - t_arrival AS ingress,
  CASE WHEN NOT EXISTS (SELECT 1 FROM s o WHERE o.p = s.p AND o.request_id <> s.request_id
                        AND o.t_prefill_forward < s.t_prefill_forward
                        AND o.t_prefill_done > s.t_prefill_queued)
       THEN t_prefill_forward - t_prefill_queued END AS prefill_wait,
  t_kv_ready - t_prefill_done AS handoff,
  CASE WHEN NOT EXISTS (SELECT 1 FROM s o WHERE o.d = s.d AND o.request_id <> s.request_id
                        AND o.t_decode_join < s.t_kv_ready AND o.t_last_emit > s.t_kv_ready)
       THEN t_decode_join - t_kv_ready END AS "join",
  t_first_token - t_first_emit AS first_out,
  {answer} - t_prefill_done AS prefill_out,
  t_done - greatest(t_last_emit, coalesce({answer}, t_last_emit)) AS last_out
FROM s
"""
REQUEST_STAGE_COLUMNS = _REQUEST_STAGES = (
    "ingress",
    "prefill_wait",
    "handoff",
    "join",
    "first_out",
    "prefill_out",
    "last_out",
)
_PASS_SQL = {
    "prefill_pass": "SELECT overhead_s, num_reqs FROM prefill_iterations "
    "WHERE run_id = ? AND overhead_s IS NOT NULL",
    "decode_pass": "SELECT overhead_s, batch_size FROM decode_iterations "
    "WHERE run_id = ? AND overhead_s IS NOT NULL",
}


def _tables(run: Run) -> set[str]:
    return {r[0] for r in run.rows("SELECT table_name FROM information_schema.tables")}


def _columns(run: Run, table: str) -> set[str]:
    return {
        r[0]
        for r in run.rows(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]
        )
    }


def request_matrix(run: Run) -> npt.NDArray[np.float64] | None:
    """One row per completed request of `run`, one column per request stage
    (`REQUEST_STAGE_COLUMNS`), NaN where it was not measured; None without stage rows."""
    if not {"requests", "request_stages"} <= _tables(run):
        return None
    # (t_prefill_answer: absent in runs recorded before it was)
    cols = _columns(run, "request_stages")
    answer = "t_prefill_answer" if "t_prefill_answer" in cols else "NULL::DOUBLE"
    frame = run.con.execute(_STAGE_SQL.format(answer=answer), {"run": run.run_id}).fetchnumpy()
    if not len(frame["ingress"]):
        return None
    return np.column_stack(
        [np.ma.filled(np.ma.asarray(frame[s], dtype=np.float64), np.nan) for s in _REQUEST_STAGES]
    )


def stage_samples(run: Run) -> Samples:
    """Each stage's durations in `run` (and, for pass stages, the passes' sequences);
    stages the run did not record are absent, and a run without request stages (not a
    live PD cluster's) has none."""
    tables = _tables(run)
    out: Samples = {}
    joint = request_matrix(run)
    if joint is None:
        return out
    for i, stage in enumerate(_REQUEST_STAGES):
        x = joint[:, i]
        x = x[np.isfinite(x)]
        if x.size:
            out[stage] = (x, None)
    for stage, sql in _PASS_SQL.items():
        table = sql.split("FROM ")[1].split()[0]
        if table in tables and "overhead_s" in _columns(run, table):
            rows = run.rows(sql, [run.run_id])
            if rows:
                a = np.asarray(rows, dtype=np.float64)
                out[stage] = (a[:, 0], a[:, 1])
    return out


def fit_samples(samples: Samples, min_samples: int = MIN_SAMPLES) -> ServingOverheads:
    """Every stage with at least `min_samples` durations, fitted."""
    fits = {
        stage: StageFit.fit(stage, x, n)
        for stage, (x, n) in samples.items()
        if np.isfinite(x).sum() >= min_samples
    }
    return ServingOverheads(fits)


def fit_overheads(db: str | Path, run_id: str | None = None) -> tuple[str, ServingOverheads]:
    """(run id, its fitted overheads); empty when the run recorded no stages."""
    try:
        with open_run(db, run_id) as run:
            return run.run_id, fit_samples(stage_samples(run))
    except TelemetryError as exc:
        raise FitInputError(str(exc)) from None


def save_overheads(db: str | Path, run_id: str, overheads: ServingOverheads) -> int:
    """Store the run's fitted stages in `overhead_fits` (its previous rows replaced);
    returns the rows written."""
    path = Path(db)
    fits = list(overheads.stages.values())
    data = {
        "stage": [f.stage for f in fits],
        "fitted_at": [datetime.now(UTC).replace(tzinfo=None)] * len(fits),
        "samples": [f.samples for f in fits],
        "mean_s": [f.mean_s for f in fits],
        "quantiles_s": [list(f.quantiles_s) for f in fits],
        "bin_means_s": [list(f.bin_means_s) for f in fits],
        "log_mu": [f.log_mu for f in fits],
        "log_sigma": [f.log_sigma for f in fits],
        "per_seq_s": [f.per_seq_s for f in fits],
    }
    try:
        batch = validate_batch("overhead_fits", data, run_id)
        with store.transaction(
            path, what="write overhead_fits", tables=["overhead_fits"], claim=False
        ) as con:
            con.execute("DELETE FROM overhead_fits WHERE run_id = ?", [run_id])
            if batch.num_rows:
                store.insert(con, "overhead_fits", batch)
    except TelemetryError as exc:
        raise FitInputError(f"cannot write overhead_fits: {exc}") from None
    except duckdb.Error as exc:
        raise FitInputError(f"cannot write overhead_fits to {str(path)!r}: {exc}") from None
    return batch.num_rows


def load_overheads(run: Run) -> ServingOverheads | None:
    """The run's stored overheads (None when none were stored)."""
    if "overhead_fits" not in _tables(run):
        return None
    rows = run.rows(
        "SELECT stage, samples, mean_s, quantiles_s, bin_means_s, log_mu, log_sigma, per_seq_s "
        "FROM overhead_fits WHERE run_id = ? ORDER BY stage",
        [run.run_id],
    )
    if not rows:
        return None
    fits = {
        r[0]: StageFit(
            r[0], int(r[1]), float(r[2]), tuple(r[3]), tuple(r[4]), r[5], r[6], float(r[7] or 0)
        )
        for r in rows
    }
    return ServingOverheads(fits)


def overheads_json(overheads: ServingOverheads) -> dict[str, dict[str, float | int | None]]:
    """Each fitted stage: samples, mean, p50, p90, p99 (seconds) and per-sequence slope."""
    return {
        f.stage: {
            "samples": f.samples,
            "mean_s": f.mean_s,
            "p50_s": f.quantiles_s[10],
            "p90_s": f.quantiles_s[18],
            "max_s": f.quantiles_s[-1],
            "per_seq_s": f.per_seq_s,
            "log_mu": f.log_mu,
            "log_sigma": f.log_sigma,
        }
        for f in overheads.stages.values()
    }


def print_overheads(overheads: ServingOverheads) -> None:
    """The stages as a table (nothing when the run recorded none)."""
    if not overheads:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="serving overheads (outside the forward passes)", caption=(
        f"expected before the first token: {1e3 * overheads.ttft_s:.1f} ms; stored in "
        "overhead_fits"))  # fmt: skip
    for col in ("stage", "samples", "mean ms", "p50 ms", "p90 ms", "per seq ms"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for f in overheads.stages.values():
        q = f.quantiles_s
        table.add_row(f.stage, str(f.samples), f"{1e3 * f.mean_s:.2f}", f"{1e3 * q[10]:.2f}",
                      f"{1e3 * q[18]:.2f}", f"{1e3 * f.per_seq_s:.2f}" if f.per_seq_s else "-")  # fmt: skip
    Console().print(table)
