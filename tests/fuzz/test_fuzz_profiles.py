"""Fuzzing `pdlab profile import`: operator CSVs, model configs and options (issue 28).

Any CSV cell, any config value and any option value either gives a profile whose JSON is
strict (no NaN or Infinity: a strict reader loads it) and whose model is possible, or a
one-line `error:` naming the file or the flag (exit 2) with no profile file written. The
model configs and CSVs go through the library in-process (`ModelShape.from_hf_config`,
`OperatorTables.load`: fast); options through the CLI, refused before any fitting.
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

import pytest
from fuzz_cli import cli, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.core import ConfigError
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables, ProfileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROFILE = FIXTURES / "profiles/llmservingsim_rtx4090_llama31_8b"
LLAMA = FIXTURES / "models/meta-llama/Llama-3.1-8B.json"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -5, 10**6, 10**9, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(0, 3), max_size=2),
)
_DIR = Path(tempfile.mkdtemp(prefix="pdlab-fuzz-profile-"))


def teardown_module() -> None:
    shutil.rmtree(_DIR, ignore_errors=True)


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"non-finite number {name} in JSON")

    return json.loads(text, parse_constant=refuse)


@SETTINGS
@given(
    key=st.sampled_from(
        [
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "kv_lora_rank",
            "torch_dtype",
        ]
    ),
    value=junk,
)
def test_any_model_config_value(key: str, value: Any) -> None:
    cfg = json.loads(LLAMA.read_text())
    cfg[key] = value
    try:
        shape = ModelShape.from_hf_config(cfg, source="cfg.json")
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("cfg.json: ") and "\n" not in msg, msg
        return
    # accepted: a model that can exist, with positive KV bytes and weights
    assert 1 <= shape.num_kv_heads <= shape.num_heads
    assert 1 <= shape.num_layers <= 2048
    assert shape.kv_bytes_per_token(1) >= 1 and shape.weight_bytes() >= 1
    _strict(json.dumps(shape.to_json()))


cell = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "abc", "1e300", "-0", "nan", "inf", "1" * 400, '"', "a,b"]),
)


@SETTINGS
@given(
    which=st.sampled_from(["dense.csv", "per_sequence.csv", "attention.csv"]),
    row=st.integers(1, 30),
    col=st.integers(0, 4),
    value=cell,
)
def test_any_operator_csv_cell(which: str, row: int, col: int, value: str) -> None:
    d = _DIR / "prof"
    if not d.exists():  # the first 40 lines of each table: parsing, not fitting, is tested
        d.mkdir()
        for f in PROFILE.glob("*.csv"):
            (d / f.name).write_text("".join(f.read_text().splitlines(keepends=True)[:40]))
    target = d / which
    original = target.read_text()
    rows = list(csv.reader(io.StringIO(original)))
    r = rows[min(row, len(rows) - 1)]
    r[min(col, len(r) - 1)] = value
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    target.write_text(buf.getvalue())
    try:
        tables = OperatorTables.load(d)
    except ProfileError as exc:
        msg = str(exc)
        assert msg.startswith(str(target)) and "\n" not in msg, msg
        return
    finally:
        target.write_text(original)
    _strict(json.dumps(tables.to_json()))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=200))
def test_any_bytes_as_an_operator_csv(data: bytes) -> None:
    d = _DIR / "bytes"
    if not d.exists():
        shutil.copytree(PROFILE, d)
    (d / "dense.csv").write_bytes(data)
    with pytest.raises(ProfileError) as err:
        OperatorTables.load(d)
    assert str(err.value).startswith(str(d / "dense.csv")) and "\n" not in str(err.value)


flag_value = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e300", "1e6", "-0.0", "abc", ""]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**40), 2**40).map(str),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    flag=st.sampled_from(
        [
            "--link-gbps",
            "--link-latency-us",
            "--expert-load-skew",
            "--gpu-memory-gib",
            "--tp",
            "--dp",
            "--ep",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--profiled-tp",
        ]
    ),
    value=flag_value,
)
def test_profile_import_options_are_refused_before_fitting_or_valid(flag: str, value: str) -> None:
    """Refused values exit 2 with one line and write nothing; the probe's NaN/Infinity
    never reach the profile. (An accepted value would start a fit: those are skipped here,
    the fit of valid options is tested in tests/toolkit/test_profile_cli.py.)"""
    from cluster import size_limits as limits

    out = _DIR / "p.json"
    out.unlink(missing_ok=True)
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    ranges = {
        "--link-gbps": limits.LINK_GBPS,
        "--link-latency-us": limits.LINK_LATENCY_US,
        "--expert-load-skew": limits.EXPERT_LOAD_SKEW,
        "--gpu-memory-gib": limits.GPU_MEMORY_GIB,
        "--tp": limits.TENSOR_PARALLEL,
        "--dp": limits.DATA_PARALLEL,
        "--ep": limits.Limit(1, 1),  # at most TP x DP = 1 with the other defaults
        "--max-num-seqs": limits.MAX_NUM_SEQS,
        "--max-num-batched-tokens": limits.BATCHED_TOKENS,
        "--profiled-tp": limits.Limit(1, 1),  # a TP 1 bundle: another is refused
    }
    integer = flag.startswith(("--tp", "--dp", "--ep", "--max-num", "--profiled"))
    try:
        if integer and not value.lstrip("-").isdigit():
            raise ValueError(value)  # typer refuses it
        ranges[flag].check(flag, int(value) if integer else x)
        in_range = True
    except (ConfigError, ValueError, OverflowError):
        in_range = False
    if in_range:
        return  # would fit a profile (seconds): not a refusal case
    code, text = cli("profile", "import", str(PROFILE), "--model-config", str(LLAMA),
                     "-o", str(out), flag, value)  # fmt: skip
    one_line_error(code, text)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--link-gbps", "nan"], "--link-gbps"),
        (["--link-gbps", "-1"], "--link-gbps must be > 0"),
        (["--expert-load-skew", "inf"], "--expert-load-skew"),
        (["--tp", "1000000"], "--tp must be at most 1,024"),
    ],
)
def test_probe_profile_import_impossible_options(args: list[str], words: str) -> None:
    out = _DIR / "probe.json"
    out.unlink(missing_ok=True)
    code, text = cli(
        "profile", "import", str(PROFILE), "--model-config", str(LLAMA), "-o", str(out), *args
    )
    one_line_error(code, text, words)
    assert not out.exists()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"num_key_value_heads": 64}, "num_key_value_heads"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"hidden_size": 16, "num_attention_heads": 32, "head_dim": 0}, "head_dim"),
    ],
)
def test_probe_impossible_model_configs(change: dict[str, Any], words: str) -> None:
    """1e9 layers, more KV heads than heads, 0 KV heads, KV bytes per token 0 (a config
    whose head_dim falls to 0); -5 comes from a profile document (test_fuzz_twin.py)."""
    cfg = json.loads(LLAMA.read_text()) | change
    path = _DIR / "model.json"
    path.write_text(json.dumps(cfg))
    out = _DIR / "probe.json"
    out.unlink(missing_ok=True)
    code, text = cli("profile", "import", str(PROFILE), "--model-config", str(path), "-o", str(out))
    one_line_error(code, text, "model.json", words)
    assert not out.exists()


def test_probe_a_non_utf8_csv_names_its_file() -> None:
    d = _DIR / "latin"
    shutil.copytree(PROFILE, d, dirs_exist_ok=True)
    (d / "dense.csv").write_bytes("layer,tokens,time_us\nrms\xe9,1,2.0\n".encode("latin-1"))
    code, text = cli("profile", "import", str(d), "--model-config", str(LLAMA),
                     "-o", str(_DIR / "x.json"))  # fmt: skip
    one_line_error(code, text, "dense.csv", "line 2", "not UTF-8")


def test_probe_a_profile_csv_that_is_a_device(tmp_path: Path) -> None:
    d = tmp_path / "prof"
    shutil.copytree(PROFILE, d)
    (d / "attention.csv").unlink()
    (d / "attention.csv").symlink_to("/dev/zero")
    code, text = cli("profile", "import", str(d), "--model-config", str(LLAMA),
                     "-o", str(tmp_path / "x.json"))  # fmt: skip
    one_line_error(code, text, "attention.csv", "character device")
    (d / "cfg.json").symlink_to("/dev/zero")
    code, text = cli("profile", "import", str(PROFILE), "--model-config", str(d / "cfg.json"),
                     "-o", str(tmp_path / "x.json"))  # fmt: skip
    one_line_error(code, text, "cfg.json", "character device")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", "not valid JSON"),
        (None, "is a directory"),
        (b"\x89PNG\r\n\x1a\n\x00", "binary data"),
    ],
)
def test_probe_model_configs_that_are_not_json_objects(
    tmp_path: Path, content: str | bytes | None, words: str
) -> None:
    path = tmp_path / "config.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "x.json"
    code, text = cli("profile", "import", str(PROFILE), "--model-config", str(path), "-o", str(out))
    one_line_error(code, text, "config.json", words)
    assert not out.exists()
