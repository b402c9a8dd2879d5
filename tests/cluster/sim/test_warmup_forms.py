"""`pdlab simulate --form`: the warmup chooses each node's iteration-time form by evidence
(cluster/sim/warmup.py over models.forms.select_form), and the planner and router price with it.

The simulator's ground truth (HardwareProfile) has a decode context term that Eq. 2 omits
(`decode_ctx_s_per_token`) and, for imported profiles, a prefill KV-read term: a form is chosen
only when the held-out error says its extra terms pay.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from cluster.core import ConfigError
from cluster.hardware.profiles import PRESETS
from cluster.sim.simulator import SimConfig, Simulator
from models import RequestWork
from toolkit.cli import app

GB300 = PRESETS["gb300"]


def _run(profile, form: str) -> Simulator:  # type: ignore[no-untyped-def]
    cfg = SimConfig(workload="cc", nodes=4, split="2P2D", agents=24, duration_s=420.0,
                    warmup_s=300.0, profile=profile, fit_form=form, seed=3)  # fmt: skip
    sim = Simulator(cfg)
    sim.run()
    return sim


def test_a_decode_context_term_is_found_on_every_node_and_priced_by_the_planner() -> None:
    truth = 2.0e-8  # s per context token per iteration: 20x the preset's
    sim = _run(dataclasses.replace(GB300, decode_ctx_s_per_token=truth, noise=0.01), "auto")
    forms = sim.fit.forms()
    assert {forms[f"{n}.decode"] for n in range(4)} == {"ctx"}, forms
    for n in range(4):
        d = sim.cp.models()[n].decode
        assert d.d3 == pytest.approx(truth, rel=0.1), (n, d)
        # the planner's decode occupancy (Eq. 4) now grows with the context
        m = sim.cp.models()[n]
        short, long_ = RequestWork(1000, 0, 100), RequestWork(100_000, 0, 100)
        assert m.decode_request_time(long_, 32) > 1.5 * m.decode_request_time(short, 32)
    # the router prices prefill with the fitted forms (ControlPlaneConfig.prefill_forms)
    assert sim.cp.form_priced_nodes() == set(range(4))
    assert sim.record().forms == forms


def test_without_a_context_term_eq_2_is_kept() -> None:
    sim = _run(dataclasses.replace(GB300, decode_ctx_s_per_token=0.0, noise=0.03), "auto")
    forms = sim.fit.forms()
    # ctx fits as well as Eq. 2 here (d3 ~ 0), so the simpler form is kept on every node
    assert {forms[f"{n}.decode"] for n in range(4)} == {"paper"}, forms
    assert all(m.decode.d3 == 0.0 for m in sim.cp.models().values())
    assert sim.fit.report["0.decode"]["cv_rmse"]["ctx"] > 0.02  # the noise, not zero


def test_the_paper_form_changes_nothing_and_names_no_forms() -> None:
    sim = _run(GB300, "paper")
    assert sim.record().forms is None
    assert "warmup_forms" not in sim.finish()
    assert not sim.cp.form_priced_nodes()
    assert all(m.decode.d3 == 0.0 for m in sim.cp.models().values())


def test_a_form_of_one_phase_keeps_eq_1_for_the_other() -> None:
    sim = _run(dataclasses.replace(GB300, decode_ctx_s_per_token=2.0e-8), "ctx")
    forms = sim.fit.forms()
    assert all(forms[f"{n}.prefill"] == "paper" for n in range(4)), forms
    assert all(forms[f"{n}.decode"] == "ctx" for n in range(4)), forms


def test_an_unknown_form_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="--form must be one of paper, auto, floor"):
        SimConfig(workload="cc", nodes=2, split="1P1D", agents=4, fit_form="cubic").validate()
    out = CliRunner().invoke(
        app, ["simulate", "--nodes", "2", "--split", "1P1D", "--agents", "4", "--form", "cubic"]
    )
    assert out.exit_code == 2
    assert "--form must be one of" in out.output and "cubic" in out.output


def test_simulate_form_auto_reports_the_chosen_forms() -> None:
    out = CliRunner().invoke(
        app,
        ["simulate", "--workload", "cc", "--nodes", "2", "--split", "1P1D", "--agents", "8",
         "--duration", "240", "--warmup", "180", "--form", "auto", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output.strip().splitlines()[-1])
    assert set(summary["warmup_forms"]) == {"0.prefill", "0.decode", "1.prefill", "1.decode"}
    assert set(summary["warmup_forms"].values()) <= {
        "paper",
        "ctx",
        "floor@32",
        "floor@64",
        "floor@128",
        "floor@256",
        "floor@512",
        "floor@1024",
    } | {f"roofline@{k}" for k in ("32", "64", "128", "256", "512", "1024")} | {"roofline"}
