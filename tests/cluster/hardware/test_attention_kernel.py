"""Which FlashAttention path vLLM runs decodes on (cluster.hardware.attention_kernel), the
config's sliding window it depends on, and the tables' attention kind kept through JSON."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hardware_fixtures import LLAMA, QWEN32

from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.attention_kernel import (
    decode_kv_reads,
    flash_attention_version,
    gqa_group,
)
from cluster.hardware.layer_tables import load_layer_tables
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables

A6000 = BUNDLED / "lss_ispass26_a6000"
PHI = A6000 / "models" / "microsoft" / "Phi-mini-MoE-instruct.json"


@pytest.mark.parametrize(
    ("gpu", "version"),
    [("A6000", 2), ("RTX4090", 2), ("NVIDIA GeForce RTX 4090", 2), ("RTXPRO6000", 2),
     ("A100-80GB", 2), ("L40S", 2), ("H100", 3), ("H200", 3), ("NVIDIA H100 80GB HBM3", 3),
     ("B200", 0), ("TPU-v6e-1", 0), ("", 0)],
)  # fmt: skip
def test_the_flash_attention_version_follows_the_gpu(gpu: str, version: int) -> None:
    assert flash_attention_version(gpu) == version


def test_sliding_window_from_the_config() -> None:
    assert ModelShape.load(PHI).sliding_window == 2047
    assert ModelShape.load(LLAMA).sliding_window == 0
    # Qwen3 writes a window but switches it off (use_sliding_window: false), as vLLM reads it
    assert ModelShape.load(QWEN32).sliding_window == 0
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 100}  # fmt: skip
    assert ModelShape.from_hf_config({**base, "sliding_window": 4096}).sliding_window == 4096
    with pytest.raises(ConfigError, match="field 'sliding_window' must be an integer >= 0"):
        ModelShape.from_hf_config({**base, "sliding_window": -1})
    # shapes written before the field read back without a window
    doc = ModelShape.load(LLAMA).to_json()
    del doc["sliding_window"]
    assert ModelShape.from_json(doc).sliding_window == 0


def test_decode_kv_reads_per_kernel_path() -> None:
    llama, phi = ModelShape.load(LLAMA), ModelShape.load(PHI)
    assert gqa_group(llama) == 4 and gqa_group(llama, tp=8) == 4 and gqa_group(llama, 16) == 2
    assert decode_kv_reads(llama, 1, 2, mixed=False) == 1.0  # packed and split
    assert decode_kv_reads(llama, 1, 2, mixed=True) == 4.0  # a prefill chunk in the call
    assert decode_kv_reads(phi, 1, 2, mixed=False) == 4.0  # the window: never packed
    assert decode_kv_reads(phi, 1, 3, mixed=True) == 1.0  # FlashAttention 3 packs
    assert decode_kv_reads(llama, 1, 0, mixed=True) == 1.0  # unknown GPU: no penalty
    mha = replace(llama, num_kv_heads=llama.num_heads)
    assert decode_kv_reads(mha, 1, 2, mixed=True) == 1.0


def test_the_attention_kind_and_version_survive_json() -> None:
    shape = ModelShape.load(PHI)
    t = replace(load_layer_tables(A6000 / "profiles" / PHI.parent.name / PHI.stem / "tp1", shape),
                fa_version=2)  # fmt: skip
    back = OperatorTables.from_json(t.to_json())
    assert (back.attention_kind, back.fa_version) == ("fa2-varlen", 2)
    doc = t.to_json()
    del doc["attention_kind"], doc["fa_version"]  # a profile stored before the fields
    old = OperatorTables.from_json(doc)
    assert (old.attention_kind, old.fa_version) == ("fa2-varlen", 0)
