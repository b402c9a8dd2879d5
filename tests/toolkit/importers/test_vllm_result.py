"""`pdlab import vllm-bench` on vLLM's own result file (`vllm bench serve --save-result`).

No result JSON of a real run with `--save-detailed` is public, so the file is made from a
real one: the RTX 4090 / Llama-3.1-8B vLLM 0.19 run of LLMServingSim's bench (committed
bundled with pdlab (cluster/data/files/real_runs), 300 ShareGPT requests at ~10 req/s), written in the keys
and units `vllm/benchmarks/serve.py` uses: settings and `--metadata` entries at the top
level (the engine settings the server ran with), totals and `*_ms` statistics, and per
request `input_lens`, `output_lens`, `ttfts` (s), `itls` (s; the run recorded only first
and last token times, so each request's decode time is split evenly over its tokens: E2E
stays exact), `start_times` (s, one monotonic clock) and `errors`. The key set matches a
public summary-only result of vLLM's client (Qwen3-VL-8B, 2026). The import must give the
run's own TTFT/TPOT/E2E (LLMServingSim's validation table: mean TTFT 65,456.6 ms) and
`pdlab twin` must replay it within 5% as it does the bench-layout import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from telemetry import open_reader
from toolkit.cli import app
from toolkit.importers import ImportFileError, find_runs, read_vllm_result

RUN = BUNDLED / "real_runs/rtx4090_llama31_8b_vllm"
LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
runner = CliRunner()


def vllm_result(*, detailed: bool = True, start_times: bool = True, rate: Any = 10.0) -> dict:
    reqs = [json.loads(line) for line in (RUN / "requests.jsonl").read_text().splitlines()]
    t0 = min(r["queued_ts"] for r in reqs)
    ttfts = [r["first_token_ts"] - r["queued_ts"] for r in reqs]
    itls = [[(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1)]
            * (r["output_toks"] - 1) for r in reqs]  # fmt: skip
    e2e = [r["last_token_ts"] - r["queued_ts"] for r in reqs]
    duration = max(r["last_token_ts"] for r in reqs) - t0
    tin, tout = sum(r["input_toks"] for r in reqs), sum(r["output_toks"] for r in reqs)
    doc: dict[str, Any] = {
        "date": "20260815-101500", "endpoint_type": "openai", "backend": "vllm", "label": None,
        "model_id": "meta-llama/Llama-3.1-8B", "tokenizer_id": "meta-llama/Llama-3.1-8B",
        "num_prompts": len(reqs),
        # --metadata entries: top-level strings, as vLLM stores them
        "tensor_parallel_size": "1", "max_num_seqs": "256", "max_num_batched_tokens": "2048",
        "num_gpu_blocks": "2588", "block_size": "16", "gpu": "NVIDIA GeForce RTX 4090",
        "request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
        "duration": duration, "completed": len(reqs), "failed": 0,
        "total_input_tokens": tin, "total_output_tokens": tout,
        "request_throughput": len(reqs) / duration, "request_goodput": None,
        "output_throughput": tout / duration, "total_token_throughput": (tin + tout) / duration,
        "max_output_tokens_per_s": 2100.0, "max_concurrent_requests": 256,
        "mean_ttft_ms": 1000 * sum(ttfts) / len(ttfts), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e),
    }  # fmt: skip
    if detailed:
        doc |= {"input_lens": [r["input_toks"] for r in reqs],
                "output_lens": [r["output_toks"] for r in reqs], "ttfts": ttfts, "itls": itls,
                "generated_texts": [""] * len(reqs), "errors": [""] * len(reqs)}  # fmt: skip
        if start_times:
            doc["start_times"] = [r["queued_ts"] for r in reqs]
    return doc


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = build_profile(BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", ModelShape.load(LLAMA))
    out = tmp_path_factory.mktemp("prof") / "rtx4090.json"
    out.write_text(json.dumps(p.to_json()))
    return out


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_detailed_result_imports_and_the_twin_replays_it(tmp_path: Path, profile: Path) -> None:
    f = _write(tmp_path / "vllm-10.0qps-Llama-3.1-8B-20260815-101500.json", vllm_result())
    db = tmp_path / "r.duckdb"
    res = runner.invoke(app, ["import", "vllm-bench", str(f), "--db", str(db), "--run-id",
                              "llama", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = json.loads(res.stdout)["runs"]
    assert run["requests"] == 300 and run["arrivals"] == "recorded"
    m = run["metrics"]
    assert m["ttft_mean_s"] == pytest.approx(65.4566, rel=1e-4)  # LLMServingSim's table
    assert run["engine"]["max_num_seqs"] == 256 and run["engine"]["num_gpu_blocks"] == 2588
    cfg = json.loads(open_reader(db).runs()["config"][0])
    assert cfg["engine_sources"]["max_num_batched_tokens"] == "metadata max_num_batched_tokens"
    assert cfg["benchmark"]["request_rate"] == 10.0 and cfg["summary"]["completed"] == 300
    twin = runner.invoke(app, ["twin", str(db), "--run", "llama", "--profile", str(profile),
                               "--json", "--no-store"])  # fmt: skip
    assert twin.exit_code == 0, twin.output
    tm = json.loads(twin.stdout)["metrics"]
    for name in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s"):
        assert abs(tm[name]["error"]) <= 0.05, (name, tm[name])
    assert tm["ttft_mean_s"]["real"] == pytest.approx(m["ttft_mean_s"])


def test_without_save_detailed_the_summary_is_kept_and_the_twin_says_why_not(
    tmp_path: Path, profile: Path
) -> None:
    f = _write(tmp_path / "summary.json", vllm_result(detailed=False))
    db = tmp_path / "s.duckdb"
    res = runner.invoke(app, ["import", "vllm-bench", str(f), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "no per-request records" in res.stdout and "mean_ttft_ms 65456.6 ms" in res.stdout
    runs = open_reader(db).runs()
    cfg = json.loads(runs["config"][0])
    assert cfg["per_request"].startswith("not saved") and cfg["summary"]["failed"] == 0
    twin = runner.invoke(app, ["twin", str(db), "--profile", str(profile), "--no-store"])
    assert twin.exit_code != 0 and "Traceback" not in twin.output
    assert "no per-request records" in twin.output and "--save-detailed" in twin.output


@pytest.mark.parametrize(("rate", "arrivals"), [(10.0, "unknown"), ("inf", "burst")])
def test_without_start_times_the_arrivals_are_what_the_rate_says(
    tmp_path: Path, rate: Any, arrivals: str
) -> None:
    f = _write(tmp_path / "old.json", vllm_result(start_times=False, rate=rate))
    (run,) = read_vllm_result(f)
    assert run.config["arrivals"] == arrivals and run.num_requests == 300
    assert set(run.requests["t_arrival"]) == {0.0} and set(run.requests["t_sent"]) == {None}


def test_a_directory_of_runs_imports_each_run_it_finds(tmp_path: Path) -> None:
    d = tmp_path / "results"
    (d / "day2").mkdir(parents=True)
    _write(d / "a.json", vllm_result())
    appended = "\n".join(json.dumps(vllm_result(detailed=False)) for _ in range(2))
    (d / "day2" / "appended.json").write_text(appended)  # --append-result: one run per line
    (d / "notes.json").write_text('{"hello": 1}')
    lss = d / "lss-run"
    lss.mkdir()
    for name in ("meta.json", "requests.jsonl"):
        (lss / name).write_text((RUN / name).read_text())
    found, skipped = find_runs(d)
    assert [(f.kind, f.path.name) for f in found] == [
        ("vllm-result", "a.json"),
        ("vllm-result", "appended.json"),
        ("lss-bench", "lss-run"),
    ]
    assert [s[0].name for s in skipped] == ["notes.json"]
    db = tmp_path / "d.duckdb"
    res = runner.invoke(app, ["import", "vllm-bench", str(d), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "found 3 run(s)" in res.stderr and "skipped" in res.stderr
    ids = sorted(open_reader(db).runs()["run_id"].to_list())
    assert ids == ["vllm-a", "vllm-appended-1", "vllm-appended-2", "vllm-lss-run"]


def test_the_llmservingsim_layout_has_its_own_name_and_the_old_one_still_works(
    tmp_path: Path,
) -> None:
    db = tmp_path / "l.duckdb"
    new = runner.invoke(app, ["import", "lss-bench", str(RUN), "--db", str(db), "--run-id", "a"])
    assert new.exit_code == 0, new.output
    old = runner.invoke(app, ["import", "vllm-bench", str(RUN), "--db", str(db), "--run-id", "b"])
    assert old.exit_code == 0 and "lss-bench" in old.stderr
    assert sorted(open_reader(db).runs()["run_id"].to_list()) == ["a", "b"]


def test_engine_args_win_and_bad_input_names_the_file_and_field(tmp_path: Path) -> None:
    doc = vllm_result()
    args = _write(tmp_path / "args.json", {"max_num_seqs": 64, "tensor_parallel_size": 1})
    (run,) = read_vllm_result(_write(tmp_path / "r.json", doc), engine_args=args)
    assert run.config["engine"]["max_num_seqs"] == 64
    assert run.config["engine_sources"]["max_num_seqs"] == "engine-args max_num_seqs"
    bad = dict(doc, itls=doc["itls"][:-1])
    with pytest.raises(ImportFileError, match=r"bad.json: line \d+: field itls: has 299 entries"):
        read_vllm_result(_write(tmp_path / "bad.json", bad))
    with pytest.raises(ImportFileError, match="not a `vllm bench serve --save-result` file"):
        read_vllm_result(_write(tmp_path / "other.json", {"model": "x"}))
    db = tmp_path / "x.duckdb"
    res = runner.invoke(app, ["import", "vllm-bench", str(tmp_path / "bad.json"), "--db", str(db)])
    assert res.exit_code == 2 and "itls" in res.stderr and not db.exists()
