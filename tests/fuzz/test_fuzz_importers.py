"""Fuzzing `pdlab import vllm-bench` and `pdlab import sglang-bench` (issue 28).

Whatever a file holds — a field of any JSON type or size, a line of junk, a file that is a
device, a directory, binary, non-UTF-8 or nested 100k deep — an import either stores a run
whose metrics are finite and meaningful, or refuses with one `error:` line naming the file
(exit 2) and leaves the database exactly as it was. The hostile files run as a user runs
them, in a subprocess with its address space capped (tests/fuzz/fuzz_cli.py), and their peak
RSS and time are measured. The `test_probe_*` cases are the probe's, each of which printed a
traceback, took gigabytes or stored meaningless numbers before.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fuzz_cli import RSS_CAP_MB, cli, one_line_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/real_runs/rtx4090_llama31_8b_vllm"
SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# JSON values a broken exporter might write, non-finite and huge numbers included.
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**30, 2**63, 2**64, -(2**63) - 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e15, 1e12, 0.0, -0.0]),
    st.text(max_size=6),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_DIR = Path(tempfile.mkdtemp(prefix="pdlab-fuzz-import-"))
_IDS = itertools.count()  # a fresh run id per example (a stored one must not repeat)


def teardown_module() -> None:
    shutil.rmtree(_DIR, ignore_errors=True)


def _dumps(v: Any) -> str:
    return json.dumps(v)  # NaN and Infinity as Python writes them: other tools do too


def _requests(n: int = 20) -> list[dict[str, Any]]:
    with open(FIXTURE / "requests.jsonl") as f:
        return [json.loads(next(f)) for _ in range(n)]


def _vllm_dir(
    name: str, meta: dict[str, Any] | None = None, lines: list[str] | None = None
) -> Path:
    d = _DIR / name
    d.mkdir(exist_ok=True)
    doc = json.loads((FIXTURE / "meta.json").read_text()) if meta is None else meta
    (d / "meta.json").write_text(_dumps(doc))
    body = lines if lines is not None else [_dumps(r) for r in _requests()]
    (d / "requests.jsonl").write_text("\n".join(body) + "\n")
    return d


def _sglang_doc(n: int = 6) -> dict[str, Any]:
    return {
        "backend": "sglang",
        "request_rate": "inf",
        "duration": 12.5,
        "completed": n,
        "input_lens": [100 + i for i in range(n)],
        "output_lens": [8] * n,
        "ttfts": [0.1 + 0.01 * i for i in range(n)],
        "itls": [[0.02] * 7 for _ in range(n)],
        "latencies": [0.3 + 0.01 * i for i in range(n)],
        "errors": [""] * n,
    }


def _state(db: Path) -> dict[str, Any]:
    """What a refused import must leave unchanged: every table's rows, run ids, statuses."""
    if not db.exists():
        return {}
    with duckdb.connect(str(db), read_only=True) as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        out: dict[str, Any] = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone() for t in tables
        }
        if "runs" in tables:
            out["ids"] = sorted(r[0] for r in con.execute("SELECT run_id FROM runs").fetchall())
    return out


@pytest.fixture(scope="module")
def db() -> Path:
    """A database that already holds one good run (what a refused import must not touch)."""
    path = _DIR / "fuzz.duckdb"
    code, out = cli("import", "vllm-bench", str(_vllm_dir("good")), "--db", str(path))
    assert code == 0, out
    return path


def _check_outcome(db: Path, before: dict[str, Any], code: int, out: str, source: Path) -> None:
    if code == 0:  # stored: every metric it prints is a finite, sane number
        doc = json.loads(out.strip().splitlines()[-1])
        for run in doc["runs"]:
            assert run["requests"] >= 1
            for name, v in run["metrics"].items():
                assert v is None or (math.isfinite(v) and v >= 0), (name, v)
                if v is not None and name.endswith("_s"):
                    assert v <= 1e7, (name, v)  # RUN_SPAN_S
        return
    one_line_error(code, out, str(source))
    assert _state(db) == before, out  # nothing half-written


@SETTINGS
@given(
    line=st.integers(0, 19),
    key=st.sampled_from(
        [
            "request_id",
            "input_toks",
            "output_toks",
            "arrival_time",
            "queued_ts",
            "scheduled_ts",
            "first_token_ts",
            "last_token_ts",
            "dp_rank",
        ]
    ),
    value=junk,
)
def test_vllm_requests_with_any_field_value(db: Path, line: int, key: str, value: Any) -> None:
    reqs = _requests()
    reqs[line][key] = value
    d = _vllm_dir("req", lines=[_dumps(r) for r in reqs])
    before = _state(db)
    code, out = cli(
        "import", "vllm-bench", str(d), "--db", str(db), "--run-id", f"r{next(_IDS)}", "--json"
    )
    _check_outcome(db, before, code, out, d)


@SETTINGS
@given(
    key=st.sampled_from(
        [
            "tensor_parallel_size",
            "data_parallel_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "kv_cache_dtype",
            "enable_expert_parallel",
        ]
    ),
    value=junk,
)
def test_vllm_meta_with_any_engine_value(db: Path, key: str, value: Any) -> None:
    meta = json.loads((FIXTURE / "meta.json").read_text())
    meta["engine_kwargs"][key] = value
    d = _vllm_dir("meta", meta=meta)
    before = _state(db)
    code, out = cli(
        "import", "vllm-bench", str(d), "--db", str(db), "--run-id", f"m{next(_IDS)}", "--json"
    )
    _check_outcome(db, before, code, out, d)


@SETTINGS
@given(
    key=st.sampled_from(["input_lens", "output_lens", "ttfts", "latencies", "itls", "errors"]),
    index=st.integers(0, 5),
    value=junk,
    duration=st.one_of(st.just(12.5), junk),
)
def test_sglang_results_with_any_entry(
    db: Path, key: str, index: int, value: Any, duration: Any
) -> None:
    doc = _sglang_doc()
    doc[key][index] = value
    doc["duration"] = duration
    f = _DIR / "bench.jsonl"
    f.write_text(_dumps(doc) + "\n")
    before = _state(db)
    code, out = cli(
        "import", "sglang-bench", str(f), "--db", str(db), "--run-id", f"s{next(_IDS)}", "--json"
    )
    _check_outcome(db, before, code, out, f)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=300))
def test_any_bytes_as_a_results_file(db: Path, data: bytes) -> None:
    f = _DIR / "bytes.jsonl"
    f.write_bytes(data)
    before = _state(db)
    code, out = cli("import", "sglang-bench", str(f), "--db", str(db), "--run-id", "bytes")
    assert code != 0
    one_line_error(code, out, str(f))
    assert _state(db) == before


# ---- the probe's cases ---------------------------------------------------------------------


def _requests_file(name: str, text: str | bytes) -> Path:
    d = _vllm_dir(name)
    p = d / "requests.jsonl"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return d


def _one_request(**changes: Any) -> str:
    r = _requests(1)[0]
    r.update(changes)
    return _dumps(r) + "\n"


@pytest.mark.parametrize(
    ("name", "make", "words"),
    [
        ("binary", lambda: _requests_file("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "binary data"),
        ("non-utf8", lambda: _requests_file("latin1", "caf\xe9\n".encode("latin-1")), "not UTF-8"),
        ("deep", lambda: _requests_file("deep", "[" * 100_000 + "]" * 100_000 + "\n"), "nested too deeply"),
        ("int64", lambda: _requests_file("int64", _one_request(output_toks=10**30)), "output_toks"),
        ("tokens", lambda: _requests_file("tokens", _one_request(output_toks=10**12)), "output_toks"),
        ("time", lambda: _requests_file("time", _one_request(last_token_ts=1e300)), "last_token_ts"),
        ("failed", lambda: _requests_file("failed", _one_request(first_token_ts=None)), "all 1 requests failed"),
    ],
)  # fmt: skip
def test_probe_vllm_bench_malformed_requests(db: Path, name: str, make: Any, words: str) -> None:
    d = make()
    before = _state(db)
    code, out = cli("import", "vllm-bench", str(d), "--db", str(db), "--run-id", f"p-{name}")
    one_line_error(code, out, "requests.jsonl", words)
    assert _state(db) == before


def test_probe_a_directory_where_a_file_is_expected(db: Path) -> None:
    d = _vllm_dir("dirs")
    (d / "requests.jsonl").unlink()
    (d / "requests.jsonl").mkdir()
    code, out = cli("import", "vllm-bench", str(d), "--db", str(db))
    one_line_error(code, out, "requests.jsonl", "is a directory")
    (d / "meta.json").unlink()
    (d / "meta.json").mkdir()
    code, out = cli("import", "vllm-bench", str(d), "--db", str(db))
    one_line_error(code, out, "meta.json", "is a directory")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"duration": 1e300}, "duration"),
        ({"duration": -1e15}, "duration"),
        ({"output_lens": [8, 8, 0, 8, 8, 8]}, "output_lens[2]"),
        ({"output_lens": [8, 8, 10**30, 8, 8, 8]}, "output_lens[2]"),
        ({"ttfts": [0.1, 1e300, 0.1, 0.1, 0.1, 0.1]}, "ttfts[1]"),
    ],
)
def test_probe_sglang_bench_meaningless_values(
    db: Path, change: dict[str, Any], words: str
) -> None:
    f = _DIR / "probe.jsonl"
    f.write_text(_dumps(_sglang_doc() | change) + "\n")
    before = _state(db)
    code, out = cli("import", "sglang-bench", str(f), "--db", str(db), "--run-id", "probe")
    one_line_error(code, out, "probe.jsonl", words)
    assert _state(db) == before


def test_probe_sglang_bench_deeply_nested(db: Path) -> None:
    f = _DIR / "deep.jsonl"
    f.write_text("{" + '"a":{' * 100_000 + "}" * 100_001 + "\n")
    code, out = cli("import", "sglang-bench", str(f), "--db", str(db))
    one_line_error(code, out, "deep.jsonl", "nested too deeply")


# ---- hostile files, as a user runs them: memory and time bounded ---------------------------


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_probe_dev_zero_costs_one_chunk(tmp_path: Path) -> None:
    """A symlink to /dev/zero grew to 3 GB in 3-9 s: refused at once, and with
    --allow-special-files refused at its first chunk (a NUL byte)."""
    d = tmp_path / "run"
    shutil.copytree(_vllm_dir("zero"), d)
    (d / "requests.jsonl").unlink()
    (d / "requests.jsonl").symlink_to("/dev/zero")
    db = tmp_path / "z.duckdb"
    res = run_cli("import", "vllm-bench", str(d), "--db", str(db))
    one_line_error(res.code, res.err, "requests.jsonl", "character device", "--allow-special-files")
    res = run_cli("--allow-special-files", "import", "vllm-bench", str(d), "--db", str(db))
    one_line_error(res.code, res.err, "requests.jsonl", "binary data")
    assert res.peak_rss_mb < RSS_CAP_MB, res
    assert not db.exists() or _state(db).get("ids", []) == []


def test_probe_a_stream_past_the_cap_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """An endless stream of valid lines stops at the data cap (here 8 MiB), not at OOM."""
    line = _one_request()
    big = tmp_path / "run"
    shutil.copytree(_vllm_dir("big"), big)
    with open(big / "requests.jsonl", "w") as f:
        for i in range(24 * 2**20 // len(line) + 1):
            f.write(line.replace('"bench-0"', f'"x{i}"'))
    res = run_cli(
        "--max-input-mb", "8", "import", "vllm-bench", str(big), "--db", str(tmp_path / "b.duckdb")
    )
    one_line_error(res.code, res.err, "requests.jsonl", "larger than the 8 MiB", "--max-input-mb")
    assert res.peak_rss_mb < RSS_CAP_MB, res


def test_probe_data_parallel_size_1e9_is_refused_before_allocation(tmp_path: Path) -> None:
    """meta.json with data_parallel_size 1e9 passed 3 GB in 17 s."""
    meta = json.loads((FIXTURE / "meta.json").read_text())
    meta["engine_kwargs"]["data_parallel_size"] = 1e9
    d = tmp_path / "run"
    shutil.copytree(_vllm_dir("dp", meta=meta), d)
    res = run_cli("import", "vllm-bench", str(d), "--db", str(tmp_path / "d.duckdb"))
    one_line_error(res.code, res.err, "meta.json", "data_parallel_size", "at most 4,096")
    assert res.peak_rss_mb < RSS_CAP_MB and res.seconds < 30, res
