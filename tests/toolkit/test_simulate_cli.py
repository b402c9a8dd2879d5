"""`pdlab simulate` as a first-time user meets it: a bad option fails before the progress bar,
a short run needs no warmup option, and the end of the output says where the telemetry went
and what to run next."""

from __future__ import annotations

import json
import re

import duckdb
import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from toolkit.cli import app

TINY = [
    "simulate", "--workload", "putnam", "--nodes", "2", "--split", "1P1D", "--agents", "4",
    "--planner", "static", "--profile", "h200", "--telemetry", "compact",
]  # fmt: skip


def test_bad_options_fail_before_the_progress_bar():
    for args, message in (
        (["--nodes", "0"], "--nodes must be >= 2"),
        (["--profile", "no-such-gpu"], "no-such-gpu"),
        (["--retention", "nope"], "unknown retention policy 'nope'"),
        (["--duration", "100", "--warmup", "200"], "need 0 <= --warmup < --duration"),
    ):
        res = CliRunner().invoke(app, [*TINY, *args])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output
        assert "simulating" not in res.output and "sim-s" not in res.output


def test_a_short_run_needs_no_warmup_option():
    res = CliRunner().invoke(app, [*TINY, "--duration", "60", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["sim_seconds"] == 60.0 and summary["requests"] > 0


def test_the_main_job_says_where_its_db_went_and_what_to_run_next(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        app, [*TINY, "--duration", "120", "--db", "pdlab.duckdb", "--fit"], terminal_width=200
    )
    assert res.exit_code == 0, res.output
    with duckdb.connect("pdlab.duckdb", read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    tail = res.stdout[res.stdout.index("iteration-time fits") :]  # after the summary and fits
    assert f"telemetry of run {run_id} in {tmp_path / 'pdlab.duckdb'}" in tail
    assert f"pdlab report pdlab.duckdb --run {run_id} -o report.html" in tail
    assert f"pdlab fit pdlab.duckdb --run {run_id}" in tail
    assert re.search(
        r"pdlab lab --db pdlab.duckdb +# JupyterLab: notebooks 01/02 open this run", tail
    )
    res = CliRunner().invoke(app, [*TINY, "--duration", "60"])
    assert res.exit_code == 0 and "telemetry not stored: add --db FILE" in res.stdout


def test_a_timestamped_trace_replays_once_and_says_so(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 400 * i, "input_length": 700 + i, "output_length": 12}) + "\n"
            for i in range(20)
        )
    )
    args = ["simulate", "--workload", str(trace), "--nodes", "2", "--split", "1P1D",
            "--planner", "static", "--profile", "h200", "--telemetry", "compact"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["trace_requests"], s["trace_requests_served"], s["programs_finished"]) == (20, 20, 20)
    assert s["trace_replay"] == "arrivals" and s["trace_cycled"] is False
    assert s["trace_finished"] is True and s["sim_seconds"] < 3600.0 and s["requests"] > 0
    res = CliRunner().invoke(app, [*args, "--agents", "8"], terminal_width=300)
    assert res.exit_code == 0, res.output
    assert "trace: 20 of 20 requests served, each once at its arrival time" in res.stdout
    assert "the run ended when the last finished" in res.stdout
    assert "--agents does not apply" in res.stdout
    res = CliRunner().invoke(
        app, [*args, "--cycle", "--agents", "8", "--duration", "60"], terminal_width=300
    )
    assert res.exit_code == 0, res.output
    assert "from a 20-request trace by a closed loop of agents, cycling the trace" in res.stdout


def test_prefill_forms_flag_prices_routing_with_the_fitted_form(tmp_path):
    """`--prefill-forms` (SimConfig.prefill_forms): the router predicts a node's prefill
    with the profile's chosen form (here roofline@128: a floor of 128 tokens and a KV read
    per cached token) instead of Eq. 3, so a request with a cached prefix is predicted
    slower; the run's config records the setting."""
    from cluster.hardware.model_shape import ModelShape
    from cluster.hardware.operator_profile import build_profile

    prof = build_profile(
        BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b",
        ModelShape.load(BUNDLED / "models/meta-llama/Llama-3.1-8B.json"),
    )
    assert prof.fits["prefill"].best.form != "paper"
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(prof.to_json()))
    args = [*TINY, "--profile", str(path), "--duration", "30", "--telemetry", "full"]
    pred: dict[bool, dict[tuple[float, str, int], float]] = {}
    for forms in (False, True):
        db = tmp_path / f"forms-{forms}.duckdb"
        flag = ["--prefill-forms"] if forms else []
        res = CliRunner().invoke(app, [*args, *flag, "--db", str(db), "--json"])
        assert res.exit_code == 0, res.output
        with duckdb.connect(str(db), read_only=True) as con:
            (config,) = con.execute("SELECT config FROM runs").fetchone()
            rows = con.execute(
                "SELECT t, request_id, cached_tokens, predicted_ttft_s FROM router_decisions"
            ).fetchall()
        assert json.loads(config)["prefill_forms"] is forms
        pred[forms] = {(t, r, c): p for t, r, c, p in rows}
    # the same routing decisions (same request, time and cached prefix) in both runs: with
    # a cached prefix the form adds its KV read (c4); without one both give Eq. 3's time
    same = pred[False].keys() & pred[True].keys()
    cached = [k for k in same if k[2] > 0]
    assert len(cached) >= 3
    for k in same:
        if k[2] > 0:
            assert pred[True][k] > pred[False][k] + 1e-4, k
        else:
            assert pred[True][k] == pytest.approx(pred[False][k], rel=1e-9), k
