"""`pdlab profile import` and the profile it writes used as `--profile` by `pdlab simulate`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cluster.data import BUNDLED
from cluster.hardware.profiles import load_profile
from toolkit.cli import app

P4090 = BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b"
P32 = BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_32b"
LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
QWEN32 = BUNDLED / "models/Qwen/Qwen3-32B.json"
runner = CliRunner()


def test_import_prints_paper_and_chosen_mape_and_writes_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "import", str(P4090), "--model-config", str(LLAMA), "-o", str(out)]
    res = runner.invoke(app, [*args, "--gpu-memory-gib", "23.5", "--max-num-seqs", "256", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["kv_bytes_per_token"] == 131_072 and 40_000 < info["kv_tokens"] < 43_000
    for phase in ("prefill", "decode", "mixed"):
        f = info["fits"][phase]
        assert f["chosen_mape"] <= f["paper_mape"] and len(f["coef"]) == len(f["terms"])
    assert info["fits"]["decode"]["chosen"] == "ctx"
    prof = load_profile(str(out))
    assert prof.pricer is not None and prof.max_decode_batch == 256
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "paper MAPE" in table.stdout and "ctx" in table.stdout
    sim = runner.invoke(
        app,
        ["simulate", "--workload", "cc", "--nodes", "2", "--split", "1P1D", "--agents", "4",
         "--duration", "60", "--warmup", "20", "--profile", str(out), "--json"],
    )  # fmt: skip
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout.strip().splitlines()[-1])["profile"] == "Llama-3.1-8B-tp1"


def test_tp_picks_the_bundle_measured_at_that_tp(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    res = runner.invoke(
        app,
        [
            "profile",
            "import",
            str(P32),
            "--model-config",
            str(QWEN32),
            "--tp",
            "2",
            "-o",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["notes"][0].startswith("used ") and info["notes"][0].endswith("(measured at TP 2)")
    assert info["kv_bytes_per_token"] == 131_072 and info["tp"] == 2


def test_input_errors_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text('{"hidden_size": 4096}')
    for args, expected in (
        ([str(P4090), "--model-config", str(bad)], "missing field 'num_attention_heads'"),
        ([str(tmp_path), "--model-config", str(LLAMA)], "dense.csv: file is missing"),
    ):
        res = runner.invoke(app, ["profile", "import", *args, "-o", str(tmp_path / "o.json")])
        assert res.exit_code == 2 and expected in res.stderr, res.output
