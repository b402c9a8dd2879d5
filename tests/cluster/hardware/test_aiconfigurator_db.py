"""AIConfigurator's kernel tables read as tables: versions, filters, interpolation, errors.

Runs on the committed slice of aiconfigurator-core's h200_sxm/vllm tables
(tests/fixtures/aiconfigurator, Apache-2.0, see NOTICE there), not the 82 MB package.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.hardware import aiconfigurator_db as adb
from cluster.hardware.aiconfigurator_db import AicMissing, KernelDatabase

SYSTEMS = Path(__file__).resolve().parents[2] / "fixtures" / "aiconfigurator" / "systems"


def db() -> KernelDatabase:
    return KernelDatabase("h200_sxm", "vllm", None, SYSTEMS)


def test_the_system_spec_and_the_current_version_are_read() -> None:
    d = db()
    assert d.spec.mem_capacity_bytes == 151_397_597_184 and d.spec.mem_bw_bytes_s == 4.8e12
    path, version = d.table_path("gemm", "gemm_perf.parquet")
    assert version == "0.24.0" and path.is_file()  # query_versions.yaml's current for vllm


def test_an_unknown_system_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"system 'a100_sxm' is not in .*systems: h200_sxm"):
        KernelDatabase("a100_sxm", "vllm", None, SYSTEMS)


def test_gemm_is_exact_at_measured_points_and_a_power_law_between_them() -> None:
    g = db().gemm("fp8")
    n0, k0 = 4096, 4096
    m = g.curves[(n0, k0)].x
    assert np.allclose(g(m, n0, k0), g.curves[(n0, k0)].y)
    # between two measured n the latency is the geometric blend of its neighbours
    n1 = next(n for n in g.n_grid if n > n0)
    mid = int(np.sqrt(n0 * n1))
    lo, hi, at = g(m, n0, k0), g(m, n1, k0), g(m, mid, k0)
    assert np.all(at >= np.minimum(lo, hi) - 1e-12) and np.all(at <= np.maximum(lo, hi) + 1e-12)
    assert np.allclose(
        at,
        np.exp(
            np.log(lo)
            + (np.log(mid) - np.log(n0)) / (np.log(n1) - np.log(n0)) * (np.log(hi) - np.log(lo))
        ),
    )


def test_the_fastest_of_several_dtypes_is_taken_per_point() -> None:
    d = db()
    both = d.gemm(("fp8", "bfloat16"))
    m = both.curves[(4096, 4096)].x
    want = np.minimum(d.gemm("fp8")(m, 4096, 4096), d.gemm("bfloat16")(m, 4096, 4096))
    assert np.allclose(both(m, 4096, 4096), want)


def test_attention_grows_with_the_sequence_and_the_batch() -> None:
    d = db()
    ctx = d.context_attention(32, 8, 128, "fp8")
    gen = d.generation_attention(32, 8, 128, "fp8")
    x = np.array([1024.0, 4096.0, 16384.0])
    assert np.all(np.diff(ctx(1, x)) > 0)
    assert np.all(gen(64, x) > gen(1, x))


def test_every_table_read_is_recorded_once_per_call_and_read_once() -> None:
    d = db()
    d.gemm("fp8")
    n = len(d.uses)
    d.gemm("fp8")  # cached: recorded again, not read again
    assert len(d.uses) == 2 * n and d.uses[0] == d.uses[n]
    assert d.uses[0].table == "data/h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    assert d.uses[0].keys == {"gemm_dtype": ["fp8"]} and d.uses[0].rows > 1000


def test_missing_rows_raise_a_one_line_error() -> None:
    d = db()
    with pytest.raises(ConfigError, match="no MoE rows for 128 experts top-8 4096x1536 int4_wo"):
        d.moe(4096, 1536, 8, 128, 1, 2, "int4_wo", "balanced")
    with pytest.raises(ConfigError, match="no context_attention rows for 7 heads"):
        d.context_attention(7, 7, 128, "fp8")
    with pytest.raises(ConfigError, match="no all-reduce rows for 16 GPUs"):
        d.allreduce(16)


def test_a_requested_version_that_is_absent_falls_back_to_the_current(tmp_path: Path) -> None:
    root = tmp_path / "systems"
    shutil.copytree(SYSTEMS, root)
    old = root / "data/h200_sxm/gemm/vllm/0.24.0"
    old.rename(old.with_name("0.19.0"))
    d = KernelDatabase("h200_sxm", "vllm", "0.12.0", root)
    _, version = d.table_path("gemm", "gemm_perf.parquet")
    assert version == "0.19.0"  # neither 0.12.0 nor the current 0.24.0: the newest present


def test_without_the_package_the_message_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        adb.importlib.util,
        "find_spec",
        lambda name: None if name == "aiconfigurator_core" else real(name),
    )
    with pytest.raises(AicMissing, match=r"pip install 'pdlab\[aic\]'"):
        KernelDatabase("h200_sxm", "vllm")
