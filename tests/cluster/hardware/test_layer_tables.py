"""The layers.csv + attention.csv profile layout (LLMServingSim's ispass26 artifact, RTX A6000)
read into the operator tables, priced, fitted and imported by `pdlab profile import`."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from cluster.hardware.layer_tables import load_layer_tables
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import ProfileError
from cluster.hardware.pricer import IterationPricer
from toolkit.cli import app

A6000 = BUNDLED / "lss_ispass26_a6000"
LLAMA = "meta-llama/Llama-3.1-8B"
PHI = "microsoft/Phi-mini-MoE-instruct"
runner = CliRunner()


def _shape(model: str) -> ModelShape:
    return ModelShape.load(A6000 / "models" / f"{model}.json")


def _rows(model: str, name: str) -> list[dict[str, str]]:
    with gzip.open(A6000 / "profiles" / model / "tp1" / f"{name}.csv.gz", "rt") as f:
        return list(csv.DictReader(f))


def _op(rows: list[dict[str, str]], op: str, tokens: int) -> float:
    return next(
        float(r["latency(ns)"]) * 1e-9
        for r in rows
        if r["layer_name"] == op and r["input"] == str(tokens)
    )


@pytest.fixture(scope="module")
def llama() -> IterationPricer:
    return IterationPricer(
        load_layer_tables(A6000 / "profiles" / LLAMA / "tp1", _shape(LLAMA)), _shape(LLAMA)
    )


def test_layer_ops_sum_per_layer_per_iteration_and_per_sequence(llama: IterationPricer) -> None:
    rows = _rows(LLAMA, "layers")
    per_layer = ("input_layernorm", "q_proj", "k_proj", "v_proj", "rope", "o_proj",
                 "post_layernorm", "gate_proj", "up_proj", "act_fn", "down_proj")  # fmt: skip
    t = llama.tables
    for n in (1, 100, 2048):
        assert t.dense_layer(n) == pytest.approx(sum(_op(rows, op, n) for op in per_layer))
        assert t.dense_iter(n) == pytest.approx(
            _op(rows, "embedding", n) + _op(rows, "final_layernorm", n)
        )
        assert t.per_seq(n) == pytest.approx(_op(rows, "lm_head", n))
    # one decode of one token: 32 layers, attention from attention.csv (not the `attn` row)
    c = llama.cost([], [32])
    assert c.dense == pytest.approx(32 * t.dense_layer(1) + t.dense_iter(1))
    att = [
        r
        for r in _rows(LLAMA, "attention")
        if r["is_prefill"] == "False" and r["batch_size"] == "1" and r["kv_cache_size"] == "32"
    ]
    mean = np.mean([float(r["time_stats.attn_decode.mean"]) for r in att]) * 1e-3
    assert c.attention == pytest.approx(32 * mean)


def test_a_mixed_call_is_its_prefill_call_plus_its_decode_call(llama: IterationPricer) -> None:
    a = llama.attention_time
    pre, dec = a([(512, 0)], []), a([], [640] * 16)
    floor = float(llama.tables.attention[:, 4].min())
    assert a([(512, 0)], [640] * 16) == pytest.approx(pre + dec - floor)
    # prefill rows keep the tokens cached before the chunk: kv_cache_size - chunk
    rows = llama.tables.attention
    assert rows[(rows[:, 0] == 32) & (rows[:, 2] == 0)][:, 1].min() == 0


def _decode_row(model: str, batch: int, kv: int) -> float:
    att = [
        float(r["time_stats.attn_decode.mean"]) * 1e-3
        for r in _rows(model, "attention")
        if r["is_prefill"] == "False" and r["batch_size"] == str(batch)
        and r["kv_cache_size"] == str(kv)
    ]  # fmt: skip
    return float(np.mean(att))


def _priced(model: str, fa_version: int) -> IterationPricer:
    shape = _shape(model)
    tables = replace(
        load_layer_tables(A6000 / "profiles" / model / "tp1", shape), fa_version=fa_version
    )
    return IterationPricer(tables, shape, memory_gbps=768.0)


def test_a_decode_row_holds_the_whole_batch_kv(llama: IterationPricer) -> None:
    """LLMServingSim's profiler splits kv_cache_size over the batch: 128 decodes at 2,048
    are 128 decodes of 16 keys, so that row prices 128 decodes of 16 tokens (no bandwidth:
    the measured kernel as is), not of 2,048."""
    assert llama.tables.attention_kind == "fa2-varlen"
    assert llama.attention_time([], [16] * 128) == pytest.approx(_decode_row(LLAMA, 128, 2048))
    assert llama.attention_time([], [2048]) == pytest.approx(_decode_row(LLAMA, 1, 2048))
    # 4 decodes of 512 each read what the row of 4 decodes over 2,048 measured
    assert llama.attention_time([], [512] * 4) == pytest.approx(_decode_row(LLAMA, 4, 2048))


def test_pure_decodes_read_their_kv_once_mixed_ones_once_per_query_head() -> None:
    """vLLM's FlashAttention 2 packs and splits only a pure-decode call; in a call with a
    prefill chunk every query head reads its KV head (group = 32 / 8 = 4 reads)."""
    p = _priced(LLAMA, 2)
    read = p.shape.kv_bytes_per_token() / p.shape.num_layers / 768e9  # s per KV token
    assert p.attention_time([], [2048] * 128) == pytest.approx(128 * 2048 * read)
    assert p.attention_time([], [32]) == pytest.approx(_decode_row(LLAMA, 1, 32))  # launch
    pre = p.attention_time([(200, 0)], [])
    floor = float(p.tables.attention[:, 4].min())
    mixed = p.attention_time([(200, 0)], [400] * 128)
    assert mixed == pytest.approx(pre + 4 * 128 * 400 * read - floor)
    # one recomputed prompt token (a PD decode instance's admission) keeps max_seqlen_q 1
    assert p.attention_time([(1, 399)], [400] * 127) < 1.2 * p.attention_time([], [400] * 128)
    # FlashAttention 3 (Hopper) packs grouped queries in mixed calls too
    assert _priced(LLAMA, 3).attention_time([(200, 0)], [400] * 128) == pytest.approx(
        pre + 128 * 400 * read - floor
    )


def test_a_sliding_window_model_reads_its_kv_once_per_query_head() -> None:
    """Phi-mini-MoE's 2,047-token window takes every call off the packed path on FA2."""
    p = _priced(PHI, 2)
    assert p.shape.sliding_window == 2047
    read = p.shape.kv_bytes_per_token() / p.shape.num_layers / 768e9
    assert p.attention_time([], [400] * 128) == pytest.approx(4 * 128 * 400 * read)
    unknown = _priced(PHI, 0)  # a GPU whose FlashAttention version is not known: no penalty
    assert unknown.attention_time([], [400] * 128) == pytest.approx(128 * 400 * read)


def test_moe_block_charges_the_touched_experts() -> None:
    shape = _shape(PHI)
    tables = load_layer_tables(A6000 / "profiles" / PHI / "tp1", shape)
    rows = _rows(PHI, "layers")
    moe = {(int(t), int(e)): s for t, e, s in tables.moe}
    expert = sum(_op(rows, f"expert.w{i}", 1) for i in (1, 2, 3))
    # one token goes to its top-2 experts: router + 2 experts of 1 token + one activation
    assert moe[(1, 2)] == pytest.approx(_op(rows, "gate", 1) + 2 * expert + _op(rows, "act_fn", 2))
    assert "gate_proj" not in tables.ops and tables.dense_layer(1) < _op(rows, "gate", 1) * 10
    p = IterationPricer(tables, shape)
    assert p.moe_time(1) == pytest.approx(moe[(1, 2)], rel=1e-6)
    assert p.moe_time(256) > 5 * p.moe_time(1)  # every expert touched, each reads its weights


def test_tp1_bundle_scales_to_tp2_with_whole_experts_split() -> None:
    shape = _shape(PHI)
    one = load_layer_tables(A6000 / "profiles" / PHI / "tp1", shape)
    two = load_layer_tables(A6000 / "profiles" / PHI / "tp1", shape, profiled_tp=1, tp=2)
    assert two.tp == 2
    gate = _op(_rows(PHI, "layers"), "gate", 64)
    m1 = {(int(t), int(e)): s for t, e, s in one.moe}
    m2 = {(int(t), int(e)): s for t, e, s in two.moe}
    assert m2[(64, 16)] - gate == pytest.approx((m1[(64, 16)] - gate) / 2)


def test_profile_import_detects_the_layout(tmp_path: Path) -> None:
    out = tmp_path / "phi.json"
    res = runner.invoke(app, ["profile", "import", str(A6000 / "profiles" / PHI / "tp1"),
                              "--model-config", str(A6000 / "models" / f"{PHI}.json"),
                              "-o", str(out), "--memory-gbps", "768", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert set(info["fits"]) == {"prefill", "decode"}  # no mixed calls measured
    assert any("no mixed fit" in n for n in info["notes"])
    assert info["fits"]["decode"]["chosen_mape"] < 0.05
    assert json.loads(out.read_text())["memory_gbps"] == 768.0
    bad = runner.invoke(app, ["profile", "import", str(A6000 / "profiles" / PHI / "tp1"),
                              "--model-config", str(A6000 / "models" / f"{LLAMA}.json"),
                              "-o", str(tmp_path / "x.json")])  # fmt: skip
    assert (
        bad.exit_code == 2
        and "expert rows but" in bad.output
        and len(bad.output.strip().splitlines()) == 1
    )
    dense = runner.invoke(app, ["profile", "import", str(A6000 / "profiles" / PHI / "tp1"), "--format", "dense",
                                "--model-config", str(A6000 / "models" / f"{PHI}.json"), "-o", str(tmp_path / "y.json")])  # fmt: skip
    assert dense.exit_code == 2 and "dense.csv" in dense.output


def test_a_malformed_layers_file_names_file_line_and_field(tmp_path: Path) -> None:
    d = tmp_path / "tp1"
    shutil.copytree(A6000 / "profiles" / LLAMA / "tp1", d)
    with gzip.open(d / "layers.csv.gz", "rt") as f:
        lines = f.read().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",fast"
    (d / "layers.csv.gz").unlink()
    (d / "layers.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match=r"layers.csv: line 6: field latency\(ns\) must be"):
        load_layer_tables(d, _shape(LLAMA))
    (d / "layers.csv").write_text("name,input\nq_proj,1\n")
    with pytest.raises(ProfileError, match="line 1: missing column"):
        load_layer_tables(d, _shape(LLAMA))
