"""Eq. 1-2 against iteration times composed from real GPU profiles (toolkit.profiles.real,
toolkit.profiles.real_report).

Findings asserted here (run with -s to see the full per-size tables):
- A100 (vidur): the prefill model fitted on every composed point predicts iterations of
  >= 512 tokens within ~2.4% held-out MAPE (paper: 2.6% single / 1.9% batches on H200);
  small, latency-bound chunks are worse (7-9% below 512 tokens).
- H100 (LLMServingSim, Llama-3.1-70B TP4): the profile's grid puts most single-request
  points at 32-128-token chunks that sit on the memory-bound floor of the linear layers
  (flat up to ~256 tokens). One straight line in t_uc cannot follow that knee, so the fit on
  all points reaches only ~8.7% at >= 512 tokens; fitted on the >= 512-token iterations an
  engine with 512-token chunks would log, it reaches ~6%. We assert what is true.
- Decode: Eq. 2 has no context term, so one fit over contexts of 32-4032 tokens per request
  is off by ~13%; at a fixed context it holds within ~2.6% (A100).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.estimators import PrefillRegressor
from telemetry import TelemetryWriter
from toolkit.fit.run import fit_run
from toolkit.profiles.real import compose_decode, compose_prefill, load_profile
from toolkit.profiles.real_report import SERVING_MIN_TOKENS, ProfileReport, format_report, validate


@pytest.fixture(scope="module")
def a100() -> ProfileReport:
    report = validate("a100")
    print("\n" + format_report(report))
    return report


@pytest.fixture(scope="module")
def h100() -> ProfileReport:
    report = validate("h100")
    print("\n" + format_report(report))
    return report


def test_composition_uses_only_measured_points() -> None:
    prof = load_profile("a100")
    pre = compose_prefill(prof, num_batches=500, seed=3)
    grid = set(prof.linear["tokens"].to_list())
    assert set(pre["t_uc"].to_list()) <= grid  # every iteration's token count was measured
    singles = pre.filter(pl.col("kind") == "single")
    assert singles.height == prof.prefill_attention.height
    batches = pre.filter(pl.col("kind") == "batch")
    assert (
        batches.height == 500 and batches["num_reqs"].min() >= 2 and batches["num_reqs"].max() <= 8
    )
    # One measured single point recomputed by hand: 32 layers x (attention + linear) + embedding.
    row = singles.filter((pl.col("t_uc") == 1024) & (pl.col("t_c") == 1024)).row(0, named=True)
    att = prof.prefill_attention.filter((pl.col("chunk") == 1024) & (pl.col("kv") == 1024))[
        "attn_s"
    ][0]
    lin = prof.linear.filter(pl.col("tokens") == 1024).row(0, named=True)
    assert row["duration_s"] == pytest.approx(32 * (att + lin["layer_s"]) + lin["iter_s"])
    assert row["attn_pairs"] == 1024 * 1024 + 1024 * 1025 / 2
    dec = compose_decode(prof)
    assert set(dec["batch_size"].to_list()) <= grid


def test_a100_prefill_within_7_percent_in_the_serving_regime(a100: ProfileReport) -> None:
    p = a100.prefill
    assert p.serving_mape <= 0.07
    assert p.serving_mape <= 0.05  # SPEC §8 target on real timings
    assert p.serving_mape_single <= 0.07 and p.serving_mape_batch <= 0.07
    # Where the form falls short: every bucket below 512 tokens is worse than the regime.
    small = [b for b in p.by_tokens if b.hi <= SERVING_MIN_TOKENS]
    assert small and all(b.mape > p.serving_mape for b in small)
    assert sum(b.points for b in p.by_tokens) == p.points  # no point left out of the table
    assert all(c >= 0 for c in p.coef) and p.coef[3] == 0.0  # no host restores in a profile


def test_h100_prefill_reports_the_floor_it_cannot_follow(h100: ProfileReport) -> None:
    p = h100.prefill
    assert sum(b.points for b in p.by_tokens) == p.points
    assert p.serving_mape <= 0.10  # all-points fit: pulled by the small-chunk floor (see top)
    assert p.serving_only_mape <= 0.07  # fitted on the regime an engine logs
    assert p.separate["batch"][1] <= 0.07


def test_decode_holds_at_fixed_context_but_not_across_contexts(a100: ProfileReport) -> None:
    d = a100.decode
    assert d.coef[1] == 0.0  # dense model: phi = 0, d1 fixed
    assert d.fixed_context_mape <= 0.05 and d.fixed_context_worst <= 0.07
    assert d.mape > 2 * d.fixed_context_mape  # the missing context term, shown not hidden
    assert sum(b.points for b in d.by_kv) == d.points


def test_pdlab_fit_on_real_profile_iterations(tmp_path: Path) -> None:
    """The composed A100 iterations as telemetry: fit_run agrees with the estimator."""
    prof = load_profile("a100")
    pre = compose_prefill(prof, num_batches=1000, seed=1)
    dec = compose_decode(prof)
    db = tmp_path / "a100.duckdb"
    with TelemetryWriter(db, run_id="a100-profile", source="profile") as w:
        w.add_nodes(
            [{"node_id": 0, "name": "a100", "hardware": "A100", "moe_top_k": 0, "moe_experts": 0}]
        )
        w.append(
            "prefill_iterations",
            pre.select(
                pl.lit(0).alias("node_id"),
                pl.int_range(pl.len()).alias("iter_id"),
                pl.col("duration_s").cum_sum().alias("t_start"),
                "duration_s",
                "num_reqs",
                "t_uc",
                "attn_pairs",
                "t_rst",
                "t_c",
            ),
        )
        w.append(
            "decode_iterations",
            dec.select(
                pl.lit(0).alias("node_id"),
                pl.int_range(pl.len()).alias("iter_id"),
                pl.col("duration_s").cum_sum().alias("t_start"),
                "duration_s",
                "batch_size",
                "t_fwd",
                (pl.col("kv") * pl.col("batch_size")).alias("ctx_tokens"),
            ),
        )
    fit = fit_run(db, holdout=0.0, bootstrap=0).nodes[0]
    x = pre.select("t_uc", "attn_pairs", "t_rst").to_numpy().astype(np.float64)
    expect = PrefillRegressor().fit(x, pre["duration_s"].to_numpy()).coef_
    np.testing.assert_allclose(fit.prefill.coef, expect, rtol=1e-8)
    assert fit.decode.fixed == ("d1",) and "dense model" in fit.decode.message
    held = fit_run(db, bootstrap=50).nodes[0]
    assert held.prefill.mape < 0.06 and held.decode.mape is not None


def test_unknown_profile_and_missing_data_are_clear(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="profiles: a100, h100"):
        load_profile("tpu")
    with pytest.raises(FileNotFoundError, match="PDLAB_DATA_DIR"):
        load_profile("a100", tmp_path)
