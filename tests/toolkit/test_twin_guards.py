"""Guards: a profile of another model or GPU is refused (and `--force` marks the twin
everywhere); a forced or stale twin cannot silently widen `pdlab advise` to (0-X)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from toolkit.advise.run import advise
from toolkit.advise.workload import load_run
from toolkit.cli import app
from toolkit.importers import BenchRun, read_vllm_bench, write_runs
from toolkit.twin.guards import gpu_check, model_check

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
QWEN = BUNDLED / "models/Qwen/Qwen3-32B.json"
runner = CliRunner()


def _profile(path: Path, bundle: str, model: Path, hardware: str) -> Path:
    p = build_profile(BUNDLED / "profiles" / bundle, ModelShape.load(model), hardware=hardware)
    path.write_text(json.dumps(p.to_json()))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("guards")
    db = tmp / "real.duckdb"
    run = read_vllm_bench(
        BUNDLED / "real_runs/rtx4090_llama31_8b_vllm", run_id="llama", model_config=LLAMA
    )
    write_runs(db, [run])
    return {
        "db": db,
        "llama": _profile(tmp / "llama.json", "llmservingsim_rtx4090_llama31_8b", LLAMA, "RTX4090"),
        "llama_h100": _profile(
            tmp / "llama_h100.json", "llmservingsim_rtx4090_llama31_8b", LLAMA, "H100"
        ),
        "qwen": _profile(
            tmp / "qwen.json", "llmservingsim_rtxpro6000_qwen3_32b", QWEN, "RTX PRO 6000"
        ),
    }


def test_the_wrong_model_is_refused_and_force_marks_the_twin(env: dict[str, Path]) -> None:
    db = str(env["db"])
    base = ["twin", db, "--run", "llama", "--profile", str(env["qwen"])]
    refused = runner.invoke(app, base)
    assert refused.exit_code == 2
    err = refused.output.strip()
    assert len(err.splitlines()) == 1  # one line, naming both sides
    assert "Llama-3.1-8B" in err and "Qwen3-32B" in err and "layers 32 vs 64" in err
    assert "NVIDIA GeForce RTX 4090" in err and "RTX PRO 6000" in err and "--force" in err
    runs = json.loads(runner.invoke(app, ["runs", "list", db, "--json"]).stdout)
    assert [r["id"] for r in runs] == ["llama"]  # nothing stored

    forced = runner.invoke(app, [*base, "--force", "--interval-replays", "2", "--json"])
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["forced"] is True and doc["guards"]["model"].startswith("FORCED")
    assert doc["guards"]["gpu"].startswith("FORCED")
    # no measured error bounds a profile of another model: the interval is not known
    assert doc["metrics"]["ttft_mean_s"]["covered"] is None
    assert doc["metrics"]["ttft_mean_s"]["ci95"][1] is None
    table = runner.invoke(app, [*base, "--force", "--no-interval", "--no-store"])
    assert table.exit_code == 0 and "FORCED" in table.stdout
    # the stored twin says so wherever it is shown later
    listed = {
        r["id"]: r for r in json.loads(runner.invoke(app, ["runs", "list", db, "--json"]).stdout)
    }
    assert listed[doc["twin_run_id"]]["forced"] is True
    assert "FORCED" in runner.invoke(app, ["runs", "list", db]).stdout
    shown = json.loads(
        runner.invoke(app, ["runs", "show", db, doc["twin_run_id"], "--json"]).stdout
    )
    assert shown["config"]["forced"] is True
    from toolkit.plots import twin_cdf

    assert "FORCED" in twin_cdf(env["db"], doc["twin_run_id"]).to_json()  # pdlab report's figure
    # advise never takes it implicitly, and refuses it by name
    rec = load_run(env["db"], "llama", profile=str(env["llama"]))
    assert rec.twin_run_id is None and "FORCED" in (rec.twin_note or "")
    explicit = runner.invoke(
        app, ["advise", db, "--run", "llama", "--profile", str(env["llama"]), "--nodes", "2",
              "--twin", doc["twin_run_id"]],
    )  # fmt: skip
    assert explicit.exit_code == 2 and "--force" in explicit.output
    runner.invoke(app, ["runs", "rm", db, doc["twin_run_id"]])


def test_the_gpu_is_checked_and_unchecked_sides_say_so(env: dict[str, Path]) -> None:
    db = str(env["db"])
    h100 = runner.invoke(app, ["twin", db, "--run", "llama", "--profile", str(env["llama_h100"])])
    assert h100.exit_code == 2
    assert "run used NVIDIA GeForce RTX 4090, profile was measured on H100" in h100.output
    ok = runner.invoke(
        app,
        ["twin", db, "--run", "llama", "--profile", str(env["llama"]), "--no-store",
         "--no-interval", "--json"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    g = json.loads(ok.stdout)["guards"]
    assert g["model"] == "checked (dimensions)" and g["gpu"].startswith("checked")
    assert g["forced"] is False
    # what a side does not record is "unchecked", never a silent pass
    shape = ModelShape.load(LLAMA)
    assert model_check(shape, {})[0].startswith("unchecked")
    assert model_check(shape, {"model": "meta-llama/Llama-3.1-8B"}) == ("checked (name)", None)
    _, bad = model_check(shape, {"model": "Qwen/Qwen3-32B"})
    assert bad is not None and "Qwen/Qwen3-32B" in bad and "--model-config" in bad
    assert gpu_check(None, "RTX4090")[0].startswith("unchecked: the run")
    assert gpu_check("NVIDIA RTX A6000", "A6000")[1] is None
    assert gpu_check("NVIDIA H200", "H100")[1] is not None


def test_settings_outside_the_profile_say_extrapolating(
    env: dict[str, Path], tmp_path: Path
) -> None:
    from cluster.hardware.engine_settings import EngineSettings

    engine = EngineSettings(
        engine="vllm", model="meta-llama/Llama-3.1-8B", max_num_seqs=1024,
        max_num_batched_tokens=8192, num_gpu_blocks=4000,
    )  # fmt: skip
    run = BenchRun(
        "wide", datetime(2026, 1, 1, tzinfo=UTC), "test", {"engine": engine.to_json()},
        ["e0"], "test",
    )  # fmt: skip
    for i in range(4):
        run.add_request(
            request_id=f"r{i}", program_id=f"r{i}", branch_id=f"r{i}", t_arrival=float(i),
            prefill_node=0, decode_node=0, t_in=500, t_c=0, t_fetch=0, t_out=20,
            t_first_token=i + 0.1, t_done=i + 0.6,
        )  # fmt: skip
    db = tmp_path / "wide.duckdb"
    write_runs(db, [run])
    res = runner.invoke(
        app,
        ["twin", str(db), "--profile", str(env["llama"]), "--no-store", "--no-interval", "--json"],
    )
    assert res.exit_code == 0, res.output
    ext = json.loads(res.stdout)["extrapolating"]
    assert any(e.startswith("batch 1024 > 256") for e in ext)
    assert any(e.startswith("chunk 8192 tokens > 2048") for e in ext)
    table = runner.invoke(
        app, ["twin", str(db), "--profile", str(env["llama"]), "--no-store", "--no-interval"]
    )
    assert "extrapolating:" in table.stdout


def _run(run_id: str, stretch: float, config: dict[str, object], source: str) -> BenchRun:
    run = BenchRun(run_id, datetime(2026, 1, 1, tzinfo=UTC), source, config, ["a", "b", "c"], "t")
    for i in range(12):
        t = 0.25 * i
        run.add_request(
            request_id=f"r{i}", program_id=f"r{i}", branch_id=f"r{i}", t_arrival=t,
            prefill_node=None, decode_node=None, t_in=2000, t_c=0, t_fetch=0, t_out=40,
            t_first_token=t + 0.2 * stretch, t_done=t + stretch,
        )  # fmt: skip
    return run


def test_a_stale_twin_cannot_widen_advise_to_zero_silently(tmp_path: Path) -> None:
    db = tmp_path / "advise.duckdb"
    write_runs(
        db,
        [
            _run("run", 1.0, {}, "test"),
            # made with the same profile as the replays, but 2.5x off: stale
            _run("twin-run", 2.5, {"twin_of": "run", "profile": "h200"}, "twin"),
        ],
    )
    rec = load_run(db, "run", profile="h200")
    assert rec.twin_run_id == "twin-run"  # the twin of the same profile is the one used
    result = advise(rec, profile="h200", seeds=1)
    for s in result.splits:
        for name in ("ttft_mean_s", "e2e_mean_s"):
            lo, hi = s.metrics[name].ci95
            # never (0-X): the upper end is not known (infinite), the lower end the estimate
            # over the twin's error
            assert hi == float("inf") and lo > 0
    assert result.recommendation.distinguishable is False
    assert "not distinguishable" in result.recommendation.reason
    res = runner.invoke(
        app,
        ["advise", str(db), "--run", "run", "--profile", "h200", "--seeds", "1"],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "not known" in res.stdout and "(0-" not in res.stdout
    assert "twin twin-run (its own error" in res.stdout and "+150.0%" in res.stdout
    doc = json.loads(
        runner.invoke(
            app, ["advise", str(db), "--run", "run", "--profile", "h200", "--seeds", "1", "--json"]
        ).stdout
    )
    assert doc["splits"][0]["metrics"]["e2e_mean_s"]["ci95"][1] is None
    # a twin of another profile is not used implicitly; it is named
    other = load_run(db, "run", profile="gb300")
    assert other.twin_run_id is None and "twin-run" in (other.twin_note or "")
