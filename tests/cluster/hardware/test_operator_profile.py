"""pdlab profiles from operator profiles (cluster.hardware.operator_profile) and --profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hardware_fixtures import LLAMA, P32, P4090, PMOE, QWEN32, QWEN_MOE

from cluster.core import ConfigError
from cluster.data import BUNDLED
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile, build_profile
from cluster.hardware.profiles import load_profile
from models import RequestWork


@pytest.fixture(scope="module")
def p4090() -> OperatorProfile:
    engine = EngineSettings(max_num_seqs=256, max_num_batched_tokens=2048, num_gpu_blocks=2588)
    return build_profile(P4090, ModelShape.load(LLAMA), engine=engine, hardware="RTX 4090")


def test_forms_chosen_on_a_real_gpu_beat_the_paper_forms(p4090: OperatorProfile) -> None:
    pre, dec = p4090.fits["prefill"], p4090.fits["decode"]
    assert pre.chosen != "paper" and pre.best.mape < pre.paper.mape
    assert dec.chosen == "ctx" and dec.best.mape < 0.03 < 0.15 < dec.paper.mape
    # The context term is the KV read: 128 KiB per token at the 4090's ~1 TB/s
    d3 = dec.best.coef[3]
    assert 100e-9 < d3 < 200e-9
    assert dec.best.ci is not None and dec.best.ci[3][0] <= d3 <= dec.best.ci[3][1]
    assert "mixed" in p4090.fits and p4090.fits["mixed"].best.mape < p4090.fits["mixed"].paper.mape


def test_the_document_round_trips_and_loads_as_a_simulator_profile(
    p4090: OperatorProfile, tmp_path: Path
) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(p4090.to_json()))
    again = OperatorProfile.from_json(json.loads(path.read_text()))
    batch = ([(512, 1000)], [700] * 30)
    assert again.pricer.time(*batch) == p4090.pricer.time(*batch)
    doc = json.loads(path.read_text())
    assert doc["kv_bytes_per_token"] == 131_072 and doc["weight_bytes"] == pytest.approx(
        16.06e9, rel=0.001
    )
    prof = load_profile(str(path))
    assert prof.pricer is not None and prof.pricer.time(*batch) == p4090.pricer.time(*batch)
    assert prof.l1_tokens == 41_408 and prof.chunk_tokens == 2048 and prof.max_decode_batch == 256
    assert (
        prof.decode_form == "ctx"
        and prof.decode_ctx_s_per_token == p4090.fits["decode"].best.coef[3]
    )
    assert prof.num_experts == 0 and prof.noise == 0.0 and prof.hardware == "RTX 4090"
    model = prof.node_model()
    assert model.decode.d3 > 0 and model.prefill.knee_tokens == prof.prefill_knee_tokens
    # the control plane's model agrees with the pricer on a pure decode batch
    pricer_s = prof.pricer.decode_time(32, 1000)
    model_s = model.decode.iteration_time(32, ctx_tokens=32 * 1000)
    assert model_s == pytest.approx(pricer_s, rel=0.1)
    assert model.prefill_request_time(RequestWork(2048)) > 0
    # and so does the simulator's ground truth (prefill floor / roofline terms included)
    assert prof.prefill_time(2048, 2048 * 2049 / 2, 0) == pytest.approx(
        prof.pricer.prefill_time(2048), rel=0.1
    )


def test_moe_profile_prices_experts_and_chooses_the_roofline() -> None:
    p = build_profile(PMOE, ModelShape.load(QWEN_MOE))
    pre = p.fits["prefill"]
    assert pre.chosen.startswith("roofline") and pre.best.mape < pre.paper.mape / 2
    assert p.fits["decode"].chosen == "ctx"
    prof = load_profile_doc(p)
    assert (prof.top_k, prof.num_experts) == (8, 128)
    assert prof.node_model().prefill.c5 > 0  # the experts a chunk touches


def load_profile_doc(p: OperatorProfile):  # type: ignore[no-untyped-def]
    from cluster.hardware.profiles import from_operator_profile

    return from_operator_profile(p)


def test_tp_folders_and_scaling() -> None:
    q = ModelShape.load(QWEN32)
    measured = build_profile(P32 / "tp2", q, tp=2)  # measured at TP 2 (from the folder name)
    scaled = build_profile(P32, q, tp=2)  # TP 1 scaled
    assert "measured at TP 2" in measured.notes[0] and "scaled to TP 2" in scaled.notes[0]
    assert any("communication assumed" in n for n in measured.notes)
    assert measured.to_json()["kv_bytes_per_token"] == 131_072
    assert "mixed" in measured.fits  # the full grid has mixed (prefill + decode) points
    a = measured.pricer.decode_time(64, 2048)
    b = scaled.pricer.decode_time(64, 2048)
    assert b == pytest.approx(a, rel=0.08)


def test_kv_capacity_from_gpu_memory_and_errors(tmp_path: Path) -> None:
    q = ModelShape.load(QWEN32)
    engine = EngineSettings(
        tensor_parallel_size=2, gpu_memory_bytes=int(96 * GIB), gpu_memory_utilization=0.9
    )
    p = build_profile(P32 / "tp2", q, tp=2, engine=engine)
    assert p.kv_tokens == engine.kv_capacity(q).tokens > 300_000
    with pytest.raises(ConfigError, match="not a pdlab-operator-profile"):
        OperatorProfile.from_json({"format": "x"})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "pdlab-operator-profile", "name": "x"}))
    with pytest.raises(ConfigError, match="malformed pdlab-operator-profile"):
        load_profile(str(bad))


def test_every_profile_chooses_forms_that_beat_the_paper() -> None:
    """The full profiles (the copies bundled with pdlab, the same as the shared data's)."""
    data = BUNDLED
    cases = [
        ("llmservingsim_rtx4090_llama31_8b", "meta-llama/Llama-3.1-8B", 1),
        ("llmservingsim_rtxpro6000_qwen3_32b", "Qwen/Qwen3-32B", 1),
        ("llmservingsim_rtxpro6000_qwen3_32b/tp2", "Qwen/Qwen3-32B", 2),
        ("llmservingsim_rtxpro6000_qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B-Instruct-2507", 1),
    ]
    for prof, model, tp in cases:
        p = build_profile(
            data / "profiles" / prof, ModelShape.load(data / f"models/{model}.json"), tp=tp
        )
        for phase in ("prefill", "decode", "mixed"):
            f = p.fits[phase]
            assert f.best.mape <= f.paper.mape, (prof, phase)
        if "mixed" in p.fits:
            assert p.fits["mixed"].best.mape <= p.fits["mixed"].paper.mape, prof
        assert p.fits["decode"].best.mape < 0.06, prof
