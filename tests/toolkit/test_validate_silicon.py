"""`pdlab validate silicon`: rows replayed on the twin, compared, counted, stored and drawn.

On the committed slice of AIConfigurator's silicon sample and kernel tables
(tests/fixtures/aiconfigurator, Apache-2.0): six supported rows (Llama-3.1-8B-FP8 and
Qwen3-235B-A22B-FP8 on H200 under vLLM) and six pdlab declines with its reasons.
AIConfigurator's estimator is not installed in CI: its column is tested through
`summarize` on results whose values are given.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.plots.common import is_empty
from toolkit.plots.silicon import silicon_scatter
from toolkit.validate.silicon import RowResult, store, summarize, validate_silicon
from toolkit.validate.silicon_rows import load_rows
from toolkit.validate.silicon_twin import SiliconTwin, Unsupported

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
CSV, SYSTEMS, CONFIGS = FIX / "silicon_sample.csv", FIX / "systems", FIX / "model_configs"


@pytest.fixture(scope="module")
def run() -> tuple[list[RowResult], dict]:
    return validate_silicon(CSV, systems_dir=SYSTEMS, model_dirs=[CONFIGS], use_aic=False)


def test_every_row_is_replayed_or_declined_with_its_reason(
    run: tuple[list[RowResult], dict],
) -> None:
    results, s = run
    assert s["rows_total"] == 12 and len(results) == 12
    assert s["coverage"]["rows"] == 6 and s["coverage"]["share"] == pytest.approx(0.5)
    assert s["unsupported"] == {
        "MLA attention (DeepSeek, Kimi, GLM-5): the twin's attention is per-head GQA": 2,
        "mixed attention layers (full_attention, sliding_attention): one attention kind per model": 2,
        "mixed attention layers (full_attention, linear_attention): one attention kind per model": 2,
    }
    parts = {p["partition"]: p for p in s["partitions"]}
    assert set(parts) == {"h200_sxm/vllm/agg/llama", "h200_sxm/vllm/agg/qwen3-moe"}
    assert parts["h200_sxm/vllm/agg/llama"]["rows"] == 4
    for p in (*parts.values(), s["all"]):
        assert 0 <= p["pdlab"]["ttft_mape"] < 2 and 0 <= p["pdlab"]["tpot_mape"] < 2
        assert p["aiconfigurator"] is None
    for r in results:
        if r.pdlab_ok:
            assert r.pdlab_ttft_ms > 0 and r.pdlab_tpot_ms > 0 and r.requests == 10 * r.concurrency
            assert 0 < r.tpot_floor_ms < r.tpot_ms and r.consistent
            assert r.profile.startswith("h200_sxm/vllm/")


def test_mape_is_over_the_rows_both_tools_predicted(run: tuple[list[RowResult], dict]) -> None:
    results, _ = run
    ok = [r for r in results if r.pdlab_ok]
    # AIConfigurator predicts the measured values exactly on one row and gives none on another
    given = [replace(ok[0], aic_ttft_ms=ok[0].ttft_ms, aic_tpot_ms=ok[0].tpot_ms),
             replace(ok[1], aic_error="PerfDataNotAvailableError: no rows"),
             *[replace(r, aic_ttft_ms=2 * r.ttft_ms, aic_tpot_ms=r.tpot_ms / 2) for r in ok[2:]]]  # fmt: skip
    s = summarize(given, aic_on=True)
    a = s["all"]
    assert a["rows"] == 5 and a["rows_pdlab"] == 6 and a["rows_aiconfigurator"] == 5
    assert a["aiconfigurator"]["ttft_mape"] == pytest.approx(4 / 5)  # 0 once, 100% four times
    assert a["aiconfigurator"]["tpot_mape"] == pytest.approx(0.5 * 4 / 5)
    assert s["aiconfigurator_errors"] == {"PerfDataNotAvailableError": 1}


def test_a_disaggregated_row_pays_the_prefill_worker_and_the_kv_transfer() -> None:
    row = next(r for r in load_rows(CSV) if r.row_id.endswith("c24_tp2_epnone_13"))
    stage = {"batch_size": 24, "num_workers": 1, "tp_size": 2, "pp_size": 1,
             "attention_dp_size": 1, "moe_tp_size": 1, "moe_ep_size": 1}  # fmt: skip
    pd = replace(row, mode="disagg", concurrency=4, prefill=stage, decode=stage)
    twin = SiliconTwin(SYSTEMS, [CONFIGS])
    res = twin.replay(pd)
    shape = twin.shape(pd)
    eng = twin.engine(pd, pd.parallel("prefill", False), shape)
    alone = eng.profile.pricer.prefill_time(int(0.8 * pd.isl))
    assert res.ttft_ms / 1e3 > alone + twin.transfer_s(
        pd, shape, pd.parallel("prefill", False), pd.parallel("decode", False)
    )
    assert " -> " in res.profile and res.tpot_ms > 0
    with pytest.raises(Unsupported, match="pipeline parallelism"):
        twin.replay(replace(pd, prefill={**stage, "pp_size": 2}))


def test_the_run_is_stored_and_drawn(run: tuple[list[RowResult], dict], tmp_path: Path) -> None:
    results, s = run
    db = tmp_path / "v.duckdb"
    rid = store(db, results, s, str(CSV))
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT source FROM runs WHERE run_id = ?", [rid]).fetchone() == (
        "validate-silicon",
    )
    n, replayed = con.execute(
        "SELECT count(*), count(pdlab_ttft_ms) FROM silicon_validation WHERE run_id = ?", [rid]
    ).fetchone()
    con.close()
    assert (n, replayed) == (12, 6)
    fig = silicon_scatter(db, rid)
    assert not is_empty(fig)
    pts = [t for t in fig.data if t.meta and t.meta.get("tool") == "pdlab"]
    assert sum(len(t.x) for t in pts) == 12  # 6 rows x (TTFT, TPOT)
    assert (
        fig.layout.xaxis.type == "log" and len(fig.layout.annotations) >= 2
    )  # one title per partition


def test_the_cli_prints_the_json_stores_and_draws(tmp_path: Path) -> None:
    db, html = tmp_path / "v.duckdb", tmp_path / "fig.html"
    args = ["validate", "silicon", str(CSV), "--aic-systems", str(SYSTEMS), "--model-configs",
            str(CONFIGS), "--no-aic", "--json", "--db", str(db), "--figure", str(html)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"all", "partitions", "unsupported", "rows_total"} <= set(doc) and doc[
        "rows_total"
    ] == 12
    assert doc["partitions"][0]["partition"] == "h200_sxm/vllm/agg/llama"
    assert html.stat().st_size > 1000 and doc["run_id"].startswith("run-")
    table = CliRunner().invoke(app, [*args[:7], "--no-aic"])
    assert (
        table.exit_code == 0
        and "h200_sxm/vllm/agg/llama" in table.stdout
        and "unsupported (2)" in table.stdout
    )


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    other = runner.invoke(app, ["validate", str(tmp_path / "runs.duckdb")])
    assert other.exit_code == 2 and "no such database" in other.output
    missing = runner.invoke(app, ["validate", "silicon", str(tmp_path / "nope.csv"), "--no-aic",
                                  "--aic-systems", str(SYSTEMS)])  # fmt: skip
    assert (
        missing.exit_code == 2
        and "does not exist" in missing.output
        and "Traceback" not in missing.output
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("id,system\nx,h200_sxm\n")
    res = runner.invoke(
        app, ["validate", "silicon", str(bad), "--no-aic", "--aic-systems", str(SYSTEMS)]
    )
    assert res.exit_code == 2 and "missing column(s)" in res.output


def test_a_row_faster_than_its_memory_floor_is_flagged(run: tuple[list[RowResult], dict]) -> None:
    results, _ = run
    twin = SiliconTwin(SYSTEMS, [CONFIGS])
    row = next(r for r in load_rows(CSV) if r.row_id.endswith("c64_tp1_epnone_19"))
    floor = twin.tpot_floor_ms(row)
    # 8 GB of FP8 weights and 64 x ~7.6k tokens of FP8 KV at 4.8 TB/s: several ms a step
    assert 2.0 < floor < row.tpot_ms
    fast = replace(row, concurrency=2000)  # the same TPOT claimed at 2,000 clients
    assert twin.tpot_floor_ms(fast) > 2 * row.tpot_ms
    ok = [r for r in results if r.pdlab_ok]
    bad = replace(ok[0], tpot_floor_ms=3 * ok[0].tpot_ms)
    s = summarize([bad, *ok[1:]], aic_on=False)
    assert s["consistent"]["flagged"] == 1 and s["consistent"]["rows"] == len(ok) - 1
    assert s["all"]["rows"] == len(ok)


def test_a_stated_cpu_overhead_lengthens_every_iteration(
    run: tuple[list[RowResult], dict],
) -> None:
    """`--cpu-overhead 1`: vidur's A100 schedule + prepare_inputs per iteration, named with its
    source in the summary; every replayed row's TTFT and TPOT grow, none by more than the
    overhead's own size allows."""
    base, s0 = run
    assert s0["assumptions"]["cpu_overhead"]["factor"] == 0.0
    res = CliRunner().invoke(app, ["validate", "silicon", str(CSV), "--aic-systems", str(SYSTEMS),
                                   "--model-configs", str(CONFIGS), "--no-aic", "--json",
                                   "--cpu-overhead", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    cpu = doc["assumptions"]["cpu_overhead"]
    assert cpu["per_iteration_s"] == pytest.approx(0.189e-3) and "vidur" in cpu["source"]
    again, _ = validate_silicon(
        CSV, systems_dir=SYSTEMS, model_dirs=[CONFIGS], use_aic=False, cpu_overhead=1.0
    )
    for a, b in zip(base, again, strict=True):
        if a.pdlab_ok:
            # a decode step gains 0.189 ms + 3.68 us per sequence it holds (<= concurrency)
            step = 0.189 + 3.68e-3 * a.concurrency
            assert 0.0 < b.pdlab_tpot_ms - a.pdlab_tpot_ms <= step * 1.05
            assert b.pdlab_ttft_ms > a.pdlab_ttft_ms
    wrong = CliRunner().invoke(app, ["validate", "silicon", "--cpu-overhead", "-1", "--no-aic"])
    assert wrong.exit_code == 2
    elsewhere = CliRunner().invoke(app, ["validate", "x.duckdb", "--cpu-overhead", "1"])
    assert elsewhere.exit_code == 2 and "--cpu-overhead" in elsewhere.output
