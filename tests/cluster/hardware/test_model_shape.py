"""Model shapes from real HF configs: parameters, weight bytes and KV bytes per token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hardware_fixtures import LLAMA, QWEN32, QWEN_MOE

from cluster.core import ConfigError
from cluster.hardware.model_shape import ModelShape


def test_parameter_counts_match_the_published_sizes() -> None:
    llama, q32, moe = (ModelShape.load(p) for p in (LLAMA, QWEN32, QWEN_MOE))
    assert llama.num_params == pytest.approx(8.03e9, rel=0.005)
    assert q32.num_params == pytest.approx(32.8e9, rel=0.005)
    assert moe.num_params == pytest.approx(30.5e9, rel=0.005)
    assert (moe.is_moe, moe.top_k, moe.num_experts, moe.num_moe_layers) == (True, 8, 128, 48)
    assert not llama.is_moe and llama.name == "Llama-3.1-8B"


def test_kv_bytes_per_token_and_weights_per_rank() -> None:
    llama, q32, moe = (ModelShape.load(p) for p in (LLAMA, QWEN32, QWEN_MOE))
    # 2 (K, V) x layers x KV heads x head dim x 2 bytes
    assert llama.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072
    assert q32.kv_bytes_per_token() == 262_144 and q32.kv_bytes_per_token(2) == 131_072
    assert q32.kv_bytes_per_token(16) == q32.kv_bytes_per_token(8)  # one head per rank at least
    assert moe.kv_bytes_per_token(kv_dtype_bytes=1) == 2 * 48 * 4 * 128
    assert llama.weight_bytes() == pytest.approx(2 * llama.num_params, rel=1e-6)
    assert q32.weight_bytes(2) == pytest.approx(q32.weight_bytes() / 2, rel=0.001)
    # EP 4 holds a quarter of the experts; attention stays whole at TP 1
    assert moe.weight_bytes(1, 4) < moe.weight_bytes() / 3
    assert ModelShape.from_json(moe.to_json()) == moe


def test_mla_cache_is_the_latent_and_replicated() -> None:
    cfg = {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
        "num_hidden_layers": 61, "intermediate_size": 18432, "vocab_size": 129280,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "num_key_value_heads": 128, "torch_dtype": "bfloat16",
    }  # fmt: skip
    s = ModelShape.from_hf_config(cfg)
    assert s.kv_bytes_per_token() == 61 * (512 + 64) * 2 == s.kv_bytes_per_token(8)
    assert s.num_moe_layers == 58 and s.num_params == pytest.approx(671e9, rel=0.02)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("hidden_size"), "missing field 'hidden_size'"),
        (
            lambda c: c.update(num_hidden_layers="32"),
            "field 'num_hidden_layers' must be a positive integer",
        ),
        (lambda c: c.update(torch_dtype="float7"), "field 'torch_dtype' 'float7'"),
        (
            lambda c: c.update(num_experts=8, num_experts_per_tok=9),
            "num_experts_per_tok' must be in 1..8",
        ),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads(LLAMA.read_text())
    edit(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, indent=2))
    with pytest.raises(ConfigError, match=message) as err:
        ModelShape.load(path)
    assert str(path) in str(err.value)


def test_unreadable_configs(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ConfigError, match=r"c.json: line 3: not valid JSON"):
        ModelShape.load(path)
    with pytest.raises(ConfigError, match="does not exist"):
        ModelShape.load(tmp_path / "none.json")
