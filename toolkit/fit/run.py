"""Fit the iteration-time models of every node of a run from DuckDB (paper 000 §5.1).

Eq. 1 (prefill, c0..c3) and Eq. 2 (decode, d0..d2 with phi(B) of App. B.3) are fitted per
node by relative-error NNLS (models.fitting). The rows never leave DuckDB (toolkit.fit.sql): one SQL pass per
phase sums, per node, per held-out flag and per bootstrap bucket, the Gram statistics
(sum x_i x_j / y^2, sum x_i / y, count) — a few hundred rows whatever the log size — and
a second pass over the held-out rows computes MAPE with the fitted coefficients passed as
parameters. Rows are assigned to the held-out set and to buckets by a hash of
(node_id, iter_id), so a split is deterministic and the same on every refit. Sums use
DuckDB's fsum (compensated summation, order-independent in practice) so that refitting
the same rows gives bit-identical coefficients.

Decisions for logs written outside pdlab:
- decode needs the node's moe_top_k / moe_experts from `nodes`; a node without a (valid)
  row gets a message in its decode entry rather than a guess. moe_experts = 0 means a dense
  model: phi(B) = 0 and d1 is fixed at 0 (noted).
- rows with duration_s <= 0, non-finite, negative or missing values are excluded and
  counted in the entry's message.
- the tables are checked against the schema first (telemetry.check): a missing or misspelt
  required column, values of the wrong type or NULL ids are a `FitInputError`, not an
  empty fit.
- moe_top_k = moe_experts (every expert active): phi(B) = 1 for every batch, the same
  feature as d0's, so d1 cannot be told from d0: it is fixed at 0 and d0 absorbs it (noted).
- a run that never finished (telemetry.status) is fitted from the rows it has, and
  `RunFit.note` says so.
- `save_fits` creates `model_fits` when absent and replaces the run's previous rows for the
  refitted (node, phase) pairs in one transaction; failed fits leave earlier rows alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import duckdb

from models.fitting import FitError
from models.forms import DECODE_PAPER, PREFILL_PAPER
from models.selection import Candidate, choose_form
from telemetry import TelemetryError, open_reader, store
from telemetry.check import check_connection
from telemetry.reader import DB_ALIAS
from telemetry.status import run_states, unfinished_note
from telemetry.validate import validate_batch
from toolkit.fit.sql import HASH_MOD, PHASE_SQL, Agg, aggregate, heldout_mape

Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")
ITERATION_TABLES = ("prefill_iterations", "decode_iterations")


class FitInputError(Exception):
    """The database cannot be fitted at all (missing file or tables, unknown/ambiguous run)."""


class PhaseFit(NamedTuple):
    """One node's fit of one phase. `coef` is None when it failed; `message` says why.

    `samples` counts training rows, `samples_test` held-out rows; `mape` is held-out MAPE as
    a fraction; `ci` the bootstrap 95% interval per coefficient; `fixed` terms held at 0.
    On success `message` carries notes (excluded rows, dense model, ...) or is None.
    `form` is the model form's label (models.forms: 'paper' is Eq. 1 / Eq. 2), `terms` its
    coefficient names (empty: the paper form's), `cv` each candidate's cross-validated
    relative RMSE when the form was chosen by evidence.
    """

    phase: Phase
    coef: tuple[float, ...] | None
    samples: int
    samples_test: int = 0
    mape: float | None = None
    ci: tuple[tuple[float, float], ...] | None = None
    fixed: tuple[str, ...] = ()
    message: str | None = None
    form: str = "paper"
    terms: tuple[str, ...] = ()
    cv: tuple[tuple[str, float], ...] = ()
    # What was fitted: the pass's wall time (duration_s) or, where the engine measured it,
    # the engine thread's CPU time (cpu_s: toolkit.fit.forms); with cpu_s, the node's
    # summed wall over CPU time (how much of a core the host gave it).
    target: str = "duration_s"
    wall_per_cpu: float | None = None

    @property
    def ok(self) -> bool:
        return self.coef is not None


class NodeFit(NamedTuple):
    node_id: int
    prefill: PhaseFit
    decode: PhaseFit


class RunFit(NamedTuple):
    run_id: str
    nodes: tuple[NodeFit, ...]
    holdout: float
    fitted_at: datetime
    note: str | None = None  # set when the run never finished (its rows stop early)


class _Reader(Protocol):
    def connect(self) -> Any: ...


@contextmanager
def _connect(db: str | Path | _Reader) -> Iterator[tuple[Any, str, set[str]]]:
    """(connection, label, tables in the DB file) for a path or a telemetry reader.

    The connection is the reader's: SPEC §3 tables are views over the DB file plus the live
    segments of runs still being written, so a live run can be fitted too.
    """
    try:
        if isinstance(db, str | Path):
            path = Path(db)
            if not path.exists():
                raise FitInputError(f"database file {str(path)!r} does not exist")
            reader: _Reader = open_reader(path)
            label = str(path)
        else:
            reader, label = db, str(getattr(db, "db_path", db))
        with reader.connect() as con:
            rows = con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [DB_ALIAS]
            ).fetchall()
            yield con, label, {r[0] for r in rows}
    except TelemetryError as exc:
        raise FitInputError(str(exc)) from None
    except duckdb.Error as exc:
        raise FitInputError(f"cannot read {label} as a DuckDB telemetry database: {exc}") from None


def _has_rows(con: Any, table: str, run_id: str | None = None) -> bool:
    where = " WHERE run_id = ?" if run_id is not None else ""
    args = [run_id] if run_id is not None else []
    return bool(con.execute(f"SELECT 1 FROM {table}{where} LIMIT 1", args).fetchall())


def _resolve_run(con: Any, run_id: str | None, label: str) -> str:
    """The run to fit. Runs come from `runs`; logs written without a runs row (external
    engines) are found through their iteration tables."""
    runs = sorted(r[0] for r in con.execute("SELECT DISTINCT run_id FROM runs").fetchall())
    if not runs:
        union = " UNION ".join(f"SELECT DISTINCT run_id FROM {t}" for t in ITERATION_TABLES)
        runs = sorted(r[0] for r in con.execute(union).fetchall() if r[0] is not None)
    if run_id is not None:
        if run_id in runs or any(_has_rows(con, t, run_id) for t in ITERATION_TABLES):
            return run_id
        shown = ", ".join(runs[:10]) + (f" ... ({len(runs)} in all)" if len(runs) > 10 else "")
        raise FitInputError(f"no run {run_id!r} in {label}; runs: {shown or 'none'}")
    if not runs:
        raise FitInputError(f"{label} holds no runs")
    if len(runs) > 1:
        shown = ", ".join(runs[:10]) + (f" ... ({len(runs)} in all)" if len(runs) > 10 else "")
        raise FitInputError(f"{label} holds {len(runs)} runs; choose one with --run: {shown}")
    return runs[0]


def _moe_shapes(con: Any, run_id: str) -> dict[int, tuple[int, int]]:
    rows = con.execute(
        "SELECT node_id, moe_top_k, moe_experts FROM nodes WHERE run_id = ?", [run_id]
    ).fetchall()
    return {int(n): (int(k or 0), int(e or 0)) for n, k, e in rows if n is not None}


def _moe_problem(shape: tuple[int, int] | None) -> str | None:
    if shape is None:
        return (
            "no row in `nodes` for this node, so moe_top_k / moe_experts (needed for phi(B)) "
            "are unknown; add the node's row (moe_experts = 0 for a dense model)"
        )
    k, e = shape
    if e < 0 or (e > 0 and not 0 < k <= e):
        return f"`nodes` row has moe_top_k={k}, moe_experts={e}; need 1 <= moe_top_k <= moe_experts, or moe_experts = 0 (dense)"
    return None


def _fit_phase(
    node: int, phase: Phase, agg: Agg | None, moe_problem: str | None, bootstrap: int, seed: int
) -> tuple[PhaseFit, list[str]]:
    """Coefficients of one node and phase, or a PhaseFit carrying the reason it failed."""
    spec = PHASE_SQL[phase]
    where = f"node {node} {phase}"
    if agg is None:
        return PhaseFit(phase, None, 0, message=f"{where}: no {phase} iterations logged"), []
    notes = []
    if agg.num_invalid:
        notes.append(
            f"{agg.num_invalid} iterations excluded (duration_s <= 0, non-finite, negative or missing values)"
        )
    valid = agg.num_train + agg.num_test
    if moe_problem is not None:
        msg = f"{where}: {valid} iterations but {moe_problem}"
        return PhaseFit(phase, None, 0, agg.num_test, message=msg), notes
    need = 2 * len(spec.terms) + 2
    if agg.num_train < need:
        detail = f"{valid} valid, {agg.num_test} held out"
        if agg.num_invalid:
            detail += f", {agg.num_invalid} excluded"
        msg = f"{where}: only {agg.num_train} training iterations ({detail}), need at least {need}"
        return PhaseFit(phase, None, agg.num_train, agg.num_test, message=msg), notes
    form = PREFILL_PAPER if phase == "prefill" else DECODE_PAPER  # Eq. 1 / Eq. 2
    try:
        fit = choose_form(
            [Candidate(form, agg.buckets)],
            always=(spec.terms[0],),
            interval="bootstrap" if bootstrap > 0 else None,
            resamples=bootstrap,
            seed=seed,
        )
    except FitError as exc:
        return PhaseFit(phase, None, agg.num_train, agg.num_test, message=f"{where}: {exc}"), notes
    if fit.ci_note is not None:
        notes.append(f"no confidence interval: {fit.ci_note}")
    return PhaseFit(phase, fit.coef, agg.num_train, agg.num_test, None, fit.ci, fit.fixed), notes


def fit_run(
    db: str | Path | _Reader,
    run_id: str | None = None,
    node_ids: Iterable[int] | None = None,
    holdout: float = 0.2,
    bootstrap: int = 200,
    seed: int = 0,
) -> RunFit:
    """Fit Eq. 1 and Eq. 2 per node of one run; never raises for one node's bad data.

    `db` is a DuckDB path or a telemetry reader (anything with `.connect()`). `run_id` may
    be omitted when the database holds one run. `holdout` is the fraction of iterations
    (by hash of node_id, iter_id) kept out of the fit to measure MAPE; `bootstrap` the
    number of bucket resamples for the 95% CIs (0 disables them). Raises FitInputError
    when the database or run cannot be fitted at all.
    """
    if not 0.0 <= holdout < 1.0:
        raise FitInputError(f"holdout must be a fraction in [0, 1), got {holdout}")
    if bootstrap < 0:
        raise FitInputError(f"bootstrap must be >= 0 resamples, got {bootstrap}")
    threshold = round(holdout * HASH_MOD)
    wanted = None if node_ids is None else sorted({int(n) for n in node_ids})
    with _connect(db) as (con, label, db_tables):
        run, note = _checked_run(con, label, db_tables, run_id)
        shapes = _moe_shapes(con, run)
        aggs = {
            phase: aggregate(con, PHASE_SQL[phase], run, wanted, threshold, _log_bases(shapes))
            for phase in PHASES
        }
        nodes = sorted(set(shapes) | set(aggs["prefill"]) | set(aggs["decode"]))
        if wanted is not None:
            unknown = [n for n in wanted if n not in nodes]
            if unknown:
                raise FitInputError(f"node(s) {unknown} not in run {run!r}; nodes: {nodes}")
            nodes = wanted
        results = {
            phase: _fit_nodes(
                con, run, phase, nodes, aggs[phase], shapes, threshold, bootstrap, seed
            )
            for phase in PHASES
        }
    return _assemble(run, nodes, results, shapes, holdout, note)


def _assemble(
    run: str,
    nodes: list[int],
    results: dict[Phase, dict[int, tuple[PhaseFit, list[str]]]],
    shapes: dict[int, tuple[int, int]],
    holdout: float,
    note: str | None,
    fitted_notes: Callable[[PhaseFit], list[str]] = lambda fit: [],
) -> RunFit:
    """The run's fit: each node's two phase fits with their notes joined into the message
    (`fitted_notes` adds notes of a fitted phase)."""
    fits = []
    for n in nodes:
        entries = []
        for phase in PHASES:
            fit, notes = results[phase][n]
            if fit.ok:
                notes = notes + _success_notes(fit, shapes.get(n), holdout) + fitted_notes(fit)
            if notes:
                fit = fit._replace(
                    message="; ".join(([fit.message] if fit.message else []) + notes)
                )
            entries.append(fit)
        fits.append(NodeFit(n, entries[0], entries[1]))
    return RunFit(run, tuple(fits), holdout, datetime.now(UTC).replace(tzinfo=None), note)


def _checked_run(
    con: Any, label: str, db_tables: set[str], run_id: str | None
) -> tuple[str, str | None]:
    """The run to fit, after checking the database's tables, and a note when it never finished.

    Raises FitInputError naming what is wrong (a schema problem, no iteration table, no such
    run)."""
    check_connection(con, label, ("runs", "nodes", *ITERATION_TABLES))
    if not [t for t in ITERATION_TABLES if t in db_tables or _has_rows(con, t)]:
        raise FitInputError(
            f"{label} has no prefill_iterations or decode_iterations table; "
            f"tables present: {', '.join(sorted(db_tables)) or 'none'}"
        )
    run = _resolve_run(con, run_id, label)
    state = run_states(con, label, [run], DB_ALIAS if db_tables else None)[run]
    return run, unfinished_note(label, run, state)


def _log_bases(shapes: dict[int, tuple[int, int]]) -> dict[int, float]:
    """ln(1 - k/E) per node with a valid MoE shape; 0 (phi's feature is 0) for a dense node
    and for k = E, where phi = 1 in every batch and d0 absorbs d1."""
    return {
        n: (0.0 if e == 0 or k == e else math.log1p(-k / e))
        for n, (k, e) in shapes.items()
        if _moe_problem((k, e)) is None
    }


def _fit_nodes(
    con: Any,
    run: str,
    phase: Phase,
    nodes: list[int],
    aggs: dict[int, Agg],
    shapes: dict[int, tuple[int, int]],
    threshold: int,
    bootstrap: int,
    seed: int,
) -> dict[int, tuple[PhaseFit, list[str]]]:
    """Fit one phase for every node, then measure held-out MAPE in one SQL pass."""
    spec = PHASE_SQL[phase]
    per = {}
    for n in nodes:
        problem = _moe_problem(shapes.get(n)) if spec.needs_moe else None
        per[n] = _fit_phase(n, phase, aggs.get(n), problem, bootstrap, seed)
    coefs = {n: fit.coef for n, (fit, _) in per.items() if fit.coef is not None}
    for n, (count, value) in heldout_mape(
        con, spec, run, threshold, coefs, _log_bases(shapes)
    ).items():
        fit, notes = per[n]
        per[n] = (fit._replace(mape=value, samples_test=count), notes)
    return per


def _success_notes(fit: PhaseFit, shape: tuple[int, int] | None, holdout: float) -> list[str]:
    notes = []
    if fit.phase == "decode" and shape is not None and shape[1] == 0:
        notes.append("dense model (moe_experts = 0): phi(B) = 0, d1 fixed at 0")
    elif fit.phase == "decode" and shape is not None and shape[0] == shape[1]:
        notes.append(
            "moe_top_k = moe_experts: phi(B) = 1 in every batch, so d1 is fixed at 0 and d0 absorbs it"
        )
    elif "d1" in fit.fixed:
        notes.append("phi(B) is 0 in every iteration: d1 fixed at 0")
    if "c3" in fit.fixed:
        notes.append("no host restores logged (t_rst = 0): c3 fixed at 0")
    if fit.mape is None:
        notes.append(
            "no held-out MAPE (holdout = 0)" if holdout == 0 else "no held-out iterations for MAPE"
        )
    return notes


def _phase_json(fit: PhaseFit) -> dict[str, Any]:
    out: dict[str, Any] = {
        "coef": list(fit.coef) if fit.coef is not None else None,
        "mape": fit.mape,
        "samples": fit.samples,
        "samples_test": fit.samples_test,
        "ci": [list(c) for c in fit.ci] if fit.ci is not None else None,
        "fixed": list(fit.fixed),
        "form": fit.form,
    }
    if fit.target != "duration_s":
        out["target"] = fit.target
        out["wall_per_cpu"] = fit.wall_per_cpu
    if fit.terms:
        out["terms"] = list(fit.terms)
    if fit.cv:
        out["cv_rmse"] = dict(fit.cv)
    if fit.message:
        out["message"] = fit.message
    return out


def to_json(fit: RunFit) -> dict[str, Any]:
    """The `pdlab fit --json` object: {"run_id", "nodes": [{"node_id", "prefill", "decode"}]}."""
    return {
        "run_id": fit.run_id,
        "holdout": fit.holdout,
        "note": fit.note,
        "nodes": [
            {
                "node_id": n.node_id,
                "prefill": _phase_json(n.prefill),
                "decode": _phase_json(n.decode),
            }
            for n in fit.nodes
        ],
    }


def mape_table(fit: RunFit) -> Any:
    """One row per node and phase: held-out MAPE (%) and the training / held-out rows
    (a polars DataFrame; the coefficients are in `to_json` and `pdlab fit`)."""
    import polars as pl

    return pl.DataFrame(
        [
            {
                "node": n.node_id,
                "phase": f.phase,
                "heldout_mape_pct": None if f.mape is None else round(100 * f.mape, 1),
                "train_rows": f.samples,
                "test_rows": f.samples_test,
                "note": f.message,
            }
            for n in fit.nodes
            for f in (n.prefill, n.decode)
        ]
    )


def save_fits(db_path: str | Path, fit: RunFit) -> int:
    """Store the successful fits in `model_fits`; returns the rows written.

    Idempotent: in one transaction the run's previous rows for the refitted (node, phase)
    pairs are deleted and the new ones inserted (telemetry.write_rows only inserts). The
    rows pass the same boundary validation as every telemetry batch. A database created by
    an external engine gets a `model_fits` table and nothing else.
    """
    path = Path(db_path)
    if not path.is_file():
        raise FitInputError(f"database file {str(path)!r} does not exist")
    rows = [(n.node_id, f) for n in fit.nodes for f in (n.prefill, n.decode) if f.ok]
    data = {
        "node_id": [n for n, _ in rows],
        "phase": [f.phase for _, f in rows],
        "fitted_at": [fit.fitted_at] * len(rows),
        "coef": [list(f.coef or ()) for _, f in rows],
        "samples": [f.samples for _, f in rows],
        "mape": [f.mape for _, f in rows],
        "form": [f.form for _, f in rows],
        "target": [f.target for _, f in rows],
    }
    try:
        batch = validate_batch("model_fits", data, fit.run_id)
        with store.transaction(
            path, what="write model_fits", tables=["model_fits"], claim=False
        ) as con:
            con.register("pdlab_new_fits", batch)
            try:
                con.execute(
                    "DELETE FROM model_fits USING pdlab_new_fits AS f "
                    "WHERE model_fits.run_id = f.run_id AND model_fits.node_id = f.node_id "
                    "AND model_fits.phase = f.phase"
                )
            finally:
                con.unregister("pdlab_new_fits")
            store.insert(con, "model_fits", batch)
    except TelemetryError as exc:
        raise FitInputError(f"cannot write model_fits: {exc}") from None
    except duckdb.Error as exc:
        raise FitInputError(f"cannot write model_fits to {str(path)!r}: {exc}") from None
    return batch.num_rows
