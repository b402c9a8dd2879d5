"""`--profile fit.json`: a PD-split cluster's fit is the normal case; bad coefficients are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.hardware.profiles import PRESETS, load_profile
from cluster.sim.simulator import SimConfig, Simulator

PRE_A, PRE_B = [0.02, 6e-5, 3e-10, 2e-6], [0.04, 1e-4, 5e-10, 4e-6]
DEC_A, DEC_B = [0.010, 0.008, 1.5e-4], [0.020, 0.016, 3.0e-4]


def _fit(nodes: list[dict]) -> dict:
    return {"run_id": "r", "holdout": 0.2, "nodes": nodes}


def _phase(coef: list | None, samples: int = 100) -> dict:
    return {"coef": coef, "samples": samples, "mape": 0.02 if coef else None}


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_pd_split_fit_combines_the_phases_weighted_by_samples(tmp_path: Path) -> None:
    # Two prefill nodes (no decode fit) and two decode nodes (no prefill fit), as `pdlab fit`
    # reports a 2P2D run.
    doc = _fit(
        [
            {"node_id": 0, "prefill": _phase(PRE_A, 300), "decode": _phase(None, 0)},
            {"node_id": 1, "prefill": _phase(PRE_B, 100), "decode": _phase(None, 0)},
            {"node_id": 2, "prefill": _phase(None, 0), "decode": _phase(DEC_A, 100)},
            {"node_id": 3, "prefill": _phase(None, 0), "decode": _phase(DEC_B, 100)},
        ]
    )
    prof = load_profile(_write(tmp_path, doc))
    assert prof.prefill == pytest.approx(
        [0.75 * a + 0.25 * b for a, b in zip(PRE_A, PRE_B, strict=True)]
    )
    assert prof.decode == pytest.approx([(a + b) / 2 for a, b in zip(DEC_A, DEC_B, strict=True)])
    assert prof.name == "fit:fit.json" and prof.l1_tokens == PRESETS["gb300"].l1_tokens
    cfg = SimConfig(
        nodes=2,
        split="1P1D",
        agents=2,
        duration_s=30,
        warmup_s=0,
        profile=str(tmp_path / "fit.json"),
    )
    assert Simulator(cfg).profile.decode == prof.decode


@pytest.mark.parametrize(
    ("node", "words"),
    [
        (
            {"prefill": _phase([0.02, "fast", 0, 0])},
            r"nodes\[0\]\.prefill\.coef\[1\]: 'fast' is not a number",
        ),
        (
            {"prefill": _phase([0.02, 1e-5, 0])},
            r"nodes\[0\]\.prefill\.coef: .* is not 4 to 6 coefficients",
        ),
        (
            {"prefill": _phase([0.02, -1e-5, 0, 0])},
            r"nodes\[0\]\.prefill\.coef\[1\]: -1e-05 is negative",
        ),
        (
            {"decode": {"coef": [0.01, 0.01, 1e-4], "samples": "many"}},
            r"nodes\[0\]\.decode\.samples",
        ),
    ],
)
def test_bad_coefficients_are_named(tmp_path: Path, node: dict, words: str) -> None:
    base = {"node_id": 0, "prefill": _phase(PRE_A), "decode": _phase(DEC_A)}
    with pytest.raises(ConfigError, match=words):
        load_profile(_write(tmp_path, _fit([{**base, **node}])))


def test_a_fit_without_one_phase_says_which(tmp_path: Path) -> None:
    doc = _fit([{"node_id": 0, "prefill": _phase(PRE_A), "decode": _phase(None)}])
    with pytest.raises(ConfigError, match="no node has fitted decode coefficients"):
        load_profile(_write(tmp_path, doc))
    with pytest.raises(ConfigError, match="no 'nodes' list"):
        load_profile(_write(tmp_path, ["not", "a", "fit"]))
    with pytest.raises(ConfigError, match="unknown profile"):
        load_profile(str(tmp_path))  # a directory
