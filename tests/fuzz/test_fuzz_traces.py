"""Fuzzing trace files: valid records round-trip; anything else is a `FILE:LINE:` error.

Never a hang, never a traceback: every record either replays or fails `make_workload` with a
`ConfigError` that names the file and line (or, for the whole file, the file).
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.core import ConfigError
from cluster.workloads import make_workload
from cluster.workloads.trace_fields import MAX_REQUEST_TOKENS

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# JSON scalars a broken exporter might write, including non-finite and huge numbers.
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
valid_record = st.fixed_dictionaries(
    {
        "timestamp": st.integers(0, 10**9),
        "input_length": st.integers(1, 200_000),
        "output_length": st.integers(0, 50_000),
        "hash_ids": st.lists(st.integers(0, 10_000), max_size=20),
    }
)


def _field_or_junk(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, junk)


any_record = st.fixed_dictionaries(
    {
        "timestamp": _field_or_junk(st.integers(0, 10**9)),
        "input_length": _field_or_junk(st.integers(0, 2 * MAX_REQUEST_TOKENS)),
        "output_length": _field_or_junk(st.integers(0, 10**6)),
    },
    optional={"hash_ids": _field_or_junk(st.lists(st.integers(-2, 2**40), max_size=6))},
)


_DIR = Path(tempfile.mkdtemp(prefix="pdlab-fuzz-traces-"))


def _write(name: str, text: str) -> Path:
    path = _DIR / name  # one file per format, rewritten by every example
    path.write_text(text)
    return path


def teardown_module() -> None:
    shutil.rmtree(_DIR, ignore_errors=True)


def _load_or_error(path: Path) -> Any:
    try:
        return make_workload(str(path))
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)), msg
        assert "\n" not in msg
        return exc


@SETTINGS
@given(st.lists(valid_record, min_size=1, max_size=15))
def test_valid_mooncake_records_round_trip(records: list[dict[str, Any]]) -> None:
    path = _write("mc.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    progs = make_workload(str(path)).trace_programs()
    assert [p.arrival_s for p in progs] == [r["timestamp"] / 1000.0 for r in records]
    assert [p.turns[0].append_tokens for p in progs] == [r["input_length"] for r in records]
    assert [p.turns[0].output_tokens for p in progs] == [r["output_length"] for r in records]


@SETTINGS
@given(
    st.lists(
        st.one_of(
            any_record.map(json.dumps),
            st.sampled_from(["", "{", "[1, 2]", '"text"', "NaN", '{"timestamp": NaN}']),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_mooncake_file_loads_or_names_file_and_line(lines: list[str]) -> None:
    text = json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}) + "\n"
    text += "\n".join(lines) + "\n"
    result = _load_or_error(_write("mc.jsonl", text))
    if isinstance(result, ConfigError):
        head = str(result).split(": ", 1)[0]
        assert head.endswith(".jsonl") or head.rsplit(":", 1)[1].isdigit(), str(result)
    else:
        for p in result.trace_programs():
            assert p.arrival_s is not None and math.isfinite(p.arrival_s) and p.arrival_s >= 0
            tokens = p.turns[0].append_tokens
            assert 0 < tokens <= MAX_REQUEST_TOKENS


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.one_of(st.floats(allow_nan=True), st.text(max_size=6), st.integers(-5, 10**6)),
            st.one_of(st.integers(-5, 3 * MAX_REQUEST_TOKENS), st.text(max_size=4), st.floats()),
            st.one_of(st.integers(-5, 10**5), st.text(max_size=4), st.floats()),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_any_azure_csv_loads_or_names_file_and_line(rows: list[tuple[Any, Any, Any]]) -> None:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
    w.writerow([0.0, 10, 2])
    w.writerows(rows)
    result = _load_or_error(_write("az.csv", out.getvalue()))
    if not isinstance(result, ConfigError):
        assert all(math.isfinite(p.arrival_s) for p in result.trace_programs())


swe_record = st.fixed_dictionaries(
    {
        "run": _field_or_junk(st.just("bs1")),
        "instance": _field_or_junk(st.sampled_from(["a", "b"])),
        "step": _field_or_junk(st.integers(0, 5)),
        "input_tokens": _field_or_junk(st.integers(1, 10_000)),
        "output_tokens": _field_or_junk(st.integers(0, 1_000)),
        "llm_enter": _field_or_junk(st.floats(0, 1e6)),
        "llm_exit": _field_or_junk(st.floats(0, 1e6)),
    }
)


@SETTINGS
@given(st.lists(swe_record, min_size=1, max_size=8))
def test_any_sweagent_file_loads_or_names_file_and_line(records: list[dict[str, Any]]) -> None:
    first = {"run": "bs1", "instance": "a", "step": 0, "input_tokens": 10, "output_tokens": 1,
             "llm_enter": 0.0, "llm_exit": 1.0}  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in [first, *records])
    _load_or_error(_write("swe.jsonl", text))
