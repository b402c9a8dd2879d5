"""Choosing a model form by evidence: score -> select -> refit -> interval (paper 000 App. B.4).

One routine, `choose_form`, serves every caller that fits the forms of models.forms:
`pdlab fit` (per node and phase, from Gram statistics summed in SQL), the simulator's
warmup (per node, on its own iterations) and `pdlab profile import` (per phase of a
composed grid). Each gives its candidates as `Candidate`s, simplest first:

1. score: K-fold cross-validation of each form's relative error over its buckets (fold =
   bucket index mod K), from Gram statistics alone (`cross_validate`);
2. select: the simplest form within one standard error of the best (the one-standard-error
   rule): a form earns its extra terms only when the held-out error says so;
3. refit: the chosen form on all its rows (relative-error NNLS, models.fitting);
4. interval (optional): 95% intervals of its coefficients, by resampling blocks of rows,
   either plainly (`"bootstrap"`: sampling noise) or padded for model error (`"robust"`:
   `robust_ci`).

A lone candidate is a plain fit (refit and interval) unless `score_one` asks for its score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from models.fitting import FitError, GramStats, bootstrap_ci, fit_from_gram

if TYPE_CHECKING:
    from models.forms import Form

FloatArray = npt.NDArray[np.float64]
Interval = Literal["robust", "bootstrap"]
CV_FOLDS = 5


class Candidate(NamedTuple):
    """A form and its rows as Gram statistics.

    `buckets` are the cross-validation's buckets (and, unless given apart, the refit's rows
    and the interval's blocks); `rows` all rows at once where the caller has them (the
    refit then uses them instead of the buckets' sum); `blocks` the interval's blocks, or a
    function giving them (computed only for the chosen form).
    """

    form: Form
    buckets: Sequence[GramStats]
    rows: GramStats | None = None
    blocks: Sequence[GramStats] | Callable[[], Sequence[GramStats]] | None = None


class FormScore(NamedTuple):
    """Cross-validated relative RMSE of one form: mean over folds and its standard error."""

    form: Form
    cv_rmse: float
    cv_se: float
    folds: int


class Selection(NamedTuple):
    """The chosen form, its coefficients on all rows (terms `fixed` at 0), every scored
    candidate's score (empty for a lone unscored one) and, when asked, its 95% interval or
    why there is none (`ci_note`)."""

    form: Form
    coef: tuple[float, ...]
    fixed: tuple[str, ...]
    scores: tuple[FormScore, ...]
    ci: tuple[tuple[float, float], ...] | None = None
    ci_note: str | None = None


def relative_rmse(stats: GramStats, coef: FloatArray) -> float:
    """sqrt(mean(((x.c - y) / y)^2)) from Gram statistics alone."""
    if stats.n == 0:
        return float("nan")
    sse = float(coef @ stats.xtx @ coef - 2.0 * stats.xty @ coef + stats.yty)
    return float(np.sqrt(max(sse, 0.0) / stats.n))


def _total(buckets: Sequence[GramStats], p: int) -> GramStats:
    out = GramStats.zeros(p)
    for b in buckets:
        out = out + b
    return out


def cross_validate(
    form: Form, buckets: Sequence[GramStats], folds: int = CV_FOLDS, always: Sequence[str] = ()
) -> FormScore:
    """K-fold CV over buckets (fold = bucket index mod K): relative RMSE per held-out fold."""
    p = len(form.terms)
    usable = [b for b in buckets if b.n > 0]
    k = min(folds, len(usable))
    if k < 2:
        raise FitError(f"cross-validation needs at least two non-empty buckets, got {len(usable)}")
    errs = []
    for f in range(k):
        test = [b for i, b in enumerate(usable) if i % k == f]
        train = [b for i, b in enumerate(usable) if i % k != f]
        coef, _ = fit_from_gram(_total(train, p), form.terms, min_samples=p + 1, always=always)
        errs.append(relative_rmse(_total(test, p), coef))
    e = np.asarray(errs)
    return FormScore(form, float(e.mean()), float(e.std(ddof=1) / np.sqrt(k)), k)


def choose_form(
    candidates: Sequence[Candidate | tuple[Form, Sequence[GramStats]]],
    *,
    folds: int = CV_FOLDS,
    always: Sequence[str] = (),
    score_one: bool = False,
    interval: Interval | None = None,
    resamples: int = 200,
    seed: int = 0,
) -> Selection:
    """Score, select, refit and (with `interval`) bound the chosen form (module docstring).

    Candidates are ordered simplest first. Forms whose data cannot determine them
    (collinear, too few rows) are skipped in scoring; FitError when none can be fitted, or
    when the chosen form cannot be refitted. An interval that cannot be computed leaves
    `ci` None and says why in `ci_note`.
    """
    cands = [Candidate(*c) for c in candidates]
    if not cands:
        raise ValueError("choose_form needs at least one candidate form")
    scores: list[FormScore] = []
    if len(cands) == 1 and not score_one:
        chosen = cands[0]
    else:
        problems: list[str] = []
        for c in cands:
            try:
                scores.append(cross_validate(c.form, c.buckets, folds, always))
            except FitError as exc:
                problems.append(f"{c.form.label}: {exc}")
        if not scores:
            raise FitError("no form could be fitted: " + "; ".join(problems))
        best = min(scores, key=lambda s: s.cv_rmse)
        bar = best.cv_rmse + best.cv_se
        label = next(s for s in scores if s.cv_rmse <= bar).form.label
        chosen = next(c for c in cands if c.form.label == label)
    form = chosen.form
    rows = chosen.rows if chosen.rows is not None else _total(chosen.buckets, len(form.terms))
    coef, fixed = fit_from_gram(rows, form.terms, always=always)
    coefs = tuple(float(c) for c in coef)
    if interval is None:
        return Selection(form, coefs, fixed, tuple(scores))
    blocks = chosen.blocks if chosen.blocks is not None else chosen.buckets
    try:
        ci = _interval(
            interval, blocks() if callable(blocks) else blocks, form, coefs, resamples, seed
        )
    except FitError as exc:
        return Selection(form, coefs, fixed, tuple(scores), None, str(exc))
    return Selection(form, coefs, fixed, tuple(scores), ci)


def _interval(
    kind: Interval,
    blocks: Sequence[GramStats],
    form: Form,
    coef: tuple[float, ...],
    resamples: int,
    seed: int,
) -> tuple[tuple[float, float], ...]:
    if kind == "robust":
        return robust_ci(blocks, form.terms, coef, resamples=resamples, seed=seed)
    if kind == "bootstrap":
        return bootstrap_ci(blocks, form.terms, resamples=resamples, seed=seed)
    raise ValueError(f"interval must be 'robust' or 'bootstrap', got {kind!r}")


def robust_ci(
    buckets: Sequence[GramStats],
    terms: Sequence[str],
    coef: Sequence[float],
    *,
    resamples: int = 200,
    seed: int = 0,
) -> tuple[tuple[float, float], ...]:
    """95% intervals that cover model error, not only sampling noise.

    `buckets` are contiguous blocks of rows (time windows of the run, or clusters of a
    profile grid): resampling whole blocks keeps whatever the form misses inside a block
    (a drifting context mix, a regime the form bends around) in every resample, so the
    spread of the coefficients reflects it (a block bootstrap). Each side is then widened
    by 2*s^2*|coef|, s the relative RMSE of the fit: relative-error least squares under
    multiplicative noise is biased low by about s^2 of each coefficient, which no
    resampling shows.
    """
    p = len(terms)
    s = relative_rmse(_total(buckets, p), np.asarray(coef, dtype=np.float64))
    ci = bootstrap_ci(buckets, terms, resamples=resamples, seed=seed)
    pad = 2.0 * s * s
    # NNLS coefficients are >= 0, so an interval never reaches below 0.
    return tuple(
        (max(min(lo, c) - pad * abs(c), 0.0), max(hi, c) + pad * abs(c))
        for (lo, hi), c in zip(ci, coef, strict=True)
    )


def time_blocks(t: FloatArray, num_blocks: int = 20) -> npt.NDArray[np.int64]:
    """Block index of each row: `num_blocks` equal windows over the rows' own time span."""
    x = np.asarray(t, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return np.zeros(x.size, dtype=np.int64)
    return np.minimum(((x - lo) / (hi - lo) * num_blocks).astype(np.int64), num_blocks - 1)
