"""The one form-selection routine (models.selection.choose_form): score, select, refit and
bound, as `pdlab fit`, the simulator's warmup and `pdlab profile import` use it."""

from __future__ import annotations

import numpy as np
import pytest

from models.fitting import FitError, GramStats, bootstrap_ci, fit_from_gram
from models.forms import DECODE_CTX, DECODE_PAPER
from models.selection import Candidate, choose_form, cross_validate, robust_ci


def _decode(
    n: int, seed: int, truth: tuple[float, ...]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 64, n).astype(float)
    rows = {"batch_size": b, "t_fwd": np.ones(n), "ctx_tokens": b * rng.uniform(1e3, 6e4, n)}
    x = (DECODE_CTX if len(truth) == 4 else DECODE_PAPER).design(rows, 8, 256)
    return rows, (x @ np.array(truth)) * np.exp(rng.normal(0, 0.02, n))


def _buckets(x: np.ndarray, y: np.ndarray, ids: np.ndarray) -> list[GramStats]:
    return [GramStats.from_rows(x[ids == b], y[ids == b]) for b in np.unique(ids)]


def test_the_steps_agree_with_their_parts() -> None:
    """score = cross_validate per form, select = one-SE rule, refit = NNLS on all rows,
    interval = the robust block bootstrap on the chosen form's blocks."""
    rows, y = _decode(3000, 1, (0.012, 0.015, 2.8e-4, 1e-9))
    ids = np.arange(len(y)) % 10
    cands = [
        Candidate(f, _buckets(f.design(rows, 8, 256), y, ids)) for f in (DECODE_PAPER, DECODE_CTX)
    ]
    got = choose_form(cands, always=("d0",), interval="robust", resamples=50, seed=3)
    assert got.form is DECODE_CTX
    assert [s.cv_rmse for s in got.scores] == [
        cross_validate(c.form, c.buckets, always=("d0",)).cv_rmse for c in cands
    ]
    total = GramStats.zeros(4)
    for b in cands[1].buckets:
        total = total + b
    coef, fixed = fit_from_gram(total, DECODE_CTX.terms, always=("d0",))
    assert got.coef == tuple(float(c) for c in coef) and got.fixed == fixed
    assert got.ci == robust_ci(cands[1].buckets, DECODE_CTX.terms, got.coef, resamples=50, seed=3)
    assert got.ci_note is None


def test_a_lone_form_is_a_plain_fit_unless_scored() -> None:
    rows, y = _decode(400, 2, (0.01, 0.02, 3e-4))
    x = DECODE_PAPER.design(rows, 8, 256)
    one = [Candidate(DECODE_PAPER, [GramStats.from_rows(x, y)])]  # one bucket: no CV possible
    plain = choose_form(one, interval="bootstrap")
    assert plain.scores == () and plain.ci is None
    assert plain.ci_note is not None and "two non-empty buckets" in plain.ci_note
    assert np.allclose(plain.coef, (0.01, 0.02, 3e-4), rtol=0.05)
    with pytest.raises(FitError, match="no form could be fitted"):
        choose_form(one, score_one=True)


def test_rows_and_blocks_given_apart_are_used_for_the_refit_and_interval() -> None:
    rows, y = _decode(2000, 4, (0.012, 0.015, 2.8e-4))
    x = DECODE_PAPER.design(rows, 8, 256)
    folds = _buckets(x, y, np.arange(len(y)) % 20)
    blocks = _buckets(x, y, np.arange(len(y)) * 8 // len(y))
    asked: list[int] = []

    def lazy() -> list[GramStats]:
        asked.append(1)
        return blocks

    all_rows = GramStats.from_rows(x, y)
    got = choose_form(
        [Candidate(DECODE_PAPER, folds, all_rows, lazy)],
        interval="bootstrap",
        resamples=40,
        seed=1,
    )
    coef, _ = fit_from_gram(all_rows, DECODE_PAPER.terms)
    assert got.coef == tuple(float(c) for c in coef)
    assert got.ci == bootstrap_ci(blocks, DECODE_PAPER.terms, resamples=40, seed=1)
    assert asked == [1]
    # Blocks of a form that is not chosen are never computed.
    ctx_x = DECODE_CTX.design(rows, 8, 256)
    never = Candidate(DECODE_CTX, _buckets(ctx_x, y, np.arange(len(y)) % 20), None, lambda: 1 / 0)
    assert (
        choose_form([Candidate(DECODE_PAPER, folds), never], interval="robust").form is DECODE_PAPER
    )


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        choose_form([])
    rows, y = _decode(200, 5, (0.01, 0.02, 3e-4))
    x = DECODE_PAPER.design(rows, 8, 256)
    with pytest.raises(ValueError, match="interval must be"):
        choose_form([(DECODE_PAPER, _buckets(x, y, np.arange(200) % 4))], interval="bogus")  # type: ignore[arg-type]
