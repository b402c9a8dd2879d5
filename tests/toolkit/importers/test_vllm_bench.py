"""`pdlab import vllm-bench` on the real runs and on malformed copies of them."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.importers import ImportFileError, read_vllm_bench, write_runs
from toolkit.queries.serving import serving_metrics

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RUNS = FIXTURES / "real_runs"
LLAMA = FIXTURES / "models/meta-llama/Llama-3.1-8B.json"
MOE = FIXTURES / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json"
runner = CliRunner()


def _validation(run: Path) -> dict[str, float]:
    """The vLLM column of LLMServingSim's table, in ms: {"ttft_mean": ..., "e2e_p99": ...}."""
    names = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}
    stats = {"Mean": "mean", "Median": "p50", "P90": "p90", "P95": "p95", "P99": "p99"}
    out = {}
    for line in (run / "llmservingsim_validation.txt").read_text().splitlines():
        m = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([\d.]+)", line)
        if m:
            out[f"{names[m[1]]}_{stats[m[2]]}"] = float(m[3])
    return out


@pytest.mark.parametrize("name", ["rtx4090_llama31_8b_vllm", "rtxpro6000_qwen3_32b_vllm"])
def test_imported_metrics_match_the_measured_vllm_column(tmp_path: Path, name: str) -> None:
    db = tmp_path / "runs.duckdb"
    run = read_vllm_bench(RUNS / name)
    assert write_runs(db, [run]) == [f"vllm-{name}"]
    m = serving_metrics(db, run.run_id)
    assert m.requests == 300 and m.unfinished == 0
    want = _validation(RUNS / name)
    assert len(want) == 15
    for key, ms in want.items():
        metric, stat = key.split("_")
        assert 1000 * m.stats[metric][stat] == pytest.approx(ms, abs=0.051), key  # table is 0.1 ms


def test_runs_nodes_and_engine_settings(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    run = read_vllm_bench(RUNS / "rtx4090_llama31_8b_vllm", run_id="llama", model_config=LLAMA)
    write_runs(db, [run])
    con = duckdb.connect(str(db), read_only=True)
    source, config = con.execute("SELECT source, config FROM runs").fetchone()
    nodes = con.execute("SELECT node_id, name, hardware, moe_experts FROM nodes").fetchall()
    first = con.execute(
        "SELECT request_id, t_arrival, t_in, t_out, t_prefill_start, t_first_token, t_sent "
        "FROM requests ORDER BY t_arrival LIMIT 1"
    ).fetchone()
    con.close()
    cfg = json.loads(config)
    assert source == "vllm-bench"
    assert nodes == [(0, "vllm-dp0", "NVIDIA GeForce RTX 4090", 0)]
    e = cfg["engine"]
    assert (
        e["max_num_seqs"],
        e["max_num_batched_tokens"],
        e["num_gpu_blocks"],
        e["block_size"],
    ) == (256, 2048, 2588, 16)
    assert (e["tensor_parallel_size"], e["data_parallel_size"], e["expert_parallel_size"]) == (
        1,
        1,
        1,
    )
    assert e["gpu_memory_utilization"] == 0.9 and e["gpu_memory_bytes"] == 25_250_627_584
    assert e["cuda_graph_max_batch"] == 512 and e["async_scheduling"] is True
    assert e["cuda_graph_sizes"][:4] == [1, 2, 4, 8] and e["cuda_graph_sizes"][-1] == 512
    assert (e["max_num_partial_prefills"], e["reserve_full_prompt"], e["scheduling_policy"]) == (
        1,
        True,
        "fcfs",
    )
    assert cfg["kv_tokens"] == 41_408
    assert cfg["clock"]["anchor"] == "queued_ts"
    assert cfg["clock"]["queue_lag_mean_s"] == pytest.approx(0.028, abs=0.001)  # data README
    assert cfg["model_shape"]["num_layers"] == 32
    # request 0: queued at 27536.6607, scheduled 2e-5 s later, first token 0.689 s later
    assert first[0] == "bench-0" and first[1] == 0.0 and (first[2], first[3]) == (2358, 531)
    assert first[4] == pytest.approx(2.0579e-5, abs=1e-8)
    assert first[5] == pytest.approx(27537.350135653 - 27536.660701067, abs=1e-9)
    assert first[6] == 0.0


def test_older_meta_without_kv_cache_or_hardware() -> None:
    run = read_vllm_bench(RUNS / "rtxpro6000_qwen3_32b_vllm")
    e = run.config["engine"]
    assert (e["tensor_parallel_size"], e["max_num_seqs"], e["num_gpu_blocks"]) == (2, 128, None)
    # no device in meta.json: the GPU and its (nominal) memory from the cluster description
    assert e["hardware"] == "RTXPRO6000" and run.hardware == "RTXPRO6000"
    assert run.config["gpu_memory_source"] == "nominal (cluster_config.json)"
    assert run.config["clock"]["queue_lag_mean_s"] == pytest.approx(0.133, abs=0.001)
    # no dp_rank per request: stored on rank 0, and the config says it is not the rank
    assert run.config["dp_ranks"] == "not recorded"


def test_recorded_dp_ranks_are_kept_and_said(tmp_path: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(RUNS / "rtxpro6000_qwen3_32b_vllm", d)
    meta = json.loads((d / "meta.json").read_text())
    meta["engine_kwargs"].update(tensor_parallel_size=1, data_parallel_size=2)
    (d / "meta.json").write_text(json.dumps(meta))
    lines = (d / "requests.jsonl").read_text().splitlines()
    rows = [{**json.loads(x), "dp_rank": i % 2} for i, x in enumerate(lines)]
    (d / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = read_vllm_bench(d)
    assert run.config["dp_ranks"] == "recorded"
    assert set(run.requests["prefill_node"]) == {0, 1}


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(RUNS / "rtx4090_llama31_8b_vllm", d)
    return d


def _edit_line(path: Path, line: int, fn) -> None:  # type: ignore[no-untyped-def]
    lines = path.read_text().splitlines()
    lines[line - 1] = fn(lines[line - 1])
    path.write_text("\n".join(lines) + "\n")


def _set(field: str, value: object):  # type: ignore[no-untyped-def]
    def fn(text: str) -> str:
        obj = json.loads(text)
        if value is KeyError:
            del obj[field]
        else:
            obj[field] = value
        return json.dumps(obj)

    return fn


@pytest.mark.parametrize(
    ("line", "fn", "expected"),
    [
        (7, lambda s: s[:-3], r"requests.jsonl: line 7: not valid JSON"),
        (12, _set("input_toks", KeyError), r"requests.jsonl: line 12: field input_toks: missing"),
        (
            3,
            _set("output_toks", -4),
            r"requests.jsonl: line 3: field output_toks: must be >= 1, got -4",
        ),
        (
            20,
            _set("first_token_ts", "soon"),
            r"requests.jsonl: line 20: field first_token_ts: expected a finite number, got 'soon'",
        ),
        (
            5,
            _set("last_token_ts", 1.0),
            r"requests.jsonl: line 5: field last_token_ts: 1.0 is before first_token_ts",
        ),
        (
            9,
            _set("request_id", "bench-1"),
            r"requests.jsonl: line 9: field request_id: 'bench-1' repeats the request of line 2",
        ),
        (4, lambda s: "[1, 2]", r"requests.jsonl: line 4: expected a JSON object, got list"),
        (
            6,
            _set("dp_rank", 3),
            r"requests.jsonl: line 6: field dp_rank: 3 but data_parallel_size is 1",
        ),
    ],
)
def test_malformed_requests_name_file_line_and_field(
    tmp_path: Path, line: int, fn, expected: str
) -> None:  # type: ignore[no-untyped-def]
    d = _copy(tmp_path)
    _edit_line(d / "requests.jsonl", line, fn)
    with pytest.raises(ImportFileError, match=expected):
        read_vllm_bench(d)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '"max_num_seqs": 256',
            '"max_num_seqs": "many"',
            r"meta.json: line 10: field engine_kwargs.max_num_seqs: expected an integer, got 'many'",
        ),
        (
            '"gpu_memory_utilization": 0.9,\n    "enable',
            '"gpu_memory_utilization": 1.9,\n    "enable',
            r"meta.json: line 27: field kv_cache.gpu_memory_utilization: must be in \(0, 1\], got 1.9",
        ),
        (
            '"engine_kwargs": {',
            '"engine_kwargz": {',
            r"meta.json: line 1: field engine_kwargs: missing",
        ),
        (
            '"started_at": "2026',
            '"started_at": "yesterday 2026',
            r"meta.json: line 20: field started_at: not an ISO 8601 time",
        ),
        (
            '"is_moe_model": false',
            '"is_moe_model": true',
            r"field resolved_config.parallel_config.is_moe_model: the model is MoE: pass --model-config",
        ),
        (
            '"num_gpu_blocks": 2588,\n    "num_cpu',
            '"num_gpu_blocks": 0,\n    "num_cpu',
            r"meta.json: line 24: field kv_cache.num_gpu_blocks: must be >= 1, got 0",
        ),
    ],
)
def test_malformed_meta_names_the_line_of_the_field(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    d = _copy(tmp_path)
    text = (d / "meta.json").read_text()
    assert old in text
    (d / "meta.json").write_text(text.replace(old, new, 1))
    with pytest.raises(ImportFileError, match=expected):
        read_vllm_bench(d)


def test_meta_syntax_errors_and_missing_files(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "meta.json").write_text('{\n  "engine_kwargs": {,\n}')
    with pytest.raises(ImportFileError, match=r"meta.json: line 2: not valid JSON"):
        read_vllm_bench(d)
    (d / "meta.json").unlink()
    with pytest.raises(ImportFileError, match=r"meta.json: file is missing"):
        read_vllm_bench(d)
    with pytest.raises(ImportFileError, match="not a directory"):
        read_vllm_bench(tmp_path / "nowhere")
    # the MoE shape comes from --model-config when given
    run = read_vllm_bench(RUNS / "rtx4090_llama31_8b_vllm", model_config=MOE)
    assert (run.moe_top_k, run.moe_experts) == (8, 128)


def test_failed_requests_are_left_out_and_listed(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    for line in (2, 3):
        _edit_line(d / "requests.jsonl", line, _set("first_token_ts", None))
    run = read_vllm_bench(d)
    assert run.num_requests == 298 and run.config["failed_request_ids"] == ["bench-1", "bench-2"]


def _snapshot(db: Path) -> list[tuple[str, int, str]]:
    """Row count and a digest of every row of each table the importer writes."""
    con = duckdb.connect(str(db), read_only=True)
    out = []
    for t in ("runs", "nodes", "requests"):
        rows = sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall()))
        out.append((t, len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest()))
    con.close()
    return out


def test_a_failed_import_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "db.duckdb"
    res = runner.invoke(
        app, ["import", "vllm-bench", str(RUNS / "rtx4090_llama31_8b_vllm"), "--db", str(db)]
    )
    assert res.exit_code == 0, res.output
    assert "65456.6" in res.stdout and "throughput" in res.stdout
    before = _snapshot(db)
    # a malformed file: nothing is written
    d = _copy(tmp_path)
    _edit_line(d / "requests.jsonl", 300, _set("input_toks", 0))
    res = runner.invoke(app, ["import", "vllm-bench", str(d), "--db", str(db), "--run-id", "other"])
    assert (
        res.exit_code == 2
        and "requests.jsonl: line 300: field input_toks: must be >= 1" in res.stderr
    )
    assert "Traceback" not in res.output
    # the same run again: refused inside the transaction, nothing half-written
    res = runner.invoke(
        app, ["import", "vllm-bench", str(RUNS / "rtx4090_llama31_8b_vllm"), "--db", str(db)]
    )
    assert res.exit_code == 2 and "already exists" in res.stderr
    assert _snapshot(db) == before
    # a good second run lands beside the first
    res = runner.invoke(
        app,
        [
            "import",
            "vllm-bench",
            str(RUNS / "rtxpro6000_qwen3_32b_vllm"),
            "--db",
            str(db),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["runs"][0]["metrics"]["tpot_mean_s"] == pytest.approx(0.0803, abs=5e-5)
    assert _snapshot(db)[0][:2] == ("runs", 2)


def test_cluster_description_gives_the_link_and_missing_gpu_memory(tmp_path: Path) -> None:
    run = read_vllm_bench(RUNS / "rtxpro6000_qwen3_32b_vllm")
    link = run.config["interconnect"]
    assert (link["link_gbps"], link["link_latency_s"]) == (16, pytest.approx(20e-6))
    assert run.config["engine"]["gpu_memory_bytes"] == 96 * 1024**3  # meta.json has none
    # a recorded device size wins over the description's nominal one
    llama = read_vllm_bench(RUNS / "rtx4090_llama31_8b_vllm")
    assert llama.config["engine"]["gpu_memory_bytes"] == 25_250_627_584
    d = _copy(tmp_path)
    (d / "cluster_config.json").write_text('{\n  "num_nodes": 1,\n  "link_bw": -3\n}\n')
    with pytest.raises(ImportFileError, match=r"cluster_config.json.*line 3.*link_bw.*> 0"):
        read_vllm_bench(d)
    (d / "cluster_config.json").unlink()
    assert read_vllm_bench(d).config["interconnect"] is None
