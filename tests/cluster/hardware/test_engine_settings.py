"""Engine settings and KV capacity from GPU memory (cluster.hardware.engine_settings)."""

from __future__ import annotations

import dataclasses

import pytest
from hardware_fixtures import LLAMA, QWEN32

from cluster.core import ConfigError
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.model_shape import ModelShape

RTX4090 = EngineSettings(
    "vllm", max_num_seqs=256, max_num_batched_tokens=2048, num_gpu_blocks=2588,
    gpu_memory_utilization=0.9, gpu_memory_bytes=25_250_627_584,
)  # fmt: skip


def test_recorded_blocks_win_and_the_memory_estimate_lands_near_them() -> None:
    llama = ModelShape.load(LLAMA)
    cap = RTX4090.kv_capacity(llama)
    assert (cap.tokens, cap.blocks, cap.bytes_per_token, cap.source) == (
        41_408,
        2588,
        131_072,
        "recorded KV blocks",
    )
    est = dataclasses.replace(RTX4090, num_gpu_blocks=None).kv_capacity(llama)
    assert est.source == "GPU memory"
    assert est.blocks == pytest.approx(2588, rel=0.03)  # vLLM's own profiling found 2588
    # The reserve is what is left after weights and the recorded KV: check its size class.
    implied = 25_250_627_584 * 0.9 - RTX4090.weight_bytes(llama) - 2588 * 16 * 131_072
    assert RTX4090.non_kv_reserve_bytes(llama) == pytest.approx(implied, rel=0.1)


def test_capacity_follows_memory_utilization_tp_and_fp8() -> None:
    q = ModelShape.load(QWEN32)
    base = EngineSettings(tensor_parallel_size=2, gpu_memory_bytes=int(96 * GIB))
    a = base.kv_capacity(q)
    b = base.with_overrides(gpu_memory_utilization=0.8).kv_capacity(q)
    assert b.tokens < a.tokens
    fp8 = base.with_overrides(kv_cache_dtype="fp8").kv_capacity(q)
    assert fp8.bytes_per_token == a.bytes_per_token // 2 and fp8.tokens > 1.9 * a.tokens
    assert base.with_overrides(max_num_seqs=None) == base  # None keeps the recorded value
    with pytest.raises(ConfigError, match="no room for KV"):
        EngineSettings(gpu_memory_bytes=int(24 * GIB)).kv_capacity(q)
    with pytest.raises(ConfigError, match="--gpu-memory-gib"):
        EngineSettings().kv_capacity(q)
    with pytest.raises(ConfigError, match="unknown field"):
        base.with_overrides(max_batch=3)


def test_settings_round_trip_and_validate() -> None:
    assert EngineSettings.from_json(RTX4090.to_json()) == RTX4090
    assert EngineSettings.from_json({**RTX4090.to_json(), "later_field": 1}) == RTX4090
    with pytest.raises(ConfigError, match="gpu_memory_utilization must be in"):
        EngineSettings(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be an integer >= 1"):
        EngineSettings(tensor_parallel_size=0)


def test_an_ep_rank_holds_its_share_of_the_experts_and_the_rest_is_kv() -> None:
    """Qwen3-30B-A3B on a 96 GiB GPU: under EP 2 a rank holds half of the 128 experts and
    every attention and embedding weight; the experts it does not hold are KV room."""
    from hardware_fixtures import QWEN_MOE

    moe = ModelShape.load(QWEN_MOE)
    one = EngineSettings(max_num_seqs=128, max_num_batched_tokens=2048, gpu_memory_bytes=96 * GIB)
    ep2 = one.with_overrides(data_parallel_size=2, expert_parallel_size=2)
    experts = moe.param_counts()["ep"] * moe.dtype_bytes
    assert one.weight_bytes(moe) - ep2.weight_bytes(moe) == pytest.approx(experts / 2, abs=1)
    a, b = one.kv_capacity(moe), ep2.kv_capacity(moe)
    per_block = a.bytes_per_token * one.block_size
    assert b.blocks - a.blocks == pytest.approx(experts / 2 / per_block, abs=1)
    assert b.blocks > 1.9 * a.blocks  # the experts are most of the model's 57 GiB
    # the estimate's range: a larger reserve or less usable memory, a smaller reserve
    low, high = ep2.kv_blocks_range(moe)
    assert low < b.blocks < high
    # the RTX 4090 run's recorded blocks lie inside the range of its memory estimate
    llama = ModelShape.load(LLAMA)
    est = dataclasses.replace(RTX4090, num_gpu_blocks=None, gpu_memory_bytes=24 * GIB)
    lo, hi = est.kv_blocks_range(llama)
    assert lo <= 2588 <= est.kv_capacity(llama).blocks <= hi
