"""LLMServingSim operator tables (cluster.hardware.operator_tables): sums, TP scaling, errors."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from hardware_fixtures import P32, P4090, QWEN32

from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables, ProfileError
from cluster.hardware.pricer import IterationPricer, Parallelism


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_per_layer_and_per_iteration_sums_follow_the_decoder_layer() -> None:
    t = OperatorTables.load(P4090)
    rows = [r for r in _csv(P4090 / "dense.csv") if r["tokens"] == "512"]
    op = {r["layer"]: float(r["time_us"]) * 1e-6 for r in rows}
    layer = (
        sum(v for k, v in op.items() if k not in ("embedding", "final_layernorm")) + op["layernorm"]
    )
    assert t.dense_layer(512.0) == pytest.approx(layer, rel=1e-12)
    assert t.dense_iter(512.0) == pytest.approx(op["embedding"] + op["final_layernorm"], rel=1e-12)
    seq = {
        r["layer"]: float(r["time_us"]) * 1e-6
        for r in _csv(P4090 / "per_sequence.csv")
        if r["sequences"] == "64"
    }
    assert t.per_seq(64.0) == pytest.approx(sum(seq.values()), rel=1e-12)
    assert t.max_tokens == 2048 and t.moe is None and "qkv_proj" in t.ops
    # past the measured sizes: linear from the last two points, never below them
    assert t.dense_layer(4096.0) > t.dense_layer(2048.0)
    assert OperatorTables.from_json(t.to_json()).to_json() == t.to_json()


def test_tp1_scaled_to_tp2_tracks_the_measured_tp2_bundle() -> None:
    """Iteration times of the TP 1 bundle scaled to TP 2 against the bundle measured at TP 2
    (pure prefill and decode points; no communication on either side)."""
    shape = ModelShape.load(QWEN32)
    par = Parallelism(tp=2, link_gbps=1e12, link_latency_s=0.0)
    scaled = IterationPricer(OperatorTables.load(P32, profiled_tp=1, tp=2), shape, par)
    measured = IterationPricer(OperatorTables.load(P32 / "tp2", profiled_tp=2), shape, par)
    errs = []
    for pc, kp, nd, kd, _ in measured.tables.attention:
        args = ([(int(pc), int(kp))] if pc else [], [int(kd)] * int(nd))
        errs.append(scaled.time(*args) / measured.time(*args) - 1.0)
    e = np.asarray(errs)
    assert len(e) > 150
    assert np.mean(np.abs(e)) < 0.06  # measured: 3.7-5.4% per phase on the full bundles
    assert -0.08 < np.mean(e) < 0.0  # splitting is a little less than perfect


def _broken(tmp_path: Path, name: str, line: int, text: str) -> Path:
    d = tmp_path / "prof"
    shutil.copytree(P4090, d)
    lines = (d / name).read_text().splitlines()
    lines[line - 1] = text
    (d / name).write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize(
    ("name", "line", "text", "message"),
    [
        (
            "dense.csv",
            5,
            "qkv_proj,abc,1.0",
            r"dense.csv: line 5: field tokens must be an integer >= 0, got 'abc'",
        ),
        (
            "dense.csv",
            7,
            "qkv_proj,8,-3",
            r"dense.csv: line 7: field time_us must be a finite number >= 0, got '-3'",
        ),
        (
            "attention.csv",
            1,
            "prefill_chunk,kv_prefill,n_decode,time_us",
            r"attention.csv: line 1: missing column\(s\) kv_decode",
        ),
        (
            "attention.csv",
            9,
            "0,0,0,0,3.0",
            r"attention.csv: line 9: field prefill_chunk and n_decode are both 0",
        ),
        ("per_sequence.csv", 3, ",2,1.0", r"per_sequence.csv: line 3: field layer is empty"),
    ],
)
def test_malformed_files_name_file_line_and_field(
    tmp_path: Path, name: str, line: int, text: str, message: str
) -> None:
    with pytest.raises(ProfileError, match=message):
        OperatorTables.load(_broken(tmp_path, name, line, text))


def test_missing_files_and_tp_scaling_limits(tmp_path: Path) -> None:
    d = tmp_path / "p"
    shutil.copytree(P4090, d)
    (d / "per_sequence.csv").unlink()
    with pytest.raises(ProfileError, match=r"per_sequence\.csv: file is missing"):
        OperatorTables.load(d)
    with pytest.raises(ProfileError, match="scaling is from TP 1 only"):
        OperatorTables.load(P32 / "tp2", profiled_tp=2, tp=4)
