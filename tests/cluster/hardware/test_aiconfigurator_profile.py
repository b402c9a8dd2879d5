"""Profiles composed from AIConfigurator's kernel tables (`pdlab profile import --aiconfigurator`).

On the committed h200_sxm/vllm slice (tests/fixtures/aiconfigurator, Apache-2.0): the
composed tables price what the kernels measured, the MoE rows come back exactly through the
pricer's key, the profile works as `--profile`, and models pdlab cannot compose say why.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.hardware.aiconfigurator_db import KernelDatabase
from cluster.hardware.aiconfigurator_profile import (
    AicTarget,
    build_aic_profile,
    compose_tables,
    engine_settings,
    unsupported_reason,
)
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profiles import load_profile
from toolkit.cli import app

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "aiconfigurator"
SYSTEMS, CONFIGS = FIX / "systems", FIX / "model_configs"
LLAMA = CONFIGS / "meta-llama--Meta-Llama-3.1-8B_config.json"
QWEN = CONFIGS / "Qwen--Qwen3-235B-A22B-FP8_config.json"


def shape(path: Path) -> ModelShape:
    return ModelShape.from_hf_config(json.loads(path.read_text()), path.stem)


@pytest.fixture(scope="module")
def db() -> KernelDatabase:
    return KernelDatabase("h200_sxm", "vllm", None, SYSTEMS)


def test_llama_profile_prices_like_its_kernels(db: KernelDatabase) -> None:
    s = shape(LLAMA)
    t = AicTarget("h200_sxm", "vllm", quant="fp8", tp=1, kv_dtype="fp8")
    p = build_aic_profile(db, s, t, fit=False)
    pr = p.pricer
    # decode: one token's GEMMs read the weights (~8 GB fp8 at 4.8 TB/s: > 1.7 ms)
    one = pr.decode_time(1, 1024)
    assert 1.7e-3 < one < 6e-3
    assert pr.decode_time(64, 1024) > pr.decode_time(8, 1024) > one
    assert pr.decode_time(64, 8192) > pr.decode_time(64, 1024)
    assert pr.prefill_time(8192) > 4 * pr.prefill_time(1024) > 0
    # the attention grid is the chunk's context attention plus the decodes' generation attention
    ctx = db.context_attention(32, 8, 128, "fp8")
    gen = db.generation_attention(32, 8, 128, "fp8")
    got = pr.attention_time([(1024, 0)], [4096] * 64)
    assert got == pytest.approx(
        float(ctx(1, np.array([1024.0]))[0] + gen(64, np.array([4096.0]))[0]), rel=1e-6
    )
    # engine defaults and KV capacity from the 141 GB H200: tens of thousands of blocks
    assert p.engine.max_num_batched_tokens == 8192 and p.engine.max_num_seqs == 1024
    assert 500_000 < p.kv_tokens < 2_000_000
    # the profile names every table it used and the assumptions it made
    used = json.loads(p.source.removeprefix("aiconfigurator:"))
    assert {u["table"].split("/")[2] for u in used} >= {"gemm", "attention"}
    assert any("CUDA graphs" in n for n in p.notes) and any("vLLM V1" in n for n in p.notes)


def test_tensor_parallel_splits_the_gemms_and_adds_the_all_reduces(db: KernelDatabase) -> None:
    s = shape(LLAMA)
    t1, _ = compose_tables(db, s, AicTarget("h200_sxm", "vllm", quant="fp8", tp=1))
    t2, _ = compose_tables(db, s, AicTarget("h200_sxm", "vllm", quant="fp8", tp=2))
    big = 8192.0
    ar = db.allreduce(2)
    reduces = 2 * ar(big * s.hidden_size)  # after o_proj and after the MLP, N x hidden each
    assert 0 < reduces < t2.dense_layer(big)
    # without them a TP 2 layer is about half a TP 1 layer: half the weights and FLOPs
    assert 0.4 < (t2.dense_layer(big) - reduces) / t1.dense_layer(big) < 0.65


def test_moe_rows_come_back_through_the_pricers_key(db: KernelDatabase) -> None:
    s = shape(QWEN)
    t = AicTarget("h200_sxm", "vllm", quant="fp8", tp=2, moe_ep=2, kv_dtype="fp8")
    tables, _ = compose_tables(db, s, t)
    p = build_aic_profile(db, s, t, fit=False)
    table = db.moe(s.hidden_size, s.moe_intermediate_size, s.top_k, s.num_experts, 1, 2,
                   ("fp8", "fp8_block"), "power_law_1.01")  # fmt: skip
    for tokens in (1.0, 16.0, 256.0, 4096.0):
        assert p.pricer.moe_time(tokens) == pytest.approx(float(table(tokens)), rel=1e-9)
    assert tables.moe is not None and tables.moe_kind == "per-ep-rank"
    assert any(n.startswith("phi(B) on the MoE table: skew") for n in p.notes)
    assert any("priced as the table says (per EP rank)" in n for n in p.notes)
    # the table already holds the EP rank's routing load and exchange: nothing added on top
    assert p.pricer.expert_exchange_time(4096.0) == 0.0
    skewed = IterationPricer(tables, s, replace(p.parallel, expert_load_skew=1.5))
    assert skewed.moe_time(256.0) == p.pricer.moe_time(256.0)


def test_the_per_rank_moe_table_survives_the_profile_document(db: KernelDatabase) -> None:
    s = shape(QWEN)
    t = AicTarget("h200_sxm", "vllm", quant="fp8", tp=2, moe_ep=2, kv_dtype="fp8")
    p = build_aic_profile(db, s, t, fit=False)
    doc = p.to_json()
    assert doc["tables"]["moe_kind"] == "per-ep-rank"
    back = OperatorTables.from_json(doc["tables"])
    assert back.moe_kind == "per-ep-rank"
    # documents written before the field: AIConfigurator's are per EP rank, moe.csv's not
    old = {k: v for k, v in doc["tables"].items() if k != "moe_kind"}
    assert OperatorTables.from_json(old).moe_kind == "per-ep-rank"
    assert OperatorTables.from_json({**old, "ops": ["qkv_proj"]}).moe_kind == "one-gpu"
    loaded = OperatorProfile.from_json(json.loads(json.dumps(doc)))
    assert loaded.pricer.moe_time(256.0) == pytest.approx(p.pricer.moe_time(256.0), rel=1e-9)
    with pytest.raises(ConfigError, match="moe_kind 'x' is not one of one-gpu, per-ep-rank"):
        OperatorTables.from_json({**doc["tables"], "moe_kind": "x"})


def test_attention_dp_prices_the_groups_tokens_and_its_dispatch(db: KernelDatabase) -> None:
    s = shape(QWEN)
    t = AicTarget("h200_sxm", "vllm", quant="fp8", tp=2, dp=2, moe_tp=1, moe_ep=4, kv_dtype="fp8")
    p = build_aic_profile(db, s, t, fit=False)
    table = db.moe(s.hidden_size, s.moe_intermediate_size, s.top_k, s.num_experts, 1, 4,
                   ("fp8", "fp8_block"), "power_law_1.01")  # fmt: skip
    ar = db.allreduce(4)  # the dispatch and combine span the 4 GPUs of the EP group
    got = p.pricer.moe_time(128.0)  # 128 tokens on each of the 2 DP ranks
    assert got == pytest.approx(float(table(256.0)) + float(ar(256.0 * s.hidden_size)), rel=1e-6)


def test_weights_that_do_not_fit_leave_no_kv_room() -> None:
    s = shape(QWEN)
    with pytest.raises(ConfigError, match="leaves no KV room"):
        engine_settings(
            s, AicTarget("h200_sxm", "vllm", quant="bf16", tp=1, moe_ep=1), 151_397_597_184
        )


def test_models_pdlab_cannot_compose_say_why() -> None:
    cfg = lambda name: json.loads((CONFIGS / f"{name}_config.json").read_text())  # noqa: E731
    assert "MLA" in unsupported_reason(cfg("deepseek-ai--DeepSeek-R1"))
    assert "sliding_attention" in unsupported_reason(cfg("openai--gpt-oss-120b"))
    assert "linear_attention" in unsupported_reason(cfg("Qwen--Qwen3.5-397B-A17B"))
    assert unsupported_reason(cfg("meta-llama--Meta-Llama-3.1-8B")) is None
    assert unsupported_reason(cfg("Qwen--Qwen3-235B-A22B-FP8")) is None


def test_the_cli_writes_a_profile_that_works_as_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "import", "--aiconfigurator", "--aic-systems", str(SYSTEMS), "--system",
            "h200_sxm", "--backend", "vllm", "--model-config", str(LLAMA), "--quant", "fp8",
            "--tp", "2", "-o", str(out), "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["tp"] == 2 and set(info["fits"]) == {"prefill", "decode", "mixed"}
    assert all(f["chosen_mape"] < 0.25 for f in info["fits"].values())
    assert any(u["table"].endswith("gemm_perf.parquet") for u in info["tables"])
    prof = load_profile(str(out))
    assert prof.pricer is not None and prof.pricer.decode_time(8, 2048) > 0
    bad = CliRunner().invoke(app, [*args[:10], str(CONFIGS / "deepseek-ai--DeepSeek-R1_config.json"),
                                   "-o", str(tmp_path / "x.json")])  # fmt: skip
    assert bad.exit_code == 2 and "MLA attention" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "x.json").exists()


def test_phi_is_fitted_per_load_shape_before_and_after_the_skew(db: KernelDatabase) -> None:
    from cluster.hardware.aiconfigurator_moe import moe_phi_report

    rep = moe_phi_report(db)
    shapes = rep["load_shapes"]
    assert set(shapes) == {"balanced", "power_law_1.01", "power_law_1.2"}
    for v in shapes.values():
        assert v["curves"] >= 2 and 0 < v["mape_skewed_phi"] <= v["mape_uniform_phi"] < 0.5
        assert 0.0 <= v["skew_quartiles"][0] <= v["skew_median"] <= v["skew_quartiles"][1]
