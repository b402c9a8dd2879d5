"""`pdlab fit --form auto|paper|floor|ctx`: model forms chosen by evidence, per node and phase.

The candidate forms of models.forms are aggregated from DuckDB exactly like Eq. 1-2
(toolkit.fit.sql: one SQL pass per form and phase reduces the rows to Gram statistics per
node and bucket), scored by K-fold cross-validation over the buckets, and the simplest form
within one standard error of the best is kept. Held-out MAPE is measured on the held-out
rows with the chosen form's coefficients (toolkit.fit.sql.heldout_mape).

Intervals (`ci`):
- "time" (the default here): buckets are 20 equal time windows of each node's iterations,
  and models.selection.robust_ci resamples whole windows and pads for the relative-error bias,
  so an interval covers what the form misses (a context mix drifting over the run), not
  only iid noise. On the README's main job the nine identical decode nodes' d2 intervals
  (ctx form) all hold the profile's true d2, where Eq. 2 with row-hash buckets gave nine
  disjoint intervals between 2.6e-4 and 3.5e-4.
- "rows": the hash buckets of toolkit.fit.run (sampling noise only), as `pdlab fit` without
  --form does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from models.fitting import FitError
from models.forms import Form, candidates, decode_model, form_by_label, prefill_model
from models.occupancy import NodeModel
from models.selection import Candidate, choose_form
from toolkit.fit.run import (
    PHASES,
    FitInputError,
    Phase,
    PhaseFit,
    RunFit,
    _assemble,
    _checked_run,
    _connect,
    _log_bases,
    _moe_problem,
    _moe_shapes,
    _Reader,
)
from toolkit.fit.sql import HASH_MOD, PHASE_SQL, Agg, PhaseSql, aggregate, heldout_mape

CiMethod = Literal["time", "rows"]
Target = Literal["auto", "wall", "cpu"]
NUM_TIME_BLOCKS = 20
CV_FOLDS = 5
# Each node's iterations split into NUM_TIME_BLOCKS equal windows of its own time span.
TIME_BUCKET_SQL = (
    f"least(coalesce(floor((t.t_start - min(t.t_start) OVER (PARTITION BY t.node_id)) "
    f"/ nullif(max(t.t_start) OVER (PARTITION BY t.node_id) "
    f"- min(t.t_start) OVER (PARTITION BY t.node_id), 0) * {NUM_TIME_BLOCKS}), 0), "
    f"{NUM_TIME_BLOCKS - 1})::BIGINT"
)


def form_sql(form: Form, target: str = "wall") -> PhaseSql:
    """How a form's design row is computed in SQL from its phase's iteration table, as a
    prediction of the pass's wall time or (`target` "cpu") of its engine thread's CPU time."""
    base = PHASE_SQL["prefill" if form.phase == "prefill" else "decode"]
    if target == "cpu":
        valid = f"{base.valid} AND t.cpu_s > 0 AND isfinite(t.cpu_s)"
        base = replace(base, target="t.cpu_s", valid=valid)
    if form.phase == "prefill":
        if form.name == "paper":
            return base
        uc = f"CASE WHEN t.t_uc > 0 THEN greatest(t.t_uc::DOUBLE, {form.knee_tokens!r}) ELSE t.t_uc::DOUBLE END"
        if form.name == "floor":
            return PhaseSql(
                base.table, form.terms, (uc, *base.features[1:]), base.valid, False, base.target
            )
        # roofline: + sum t_c (KV read) + phi(sum t_uc) (m.log_base = ln(1 - k/E), 0 if dense)
        extra = ("t.t_c::DOUBLE", "1.0 - exp(t.t_uc * m.log_base)")
        valid = f"{base.valid} AND t.t_c >= 0"
        features = (uc, *base.features[1:], *extra)
        return PhaseSql(base.table, form.terms, features, valid, True, base.target)
    if form.phase == "decode" and form.name == "ctx":
        return PhaseSql(
            base.table,
            form.terms,
            (*base.features, "t.ctx_tokens::DOUBLE"),
            f"{base.valid} AND t.ctx_tokens >= 0",
            True,
            base.target,
        )
    if form.phase == "decode":
        return base
    raise ValueError(f"{form.label}: mixed iterations are not logged in the SPEC §3 tables")


def _choose(
    node: int,
    phase: Phase,
    forms: tuple[Form, ...],
    aggs: dict[str, dict[int, Agg]],
    problem: str | None,
    bootstrap: int,
    ci: CiMethod,
    seed: int,
) -> tuple[PhaseFit, list[str], Form | None]:
    where = f"node {node} {phase}"
    first = aggs[forms[0].label].get(node)
    if first is None:
        return PhaseFit(phase, None, 0, message=f"{where}: no {phase} iterations logged"), [], None
    notes = []
    if first.num_invalid:
        notes.append(
            f"{first.num_invalid} iterations excluded (duration_s <= 0, non-finite, negative or missing values)"
        )
    if problem is not None:
        valid = first.num_train + first.num_test
        return (
            PhaseFit(
                phase, None, 0, first.num_test, message=f"{where}: {valid} iterations but {problem}"
            ),
            notes,
            None,
        )
    need = 2 * len(forms[0].terms) + 2
    if first.num_train < need:
        detail = f"{first.num_train + first.num_test} valid, {first.num_test} held out"
        if first.num_invalid:
            detail += f", {first.num_invalid} excluded"
        msg = (
            f"{where}: only {first.num_train} training iterations ({detail}), need at least {need}"
        )
        return PhaseFit(phase, None, first.num_train, first.num_test, message=msg), notes, None
    scored = [Candidate(f, aggs[f.label][node].buckets) for f in forms if node in aggs[f.label]]
    try:
        choice = choose_form(
            scored,
            folds=CV_FOLDS,
            always=(forms[0].terms[0],),
            interval=None if bootstrap <= 0 else "robust" if ci == "time" else "bootstrap",
            resamples=bootstrap,
            seed=seed,
        )
    except FitError as exc:
        msg = f"{where}: {exc}"
        return PhaseFit(phase, None, first.num_train, first.num_test, message=msg), notes, None
    if choice.ci_note is not None:
        notes.append(f"no confidence interval: {choice.ci_note}")
    agg = aggs[choice.form.label][node]
    cv = tuple((s.form.label, s.cv_rmse) for s in choice.scores)
    fit = PhaseFit(
        phase,
        choice.coef,
        agg.num_train,
        agg.num_test,
        None,
        choice.ci,
        choice.fixed,
        None,
        choice.form.label,
        choice.form.terms,
        cv,
    )
    return fit, notes, choice.form


def _pools(form: str) -> dict[Phase, tuple[Form, ...]]:
    """Each phase's candidates; a form of one phase only (floor, ctx) leaves the other on
    its paper form."""
    pools: dict[Phase, tuple[Form, ...]] = {}
    problems = []
    for phase in PHASES:
        try:
            pools[phase] = candidates(phase, form)
        except ValueError as exc:
            problems.append(str(exc))
            pools[phase] = candidates(phase, "paper")
    if len(problems) == len(PHASES):
        raise FitInputError(f"unknown form {form!r}; forms: auto, paper, floor, roofline, ctx")
    return pools


def fit_run_forms(
    db: str | Path | _Reader,
    run_id: str | None = None,
    node_ids: Iterable[int] | None = None,
    *,
    form: str = "auto",
    holdout: float = 0.2,
    bootstrap: int = 200,
    ci: CiMethod = "time",
    seed: int = 0,
    target: Target = "auto",
) -> RunFit:
    """Fit each node's prefill and decode with the form `form` names ('auto': chosen by CV).

    `target` is what the forms predict: "wall" the pass's duration_s, "cpu" the engine
    thread's CPU time over it (cpu_s: the pass's work without the time a loaded host gave
    other processes), "auto" cpu_s for a phase whose every row of the run has it, else
    duration_s. Same contract as toolkit.fit.run.fit_run (never raises for one node's bad
    data; FitInputError when the database or run cannot be fitted at all).
    """
    if target not in ("auto", "wall", "cpu"):
        raise FitInputError(f"target must be auto, wall or cpu, got {target!r}")
    if not 0.0 <= holdout < 1.0:
        raise FitInputError(f"holdout must be a fraction in [0, 1), got {holdout}")
    if bootstrap < 0:
        raise FitInputError(f"bootstrap must be >= 0 resamples, got {bootstrap}")
    if ci not in ("time", "rows"):
        raise FitInputError(f"ci must be 'time' or 'rows', got {ci!r}")
    pools = _pools(form)
    threshold = round(holdout * HASH_MOD)
    wanted = None if node_ids is None else sorted({int(n) for n in node_ids})
    bucket_sql = TIME_BUCKET_SQL if ci == "time" else None
    with _connect(db) as (con, label, db_tables):
        run, note = _checked_run(con, label, db_tables, run_id)
        shapes = _moe_shapes(con, run)
        bases = _log_bases(shapes)
        targets = {p: _target(con, run, p, target) for p in PHASES}
        ratios = {p: _wall_per_cpu(con, run, p) if targets[p] == "cpu" else {} for p in PHASES}
        aggs = {
            phase: {
                f.label: aggregate(
                    con, form_sql(f, targets[phase]), run, wanted, threshold, bases, bucket_sql
                )
                for f in pools[phase]
            }
            for phase in PHASES
        }
        seen = {n for phase in PHASES for per in aggs[phase].values() for n in per}
        nodes = sorted(set(shapes) | seen)
        if wanted is not None:
            unknown = [n for n in wanted if n not in nodes]
            if unknown:
                raise FitInputError(f"node(s) {unknown} not in run {run!r}; nodes: {nodes}")
            nodes = wanted
        results: dict[Phase, dict[int, tuple[PhaseFit, list[str]]]] = {}
        for phase in PHASES:
            per: dict[int, tuple[PhaseFit, list[str]]] = {}
            chosen: dict[str, tuple[Form, dict[int, tuple[float, ...]]]] = {}
            for n in nodes:
                problem = _moe_problem(shapes.get(n)) if phase == "decode" else None
                fit, notes, f = _choose(
                    n, phase, pools[phase], aggs[phase], problem, bootstrap, ci, seed
                )
                if targets[phase] == "cpu":
                    fit = fit._replace(target="cpu_s", wall_per_cpu=ratios[phase].get(n))
                per[n] = (fit, notes)
                if f is not None and fit.coef is not None:
                    chosen.setdefault(f.label, (f, {}))[1][n] = fit.coef
            for f, coefs in chosen.values():
                for n, (count, value) in heldout_mape(
                    con, form_sql(f, targets[phase]), run, threshold, coefs, bases
                ).items():
                    fit, notes = per[n]
                    per[n] = (fit._replace(mape=value, samples_test=count), notes)
            results[phase] = per
    return _assemble(
        run,
        nodes,
        results,
        shapes,
        holdout,
        note,
        lambda fit: (
            ([f"form {fit.form} chosen by {CV_FOLDS}-fold CV ({ci} buckets)"] if fit.cv else [])
            + _target_note(fit)
        ),
    )


def _target(con: Any, run: str, phase: Phase, target: Target) -> str:
    """The phase's fitted quantity: "cpu" where asked, or ("auto") where every row has it."""
    if target != "auto":
        return target
    table = PHASE_SQL[phase].table
    cols = {
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]
        ).fetchall()
    }
    if "cpu_s" not in cols:
        return "wall"
    n, with_cpu = con.execute(
        f"SELECT count(*), count(cpu_s) FROM {table} WHERE run_id = ?", [run]
    ).fetchall()[0]
    return "cpu" if n and n == with_cpu else "wall"


def _wall_per_cpu(con: Any, run: str, phase: Phase) -> dict[int, float]:
    """Per node, its passes' summed wall time over their summed CPU time."""
    rows = con.execute(
        f"SELECT node_id, fsum(duration_s) / fsum(cpu_s) FROM {PHASE_SQL[phase].table} "
        "WHERE run_id = ? AND cpu_s > 0 GROUP BY node_id",
        [run],
    ).fetchall()
    return {int(n): float(r) for n, r in rows if r is not None}


def _target_note(fit: PhaseFit) -> list[str]:
    if fit.target != "cpu_s":
        return []
    ratio = "" if fit.wall_per_cpu is None else f"; its wall time was {fit.wall_per_cpu:.2f}x"
    return [
        "fitted on cpu_s, the engine thread's CPU time of each pass (the pass's work; the "
        f"rest of its wall time it waited for a core or the GIL{ratio})"
    ]


def node_models(
    fit: RunFit,
    moe: dict[int, tuple[int, int]] | None = None,
    *,
    t_fwd: float = 1.0,
    mean_new_tokens: float = 8192.0,
) -> dict[int, NodeModel]:
    """The control plane's models (router, planner) of every node fitted in both phases,
    with each phase's chosen form (its extra terms used by NodeModel's Eq. 3-4).

    `moe` maps a node to its (top_k, num_experts) (dense when absent).
    """
    out: dict[int, NodeModel] = {}
    for n in fit.nodes:
        if n.prefill.coef is None or n.decode.coef is None:
            continue
        k, e = (moe or {}).get(n.node_id, (0, 0))
        pre = prefill_model(form_by_label("prefill", n.prefill.form), n.prefill.coef, k, e)
        dec = decode_model(form_by_label("decode", n.decode.form), n.decode.coef, k, e, t_fwd)
        out[n.node_id] = NodeModel(pre, dec, mean_new_tokens=mean_new_tokens)
    return out
