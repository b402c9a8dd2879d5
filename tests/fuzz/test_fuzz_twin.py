"""Fuzzing `pdlab twin`'s options and `--what-if KEY=VALUE` (issue 28).

Every value is either within its ceiling (cluster.size_limits) before anything is replayed,
or refused with one `error:` line and exit 2: `--what-if data_parallel_size=1000000` took
27 s and 2.5 GB, `--what-if gpu_memory_gib=inf` and `--link-gbps nan` got past the options.
The parsing is fuzzed in-process (fast); refusals through the CLI, on a database holding the
RTX 4090 vLLM fixture run and its fitted profile, and the probe's what-if in a subprocess
with its memory and time measured.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fuzz_cli import RSS_CAP_MB, cli, one_line_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.twin.whatif import PD_KEYS, WHAT_IF_KEYS, WHAT_IF_LIMITS, parse_changes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUN = BUNDLED / "real_runs/rtx4090_llama31_8b_vllm"
LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
numbers = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e300", "1e6", "1000000", "abc", ""]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**70), 2**70).map(str),
)


@pytest.fixture(scope="module")
def twin_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("twin")
    profile = d / "rtx4090.json"
    fitted = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", ModelShape.load(LLAMA)
    )
    profile.write_text(json.dumps(fitted.to_json(), allow_nan=False))
    db = d / "run.duckdb"
    write_runs(db, [read_vllm_bench(RUN)])
    return db, profile


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from([*WHAT_IF_KEYS, *PD_KEYS, "bogus"]), value=numbers)
def test_what_if_values_are_within_their_ceilings_or_refused(key: str, value: str) -> None:
    try:
        changes = parse_changes([f"{key}={value}"])
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--what-if")
        return
    v = changes[key]
    if key in WHAT_IF_LIMITS:
        limit = WHAT_IF_LIMITS[key]
        assert math.isfinite(v) and limit.lo <= v <= limit.hi, (key, v)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    flag=st.sampled_from(
        [
            "--gpu-memory-gib",
            "--gpu-memory-utilization",
            "--link-gbps",
            "--link-latency-us",
            "--max-num-seqs",
            "--max-num-batched-tokens",
        ]
    ),
    value=numbers,
)
def test_twin_options_out_of_range_are_refused(
    twin_inputs: tuple[Path, Path], flag: str, value: str
) -> None:
    db, profile = twin_inputs
    limit = {
        "--gpu-memory-gib": limits.GPU_MEMORY_GIB,
        "--gpu-memory-utilization": limits.UTILIZATION,
        "--link-gbps": limits.LINK_GBPS,
        "--link-latency-us": limits.LINK_LATENCY_US,
        "--max-num-seqs": limits.MAX_NUM_SEQS,
        "--max-num-batched-tokens": limits.BATCHED_TOKENS,
    }[flag]
    try:
        x = float(value)
        limit.check(flag, int(value) if limit.integer else x)
        return  # a valid value replays the run (seconds): tested in tests/toolkit/test_twin.py
    except (ValueError, OverflowError, ConfigError):
        pass
    code, out = cli("twin", str(db), "--profile", str(profile), "--no-store", flag, value)
    one_line_error(code, out)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--link-gbps", "nan"], "--link-gbps"),
        (["--link-gbps", "-1"], "--link-gbps must be > 0"),
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib"),
        (["--what-if", "gpu_memory_gib=inf"], "gpu_memory_gib"),
        (["--what-if", "num_gpu_blocks=100000000000000"], "num_gpu_blocks"),
    ],
)
def test_probe_twin_impossible_values(
    twin_inputs: tuple[Path, Path], args: list[str], words: str
) -> None:
    db, profile = twin_inputs
    code, out = cli("twin", str(db), "--profile", str(profile), "--no-store", *args)
    one_line_error(code, out, words)


def test_probe_what_if_data_parallel_1e6_is_refused_before_replay(
    twin_inputs: tuple[Path, Path],
) -> None:
    """`--what-if data_parallel_size=1000000` took 27 s and 2.5 GB."""
    db, profile = twin_inputs
    res = run_cli("twin", str(db), "--profile", str(profile), "--no-store",
                  "--what-if", "data_parallel_size=1000000")  # fmt: skip
    one_line_error(res.code, res.err, "data_parallel_size", "at most 4,096")
    assert res.peak_rss_mb < RSS_CAP_MB and res.seconds < 30, res


@pytest.mark.parametrize(
    ("field", "value"),
    [("head_dim", -5), ("head_dim", 0), ("num_kv_heads", 0), ("num_layers", 10**9)],
)
def test_probe_a_profile_whose_model_is_impossible(
    twin_inputs: tuple[Path, Path], tmp_path: Path, field: str, value: int
) -> None:
    """KV bytes per token 0 or -5 (a tampered profile's model) are refused, not priced."""
    db, profile = twin_inputs
    doc = json.loads(profile.read_text())
    doc["model"][field] = value
    bad = tmp_path / "bad-profile.json"
    bad.write_text(json.dumps(doc))
    code, out = cli("twin", str(db), "--profile", str(bad), "--no-store")
    one_line_error(code, out, "bad-profile.json", field)
