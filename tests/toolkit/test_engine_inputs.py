"""What an engine model gets for an imported run (toolkit.twin.engine_inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.twin.engine_inputs import engine_settings, load_engine_inputs

LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("inputs")
    db = tmp / "runs.duckdb"
    write_runs(
        db,
        [
            read_vllm_bench(
                BUNDLED / "real_runs/rtx4090_llama31_8b_vllm", run_id="llama", model_config=LLAMA
            ),
            read_vllm_bench(BUNDLED / "real_runs/rtxpro6000_qwen3_32b_vllm", run_id="qwen"),
        ],
    )
    prof = tmp / "p.json"
    p = build_profile(BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", ModelShape.load(LLAMA))
    prof.write_text(json.dumps(p.to_json()))
    return db, prof


def test_recorded_settings_capacity_and_requests(setup: tuple[Path, Path]) -> None:
    db, prof = setup
    x = load_engine_inputs(db, "llama", prof)
    assert (x.engine.max_num_seqs, x.engine.max_num_batched_tokens) == (256, 2048)
    assert (x.kv.tokens, x.kv.source) == (41_408, "recorded KV blocks")
    assert x.arrivals == "recorded" and x.requests.height == 300
    assert x.requests["t_arrival"].is_sorted() and x.requests["t_arrival"][0] == 0.0
    assert x.pricer.decode_time(8, 1000) > 0 and x.shape.num_layers == 32
    # GPU memory flags ask for vLLM's budget instead of the recorded blocks
    y = load_engine_inputs(db, "llama", prof, gpu_memory_gib=23.52, max_num_seqs=64)
    assert y.kv.source == "GPU memory" and y.kv.tokens == pytest.approx(41_408, rel=0.03)
    assert y.engine.max_num_seqs == 64
    assert engine_settings(db, "qwen").tensor_parallel_size == 2  # type: ignore[union-attr]


def test_profile_and_run_must_agree(setup: tuple[Path, Path], tmp_path: Path) -> None:
    db, prof = setup
    # the Llama profile for the Qwen run: refused for the model before anything else
    with pytest.raises(ConfigError, match=r"run served Qwen/Qwen3-32B, profile is for Llama"):
        load_engine_inputs(db, "qwen", prof)
    qwen = tmp_path / "qwen_tp1.json"
    shape = ModelShape.load(BUNDLED / "models/Qwen/Qwen3-32B.json")
    p = build_profile(BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_32b", shape)
    qwen.write_text(json.dumps(p.to_json()))
    with pytest.raises(
        ConfigError, match=r"prices TP 1; run 'qwen' ran TP 2 \(import the profile with --tp 2\)"
    ):
        load_engine_inputs(db, "qwen", qwen)
    fit = tmp_path / "fit.json"
    fit.write_text(
        json.dumps({"nodes": [{"prefill": {"coef": [1, 1, 1, 1]}, "decode": {"coef": [1, 1, 1]}}]})
    )
    with pytest.raises(ConfigError, match="not an operator profile"):
        load_engine_inputs(db, "llama", fit)


def test_collectives_use_the_recorded_link_unless_flags_say_otherwise(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    db, _ = setup
    qwen = BUNDLED / "models/Qwen/Qwen3-32B.json"
    p = build_profile(
        BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_32b/tp2",
        ModelShape.load(qwen),
        tp=2,
        profiled_tp=2,
    )
    prof = tmp_path / "tp2.json"
    prof.write_text(json.dumps(p.to_json()))
    x = load_engine_inputs(db, "qwen", prof)  # GPU memory from the cluster description
    par = x.pricer.parallel
    assert (par.tp, par.link_gbps, par.link_latency_s) == (2, 16, pytest.approx(20e-6))
    assert x.link == "recorded (cluster_config.json)" and x.kv.source == "GPU memory"
    y = load_engine_inputs(db, "qwen", prof, link_gbps=50.0)
    assert (y.pricer.parallel.link_gbps, y.pricer.parallel.link_latency_s) == (50.0, 20e-6)
    assert y.link == "flags" and y.pricer.decode_time(64, 1000) < x.pricer.decode_time(64, 1000)
    with pytest.raises(ConfigError, match="bandwidth must be > 0"):
        load_engine_inputs(db, "qwen", prof, link_gbps=0.0)
