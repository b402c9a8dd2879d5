"""`pdlab import sglang-bench` on bench_serving's --output-file format, good and malformed."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.importers import ImportFileError, read_sglang_bench, server_settings, write_runs
from toolkit.queries.serving import serving_metrics

runner = CliRunner()


def _result(**over: object) -> dict[str, object]:
    """One bench_serving result line as `--output-file --output-details` appends it."""
    doc: dict[str, object] = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": float("inf"),
        "max_concurrency": None,
        "duration": 4.2,
        "completed": 3,
        "mean_ttft_ms": 150.0,
        "input_lens": [100, 2000, 300, 50],
        "output_lens": [11, 3, 2, 0],
        "ttfts": [0.1, 0.3, 0.05, 0.0],
        "itls": [[0.01] * 10, [0.02, 0.02], [0.5], []],
        "generated_texts": ["x", "y", "z", ""],
        "errors": ["", "", "", "Server disconnected"],
    }
    doc.update(over)
    return doc


def _write(path: Path, *docs: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_burst_run_metrics_from_ttfts_and_itls(tmp_path: Path) -> None:
    f = _write(tmp_path / "bench.jsonl", _result())
    (run,) = read_sglang_bench(f)
    assert run.run_id == "sglang-bench" and run.config["arrivals"] == "burst"
    assert run.config["failed_requests"] == 1 and run.num_requests == 3
    db = tmp_path / "s.duckdb"
    write_runs(db, [run])
    m = serving_metrics(db)
    assert m.stats["ttft"]["mean"] == pytest.approx((0.1 + 0.3 + 0.05) / 3)
    e2e = [0.1 + 0.1, 0.3 + 0.04, 0.05 + 0.5]
    assert m.stats["e2e"]["mean"] == pytest.approx(sum(e2e) / 3)
    tpot = [0.1 / 10, 0.04 / 2, 0.5 / 1]
    assert m.stats["tpot"]["mean"] == pytest.approx(sum(tpot) / 3)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT DISTINCT t_arrival FROM requests").fetchall() == [(0.0,)]
    assert (
        json.loads(con.execute("SELECT config FROM runs").fetchone()[0])["benchmark"][
            "request_rate"
        ]
        == "inf"
    )
    con.close()


def test_recorded_and_unknown_arrivals(tmp_path: Path) -> None:
    rec = _result(
        start_times=[100.0, 100.5, 101.0, 101.5], latencies=[0.3, 0.4, 0.6, 0.0], request_rate=2.0
    )
    unk = _result(request_rate=2.0)
    f = _write(tmp_path / "two.jsonl", rec, {"backend": "sglang", "duration": 1.0}, unk)
    runs = read_sglang_bench(f, run_id="s")
    assert [r.run_id for r in runs] == ["s-1", "s-3"]  # the summary-only line is skipped
    a, b = runs
    assert a.config["arrivals"] == "recorded" and b.config["arrivals"] == "unknown"
    assert a.requests["t_arrival"] == [0.0, 0.5, 1.0]
    assert a.requests["t_done"] == pytest.approx([0.3, 0.9, 1.6])  # latencies win over itls
    assert a.requests["t_sent"] == [0.0, 0.5, 1.0]


def test_server_info_gives_the_engine_settings(tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_text(json.dumps({
        "model_path": "Qwen/Qwen3-30B-A3B", "tp_size": 2, "dp_size": 2, "ep_size": 4,
        "max_running_requests": 128, "chunked_prefill_size": 8192, "page_size": 16,
        "mem_fraction_static": 0.85, "enable_mixed_chunk": False, "disable_radix_cache": False,
        "cuda_graph_max_bs": 160, "version": "0.5.2",
        "internal_states": [{"max_total_num_tokens": 480000}],
    }))  # fmt: skip
    e = server_settings(info)
    assert (e.engine, e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (
        "sglang",
        2,
        2,
        4,
    )
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.block_size, e.num_gpu_blocks) == (
        128,
        8192,
        16,
        30000,
    )
    assert (
        e.mixed_prefill_decode is False
        and e.enable_prefix_caching
        and e.cuda_graph_max_batch == 160
    )
    f = _write(tmp_path / "b.jsonl", _result())
    (run,) = read_sglang_bench(f, server_info=info)
    assert (
        run.node_names == ["sglang-dp0", "sglang-dp1"]
        and run.config["engine"]["max_num_seqs"] == 128
    )
    info.write_text('{"tp_size": 2,\n "mem_fraction_static": 1.5}')
    with pytest.raises(
        ImportFileError, match=r"info.json: line 2: field mem_fraction_static: must be in"
    ):
        server_settings(info)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {k: v for k, v in _result().items() if k != "itls"},
            r"line 2: field itls: missing: .*--output-details",
        ),
        (_result(ttfts=[0.1, 0.2]), r"line 2: field ttfts: has 2 entries but input_lens has 4"),
        (
            _result(ttfts=[0.1, -0.3, 0.1, 0.0]),
            r"line 2: field ttfts\[1\]: expected a finite number >= 0, got -0.3",
        ),
        (
            _result(input_lens=[100, 2.5, 1, 1]),
            r"line 2: field input_lens\[1\]: expected an integer >= 0",
        ),
        (
            _result(itls=[[0.1], 0.2, [], []]),
            r"line 2: field itls\[1\]: expected an array, got 0.2",
        ),
        (
            _result(latencies=[0.05, 1, 1, 1]),
            r"line 2: field latencies\[0\]: 0.05 is shorter than its TTFT 0.1",
        ),
        (_result(errors=["x", "y", "z", "w"]), r"line 2: field errors: all 4 requests failed"),
    ],
)
def test_malformed_lines_name_file_line_and_field(
    tmp_path: Path, doc: dict[str, object], expected: str
) -> None:
    f = _write(tmp_path / "bad.jsonl", _result(), doc)
    with pytest.raises(ImportFileError, match=r"bad.jsonl: " + expected):
        read_sglang_bench(f)


def test_files_without_details_or_json(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"backend": "sglang", "duration": 3}\n')
    with pytest.raises(
        ImportFileError, match=r"x.jsonl: line 1: field input_lens: missing on every line"
    ):
        read_sglang_bench(f)
    f.write_text('{"backend": "sglang"}\n{oops\n')
    with pytest.raises(ImportFileError, match=r"x.jsonl: line 2: not valid JSON"):
        read_sglang_bench(f)


def test_cli_imports_every_run_or_none(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    good = _write(tmp_path / "good.jsonl", _result(), _result(request_rate=4.0))
    res = runner.invoke(app, ["import", "sglang-bench", str(good), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["run_id"] for r in out["runs"]] == ["sglang-good-1", "sglang-good-2"]
    assert out["runs"][1]["arrivals"] == "unknown"
    # runs -1 and -2 collide with existing ids, -3 is new: none of the three is written
    again = _write(tmp_path / "good2.jsonl", _result(), _result(), _result())
    res = runner.invoke(
        app, ["import", "sglang-bench", str(again), "--db", str(db), "--run-id", "sglang-good"]
    )
    assert res.exit_code == 2 and "already exists" in res.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (2,)
    con.close()
