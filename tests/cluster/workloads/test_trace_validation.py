"""Every trace record is validated before a simulation starts: `FILE:LINE: FIELD: ... (allowed: ...)`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.workloads import make_workload

ROOT = Path(__file__).resolve().parents[3]
MOONCAKE_OK = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
SWE_OK = {
    "run": "bs1", "instance": "i", "step": 1, "input_tokens": 100, "output_tokens": 5,
    "llm_enter": 1760234763.9, "llm_exit": 1760234767.4,
}  # fmt: skip


def _jsonl(tmp_path: Path, name: str, records: list[dict], raw_line: str | None = None) -> Path:
    path = tmp_path / name
    lines = [json.dumps(r) for r in records]
    if raw_line is not None:
        lines.append(raw_line)
    path.write_text("\n".join(lines) + "\n")
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        make_workload(str(path))
    return str(err.value)


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        ({"timestamp": -1e18}, "timestamp", "is negative"),
        ({"timestamp": "soon"}, "timestamp", "is not a number"),
        ({"input_length": 1_000_000_000_000}, "input_length", "is out of range"),
        ({"input_length": 12.5}, "input_length", "is not an integer"),
        ({"output_length": -3}, "output_length", "is out of range"),
        ({"output_length": True}, "output_length", "is not an integer"),
        ({"hash_ids": [1, "x"]}, "hash_ids", "holds 'x'"),
        ({"hash_ids": [-1]}, "hash_ids", "holds -1"),
        ({"hash_ids": 7}, "hash_ids", "is not a list"),
    ],
)
def test_mooncake_records_are_checked(tmp_path: Path, bad: dict, field: str, words: str) -> None:
    path = _jsonl(tmp_path, "mc.jsonl", [MOONCAKE_OK, {**MOONCAKE_OK, **bad}])
    msg = _error(path)
    assert msg.startswith(f"{path}:2: {field}: ") and words in msg and "(allowed: " in msg, msg


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_refused(tmp_path: Path, literal: str) -> None:
    line = f'{{"timestamp": {literal}, "input_length": 10, "output_length": 1}}'
    path = _jsonl(tmp_path, "mc.jsonl", [MOONCAKE_OK], raw_line=line)
    assert re.match(
        rf"{re.escape(str(path))}:2: timestamp: .* is not finite \(allowed", _error(path)
    )


def test_sweagent_records_are_checked(tmp_path: Path) -> None:
    cases = [
        ({"llm_enter": float("nan")}, "llm_enter", "is not finite"),
        ({"llm_exit": "later"}, "llm_exit", "is not a number"),
        ({"input_tokens": 0}, "input_tokens", "is out of range"),
        ({"output_tokens": 2**40}, "output_tokens", "is out of range"),
        ({"step": 1.5}, "step", "is not an integer"),
        ({"instance": 3}, "instance", "is not a string"),
        ({"prefill_time_s": "fast"}, "prefill_time_s", "is not a number"),
    ]
    for bad, field, words in cases:
        rec = {**SWE_OK, "step": 2, **bad}
        path = _jsonl(tmp_path, "swe.jsonl", [SWE_OK, rec])
        msg = _error(path)
        assert msg.startswith(f"{path}:2: {field}: ") and words in msg, msg
    missing = {k: v for k, v in SWE_OK.items() if k != "llm_exit"}
    path = _jsonl(tmp_path, "swe.jsonl", [SWE_OK, {**missing, "step": 2}])
    assert _error(path).startswith(f"{path}:2: llm_exit: missing")


def test_azure_rows_are_checked(tmp_path: Path) -> None:
    for row, field, words in [
        ("inf,5,5", "arrived_at", "is not finite"),
        ("-1,5,5", "arrived_at", "is negative"),
        ("0.5,abc,5", "num_prefill_tokens", "is not a number"),
        ("0.5,5,2.5", "num_decode_tokens", "is not an integer"),
        ("0.5,99999999999,5", "num_prefill_tokens", "is out of range"),
    ]:
        path = tmp_path / "az.csv"
        path.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n{row}\n")
        msg = _error(path)
        assert msg.startswith(f"{path}:3: {field}: ") and words in msg, msg


def test_continuum_messages_are_checked(tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a",
         "tool_calls": [{"function": {"name": "bash"}, "execution_time_seconds": -2}]},
        {"role": "user", "content": "obs"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"traj_id": "t1", "messages": msgs}]))
    msg = _error(path)
    assert "trajectory 0 (t1), message 2: execution_time_seconds: -2 is negative" in msg, msg


def test_max_tokens_bounds_records_and_can_be_raised(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "mc.jsonl", [{**MOONCAKE_OK, "input_length": 3_000_000}])
    assert "from 0 to 1,048,576 (max_tokens)" in _error(path)
    src = make_workload(str(path), max_tokens=4_000_000)
    assert src.trace_programs()[0].turns[0].append_tokens == 3_000_000


def test_valid_records_replay_unchanged(tmp_path: Path) -> None:
    recs = [{**MOONCAKE_OK, "timestamp": 1500.0 * i, "input_length": 600 + i} for i in range(5)]
    src = make_workload(str(_jsonl(tmp_path, "mc.jsonl", recs)))
    progs = src.trace_programs()
    assert [p.arrival_s for p in progs] == [1.5 * i for i in range(5)]
    assert [p.turns[0].append_tokens for p in progs] == [600 + i for i in range(5)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"timestamp": -1e18, "input_length": 100, "output_length": 5}, "timestamp"),
        ({"timestamp": 0, "input_length": 1_000_000_000_000, "output_length": 5}, "input_length"),
    ],
)
def test_simulate_refuses_the_trace_before_simulating(
    tmp_path: Path, record: dict, field: str
) -> None:
    path = _jsonl(tmp_path, "bad.jsonl", [MOONCAKE_OK, record])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["simulate", "--workload", str(path), "--nodes", "2", "--split", "1P1D",
            "--duration", "600", "--warmup", "0", "--planner", "static"]  # fmt: skip
    # Before validation these ran forever; now they fail in setup.
    res = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90,
    )  # fmt: skip
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"bad.jsonl:2: {field}:" in err, err
