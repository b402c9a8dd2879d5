"""`pdlab validate`: every imported real run through the twin, the interface's JSON shape, the
A6000 prefix-caching runs within the issue's bounds, the silicon hook."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from toolkit.cli import app
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.plots import validation_series
from toolkit.samples.lss_a6000 import import_lss_a6000
from toolkit.validate.run import validate_runs

A6000 = BUNDLED / "lss_ispass26_a6000"
runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("validate")
    path = d / "real.duckdb"
    import_lss_a6000(path, A6000, runs=["a6000-fig5-PDD", "a6000-fig7-SD-PC"])
    write_runs(
        path, [read_vllm_bench(BUNDLED / "real_runs/rtx4090_llama31_8b_vllm", run_id="rtx4090")]
    )
    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b",
        ModelShape.load(BUNDLED / "models/meta-llama/Llama-3.1-8B.json"),
    )
    p = d / "rtx4090.profile.json"
    p.write_text(json.dumps(prof.to_json()))
    return path, p


def test_json_has_the_interface_shape_for_every_real_run(db: tuple[Path, Path]) -> None:
    path, prof = db
    res = runner.invoke(
        app, ["validate", str(path), "--profile", f"rtx4090={prof}", "--samples", "100", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    rows = doc["rows"]
    assert {r["run"] for r in rows} == {"a6000-fig5-PDD", "a6000-fig7-SD-PC", "rtx4090"}
    for r in rows:
        assert set(r) >= {"run", "metric", "real", "twin", "error", "ci95", "covered", "peers"}
        assert (
            len(r["ci95"]) == 2 and isinstance(r["covered"], bool) and isinstance(r["peers"], dict)
        )
        assert math.isfinite(r["error"])
    by = {(r["run"], r["metric"]): r for r in rows}
    # the figure-5 PD split: its series against the real one and LLMServingSim's
    span = by[("a6000-fig5-PDD", "span_s")]
    assert span["real"] == 51 and abs(span["error"]) <= 0.03
    mape = by[("a6000-fig5-PDD", "throughput_tick_mape")]
    assert 0 < mape["error"] < 0.3 and 0 < mape["peers"]["LLMServingSim"] < 0.1
    # the benchmark run: the dev run's figures, and LLMServingSim's own summary as the peer
    ttft = by[("rtx4090", "ttft_mean_s")]
    assert abs(ttft["error"]) < 0.02 and ttft["peers"]["LLMServingSim"] == pytest.approx(
        0.0056, abs=1e-3
    )
    assert ttft["error"] == pytest.approx(ttft["twin"] / ttft["real"] - 1)
    for metric in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "throughput_tok_s", "span_s"):
        # the twin's combined interval: request resampling and the model's error, covering
        r = by[("rtx4090", metric)]
        assert r["covered"] and r["known"] and 0 < r["half_width"] < 0.05, metric
        assert {"requests", "profile", "cpu_overhead", "cuda_graph_saving_s"} <= set(r["sources"])


def test_prefix_caching_follows_the_real_run(db: tuple[Path, Path]) -> None:
    """Figure 7, one instance, pulses of shared-prefix requests (issue 22's bounds)."""
    t = validate_runs(db[0], ["a6000-fig7-SD-PC"], samples=100)
    by = {r.metric: r for r in t.rows}
    assert by["prefix_hit_tick_mae"].error < 5.0  # points, every tick
    assert by["kv_mem_tick_wape"].error < 0.10  # KV in use: GPU memory less the weights
    assert by["prefix_hit_tick_mae"].real == pytest.approx(15.06, abs=0.01)  # mean real hit %
    fig = validation_series(t, "a6000-fig7-SD-PC")
    assert {tr.meta["source"] for tr in fig.data} == {"real", "twin"}
    assert {tr.meta["metric"] for tr in fig.data} == {"gpu_mem_mb", "prefix_hit_pct"}


def test_a_benchmark_run_without_a_profile_is_listed_as_skipped(db: tuple[Path, Path]) -> None:
    t = validate_runs(db[0], ["rtx4090"], samples=50)
    assert t.rows == [] and t.skipped == [
        ("rtx4090", "no operator profile given (--profile RUN=PROFILE.json)")
    ]
    res = runner.invoke(app, ["validate", str(db[0]), "--run", "rtx4090", "--samples", "50"])
    assert res.exit_code == 0 and "skipped rtx4090" in res.output


def test_bad_requests_are_one_line_errors(db: tuple[Path, Path], tmp_path: Path) -> None:
    for args, message in (
        (["validate", str(db[0]), "--run", "nope"], "no imported real run 'nope'"),
        (["validate", str(tmp_path / "none.duckdb")], "no such database"),
        (["validate", str(db[0]), "--profile", "rtx4090"], "expected RUN=PROFILE.json"),
        (
            ["validate", str(db[0]), "--profile", f"other={db[1]}"],
            "--profile for other: no such real run",
        ),
        (["validate", "silicon", "x.csv"], "silicon CSV 'x.csv' does not exist"),
        (["validate", str(db[0]), "extra"], "unexpected argument(s) extra"),
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and message in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1
