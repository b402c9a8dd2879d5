"""Model forms (models.forms) chosen by evidence (models.selection) and the optional terms of
the models."""

from __future__ import annotations

import numpy as np
import pytest

from models import DecodeModel, MeanWork, NodeModel, PrefillModel
from models.fitting import FitError, GramStats, bootstrap_ci
from models.forms import (
    DECODE_CTX,
    DECODE_PAPER,
    PREFILL_PAPER,
    candidates,
    decode_model,
    form_by_label,
    prefill_floor,
    prefill_model,
    prefill_roofline,
)
from models.iteration import phi
from models.selection import choose_form, cross_validate, relative_rmse, robust_ci, time_blocks


def _buckets(x: np.ndarray, y: np.ndarray, ids: np.ndarray) -> list[GramStats]:
    return [GramStats.from_rows(x[ids == b], y[ids == b]) for b in np.unique(ids)]


def _decode_rows(n: int, seed: int, ctx_per_req: np.ndarray | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 64, n).astype(float)
    per = rng.uniform(1_000, 60_000, n) if ctx_per_req is None else ctx_per_req
    return {"batch_size": b, "t_fwd": np.ones(n), "ctx_tokens": b * per}


def _scored(forms, rows, y, k=8, e=256, nb=20, seed=0):  # type: ignore[no-untyped-def]
    ids = np.random.default_rng(seed).permutation(len(y)) % nb
    return [(f, _buckets(f.design(rows, k, e), y, ids)) for f in forms]


def test_decode_ctx_is_chosen_when_the_truth_reads_the_context() -> None:
    rows = _decode_rows(4000, 1)
    truth = (0.012, 0.015, 2.8e-4, 1e-9)
    x = DECODE_CTX.design(rows, 8, 256)
    noise = np.exp(np.random.default_rng(2).normal(0, 0.02, len(x)))
    y = (x @ np.array(truth)) * noise
    choice = choose_form(_scored((DECODE_PAPER, DECODE_CTX), rows, y))
    assert choice.form is DECODE_CTX
    assert np.allclose(choice.coef, truth, rtol=0.05)
    scores = {s.form.label: s.cv_rmse for s in choice.scores}
    assert scores["ctx"] < scores["paper"]


def test_paper_is_kept_when_extra_terms_do_not_help() -> None:
    """The one-SE rule: a form earns its extra terms only by held-out error."""
    rows = _decode_rows(4000, 3)
    x = DECODE_PAPER.design(rows, 8, 256)
    y = (x @ np.array([0.012, 0.015, 2.8e-4])) * np.exp(
        np.random.default_rng(4).normal(0, 0.03, len(x))
    )
    choice = choose_form(_scored((DECODE_PAPER, DECODE_CTX), rows, y))
    assert choice.form is DECODE_PAPER
    assert len(choice.coef) == 3


def test_prefill_floor_finds_the_knee_of_weight_bound_gemms() -> None:
    uc = np.repeat(2.0 ** np.arange(0, 12), 30)
    rows = {"t_uc": uc, "attn_pairs": uc * (uc + 1) / 2, "t_rst": 0 * uc}
    y = 0.002 + 5e-5 * np.maximum(uc, 256) + 1e-9 * rows["attn_pairs"]
    y = y * np.exp(np.random.default_rng(5).normal(0, 0.01, len(y)))
    choice = choose_form(_scored(candidates("prefill", "floor"), rows, y, 0, 0))
    assert choice.form.name == "floor" and choice.form.knee_tokens == 256
    paper = choose_form(_scored((PREFILL_PAPER,), rows, y, 0, 0), score_one=True)
    best = min(choice.scores, key=lambda s: s.cv_rmse)
    assert best.cv_rmse < 0.02 < paper.scores[0].cv_rmse


def test_roofline_prices_kv_read_and_experts_touched() -> None:
    rng = np.random.default_rng(6)
    uc = rng.integers(1, 2048, 3000).astype(float)
    tc = rng.integers(0, 16384, 3000).astype(float)
    rows = {"t_uc": uc, "attn_pairs": uc * tc + uc * (uc + 1) / 2, "t_rst": 0 * uc, "t_c": tc}
    form = prefill_roofline(64)
    x = form.design(rows, 8, 128)
    truth = np.array([0.004, 1.5e-5, 2e-9, 0.0, 9e-7, 0.04])
    y = x @ truth
    choice = choose_form(_scored(candidates("prefill"), rows, y, 8, 128))
    assert choice.form.name == "roofline"
    model = prefill_model(choice.form, choice.coef, 8, 128)
    one = {"t_uc": 1000.0, "attn_pairs": 1000 * 2000 + 500500.0, "t_rst": 0.0, "t_c": 2000.0}
    want = (form.design({k: np.array([v]) for k, v in one.items()}, 8, 128) @ truth)[0]
    got = model.iteration_time(one["t_uc"], one["attn_pairs"], 0.0, one["t_c"])
    assert got == pytest.approx(want, rel=0.02)


def test_cross_validation_needs_two_buckets() -> None:
    rows = _decode_rows(50, 7)
    x = DECODE_PAPER.design(rows, 8, 256)
    y = x @ np.array([0.01, 0.01, 1e-4])
    with pytest.raises(FitError, match="two non-empty buckets"):
        cross_validate(DECODE_PAPER, [GramStats.from_rows(x, y)])
    assert relative_rmse(GramStats.from_rows(x, y), np.array([0.01, 0.01, 1e-4])) < 1e-12


def test_robust_ci_covers_the_truth_when_the_context_mix_drifts() -> None:
    """Nine identical nodes whose context mix drifts over time differently: row-hash buckets
    give tight, disjoint intervals for d2 when the form misses the context term, the ctx form
    with time-block intervals covers the truth on every node."""
    truth = np.array([0.012, 0.015, 2.8e-4, 1e-9])
    lows_paper, highs_paper, covered = [], [], 0
    for node in range(9):
        rng = np.random.default_rng(100 + node)
        n = 20_000
        t = np.sort(rng.uniform(0, 1800, n))
        # Each node's context mix has its own mean and drifts over the run.
        drift = (15_000 + 6_000 * node) * (1.0 + 0.5 * np.sin(t / 300 + node))
        rows = _decode_rows(n, 200 + node, rng.uniform(0.5, 1.5, n) * drift)
        y = (DECODE_CTX.design(rows, 8, 256) @ truth) * np.exp(rng.normal(0, 0.03, n) - 0.00045)
        hashed = rng.permutation(n) % 64
        xp = DECODE_PAPER.design(rows, 8, 256)
        paper = choose_form([(DECODE_PAPER, _buckets(xp, y, hashed))])
        ci_p = bootstrap_ci(_buckets(xp, y, hashed), DECODE_PAPER.terms)
        lows_paper.append(ci_p[2][0])
        highs_paper.append(ci_p[2][1])
        blocks = time_blocks(t, 20)
        xc = DECODE_CTX.design(rows, 8, 256)
        bc = _buckets(xc, y, blocks)
        ctx = choose_form([(DECODE_CTX, bc)])
        ci = robust_ci(bc, DECODE_CTX.terms, ctx.coef)
        covered += ci[2][0] <= truth[2] <= ci[2][1]
        assert paper.coef[2] > truth[2]  # d2 absorbs the context when d3 is missing
    assert covered >= 8
    assert min(highs_paper) < max(lows_paper)  # the paper form's row intervals disagree


def test_time_blocks_split_the_span_evenly() -> None:
    t = np.array([0.0, 1.0, 2.0, 9.99, 10.0])
    assert time_blocks(t, 5).tolist() == [0, 0, 1, 4, 4]
    assert time_blocks(np.array([3.0, 3.0]), 5).tolist() == [0, 0]
    assert time_blocks(np.array([]), 5).size == 0


def test_forms_by_label_and_names() -> None:
    assert form_by_label("prefill", "floor@256") == prefill_floor(256)
    assert form_by_label("prefill", "roofline@64").terms == ("c0", "c1", "c2", "c3", "c4", "c5")
    assert form_by_label("decode", "ctx") is DECODE_CTX
    with pytest.raises(ValueError, match="unknown decode form"):
        candidates("decode", "floor")
    assert prefill_floor(128).label == "floor@128" and DECODE_PAPER.label == "paper"


def test_models_take_the_extra_terms_and_default_to_the_paper() -> None:
    p = PrefillModel(0.01, 1e-5, 1e-9, 0.0)
    assert p.iteration_time(10, 55) == pytest.approx(0.01 + 1e-4 + 55e-9)
    floor = PrefillModel(0.01, 1e-5, 1e-9, 0.0, knee_tokens=256)
    assert floor.iteration_time(10, 55) == pytest.approx(0.01 + 256e-5 + 55e-9)
    assert floor.iteration_time(1000, 0) == pytest.approx(0.01 + 1e-2)
    assert floor.predict(np.array([[10.0, 55.0, 0.0]]))[0] == pytest.approx(
        floor.iteration_time(10, 55)
    )
    roof = PrefillModel.from_coef([0.01, 1e-5, 1e-9, 0, 1e-6, 0.02], 0, top_k=8, num_experts=128)
    assert roof.iteration_time(4, 10, 0, 1000) == pytest.approx(
        0.01 + 4e-5 + 1e-8 + 1e-3 + 0.02 * phi(4, 8, 128)
    )
    d = DecodeModel.from_coef([0.01, 0.02, 1e-4, 1e-9], 8, 256)
    assert d.coef == (0.01, 0.02, 1e-4) and d.coef_ctx[3] == 1e-9
    assert d.iteration_time(10, ctx_tokens=1e6) == pytest.approx(
        DecodeModel(0.01, 0.02, 1e-4).iteration_time(10) + 1e-3
    )
    assert decode_model(DECODE_CTX, [0.01, 0.02, 1e-4, 1e-9], 8, 256) == d
    with pytest.raises(ValueError, match="3 coefficients"):
        DecodeModel.from_coef([1.0, 2.0])


def test_occupancy_uses_the_extra_terms_only_when_present() -> None:
    w = MeanWork(t_uc=100, attn_pairs=5050 + 100 * 900, t_c=900, t_out=200)
    base = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 0.0), DecodeModel(0.012, 0.0, 2.8e-4, 8, 0))
    ctx = NodeModel(base.prefill, DecodeModel(0.012, 0.0, 2.8e-4, 8, 0, d3=1e-9))
    b = 16
    extra = 1e-9 * b * (w.t_in + w.t_out / 2) * w.t_out / b
    assert ctx.decode_request_time(w, b) - base.decode_request_time(w, b) == pytest.approx(extra)
    floor = NodeModel(
        PrefillModel(0.03, 8e-5, 4e-10, 0.0, knee_tokens=512), base.decode, mean_new_tokens=256
    )
    diff = floor.prefill_request_time(w) - NodeModel(
        base.prefill, base.decode, 256
    ).prefill_request_time(w)
    assert diff == pytest.approx(8e-5 * 100 * (512 / 256 - 1))
