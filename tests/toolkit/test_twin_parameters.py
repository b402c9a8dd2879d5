"""One parameter system for every replay (toolkit.twin.parameters): each uncertain quantity
listed once with its source and range, and `vary` changing exactly what it names."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from cluster.hardware.pricer import Parallelism
from cluster.hardware.profile_error import moe_composed
from cluster.sim.engine_model import IterationOverhead
from toolkit.twin.parameters import (
    CPU_PER_ITERATION_S,
    CPU_PER_SEQUENCE_S,
    ReplaySetup,
    replay_parameters,
    vary,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
A6000 = BUNDLED / "lss_ispass26_a6000"
PHI = "microsoft/Phi-mini-MoE-instruct"


def _setup(pricer, engine: EngineSettings, shape: ModelShape) -> tuple[ReplaySetup, dict]:  # type: ignore[no-untyped-def]
    kv = engine.kv_capacity(shape)
    params = replay_parameters(engine, shape, pricer, kv, "described (cluster config)")
    return ReplaySetup(engine, kv.blocks, pricer, IterationOverhead()), {p.name: p for p in params}


def test_each_quantity_once_with_its_source_and_range() -> None:
    shape = ModelShape.load(LLAMA)
    par = Parallelism(tp=2, link_gbps=16.0, link_latency_s=20e-6)
    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", shape, tp=2, parallel=par
    )
    engine = EngineSettings(tensor_parallel_size=2, gpu_memory_bytes=24 * GIB)
    _, p = _setup(prof.pricer, engine, shape)
    assert list(p) == [
        "kv_blocks", "link_gbps", "link_latency_s", "collective_cost", "cpu_overhead",
        "cuda_graph_saving_s",
    ]  # fmt: skip
    # a described link is exact; its error is the collective cost's range
    assert p["link_gbps"].source == "described" and not p["link_gbps"].ranged
    assert (p["collective_cost"].low, p["collective_cost"].high) == (0.8, 1.25)
    assert p["kv_blocks"].source == "estimated" and p["kv_blocks"].low < p["kv_blocks"].value
    assert (p["cpu_overhead"].low, p["cpu_overhead"].high) == (0.0, 1.0)
    assert 0 < p["cuda_graph_saving_s"].high < 0.01  # launch gaps: well under an iteration
    # the profile's own link: assumed, each end ranged, no separate collective cost
    prof_link = replay_parameters(
        engine, shape, prof.pricer, engine.kv_capacity(shape), "profile's assumption"
    )
    names = {q.name: q for q in prof_link}
    assert "collective_cost" not in names
    assert (names["link_gbps"].low, names["link_gbps"].high) == (8.0, 64.0)
    assert names["link_latency_s"].source == "assumed"
    # recorded KV blocks are exact; an eager run has no CUDA-graph saving to range
    rec = dataclasses.replace(engine, num_gpu_blocks=1000)
    exact = replay_parameters(rec, shape, prof.pricer, rec.kv_capacity(shape), "flags", eager=True)
    names = {q.name: q for q in exact}
    assert names["kv_blocks"].source == "recorded" and not names["kv_blocks"].ranged
    assert names["link_gbps"].source == "given" and "cuda_graph_saving_s" not in names


def test_vary_changes_exactly_what_it_names() -> None:
    shape = ModelShape.load(LLAMA)
    par = Parallelism(tp=2, link_gbps=16.0, link_latency_s=20e-6)
    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b", shape, tp=2, parallel=par
    )
    engine = EngineSettings(tensor_parallel_size=2, gpu_memory_bytes=24 * GIB)
    s, p = _setup(prof.pricer, engine, shape)
    slow = vary(s, p["collective_cost"], 1.25)
    assert slow.pricer.parallel.link_gbps == pytest.approx(16.0 / 1.25)
    assert slow.pricer.parallel.link_latency_s == pytest.approx(20e-6 * 1.25)
    assert slow.pricer.time([], [1000] * 8) > s.pricer.time([], [1000] * 8)
    cpu = vary(s, p["cpu_overhead"], 1.0).overhead
    assert (cpu.per_iteration_s, cpu.per_sequence_s) == (CPU_PER_ITERATION_S, CPU_PER_SEQUENCE_S)
    gap = p["cuda_graph_saving_s"].high
    assert vary(s, p["cuda_graph_saving_s"], gap).overhead.per_iteration_s == -gap
    assert vary(s, p["kv_blocks"], 123).kv_blocks == 123
    # nothing else moves
    assert vary(s, p["kv_blocks"], 123).pricer is s.pricer
    with pytest.raises(ConfigError, match="cannot be varied"):
        vary(s, dataclasses.replace(p["kv_blocks"], name="nope"), 1.0)


def test_a_composed_moe_block_is_not_known() -> None:
    """The layers.csv layout sums an MoE block from expert operators timed apart: nothing
    measured the engine's fused MoE, so the parameter has no upper bound."""
    shape = ModelShape.load(A6000 / f"models/{PHI}.json")
    prof = build_profile(A6000 / f"profiles/{PHI}/tp1", shape)
    assert moe_composed(prof.tables)
    engine = EngineSettings(gpu_memory_bytes=40 * GIB)
    s, p = _setup(prof.pricer, engine, shape)
    moe = p["moe_block"]
    assert moe.source == "composed" and moe.low == 0.0 and math.isinf(moe.high)
    double = vary(s, moe, 2.0).pricer.tables.moe
    assert double is not None and s.pricer.tables.moe is not None
    assert np.allclose(double[:, 2], 2 * s.pricer.tables.moe[:, 2])
    # a measured block (moe.csv, the dense layout) is the profile's own measurement
    moe_shape = ModelShape.load(BUNDLED / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json")
    measured = build_profile(BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b", moe_shape)
    assert not moe_composed(measured.tables)
