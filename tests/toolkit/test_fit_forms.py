"""`pdlab fit --form ... --ci ...` (toolkit.fit.forms) on logs whose truth has a context term."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from cluster.hardware.profiles import load_profile
from models.iteration import phi
from telemetry import TelemetryWriter
from telemetry.schema import ddl
from toolkit.cli import app
from toolkit.fit.forms import fit_run_forms, node_models
from toolkit.fit.run import FitInputError, fit_run, save_fits, to_json

runner = CliRunner()
TRUTH_D = (0.012, 0.015, 2.8e-4, 1e-9)  # d0, d1, d2, d3 (s per context token)
TRUTH_P = (0.03, 8e-5, 4e-10, 3e-7)
NODES = 4


def _write(db: Path, seed: int = 0, n: int = 6000) -> str:
    rng = np.random.default_rng(seed)
    dec, pre = [], []
    for node in range(NODES):
        t = np.sort(rng.uniform(0, 1800, n))
        b = rng.integers(1, 64, n)
        # each node's context mix has its own mean and drifts over the run
        per = (
            (15_000 + 12_000 * node) * (1 + 0.5 * np.sin(t / 300 + node)) * rng.uniform(0.5, 1.5, n)
        )
        ctx = (b * per).astype(np.int64)
        clean = (
            TRUTH_D[0]
            + TRUTH_D[1] * phi(b.astype(float), 8, 256, 2.0)
            + TRUTH_D[2] * b
            + TRUTH_D[3] * ctx
        )
        dec.append(
            {
                "node_id": np.full(n, node, np.int32),
                "iter_id": np.arange(n, dtype=np.int64),
                "t_start": t,
                "duration_s": clean * np.exp(rng.normal(0, 0.03, n) - 0.00045),
                "batch_size": b.astype(np.int32),
                "t_fwd": np.full(n, 2.0),
                "ctx_tokens": ctx,
            }
        )
        m = n // 4
        uc = rng.integers(256, 8192, m)
        tc = rng.integers(0, 60_000, m)
        a = uc * tc + uc * (uc + 1) / 2
        rst = rng.integers(0, 2000, m)
        clean_p = TRUTH_P[0] + TRUTH_P[1] * uc + TRUTH_P[2] * a + TRUTH_P[3] * rst
        pre.append(
            {
                "node_id": np.full(m, node, np.int32),
                "iter_id": np.arange(m, dtype=np.int64),
                "t_start": np.sort(rng.uniform(0, 1800, m)),
                "duration_s": clean_p * np.exp(rng.normal(0, 0.03, m)),
                "num_reqs": np.ones(m, np.int32),
                "t_uc": uc.astype(np.int64),
                "attn_pairs": a.astype(float),
                "t_rst": rst.astype(np.int64),
                "t_c": tc.astype(np.int64),
            }
        )
    with TelemetryWriter(db, f"ctx-{seed}", source="synth") as w:
        w.add_nodes(
            {
                "node_id": np.arange(NODES, dtype=np.int32),
                "name": [f"n{i}" for i in range(NODES)],
                "hardware": ["synthetic"] * NODES,
                "moe_top_k": np.full(NODES, 8, np.int32),
                "moe_experts": np.full(NODES, 256, np.int32),
            }
        )
        for table, parts in (("decode_iterations", dec), ("prefill_iterations", pre)):
            w.append(table, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
        return w.run_id


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("forms") / "ctx.duckdb"
    _write(path)
    return path


def test_auto_chooses_the_context_form_and_covers_the_truth(db: Path) -> None:
    fit = fit_run_forms(db, form="auto", bootstrap=200)
    covered = 0
    for node in fit.nodes:
        d = node.decode
        assert d.ok and d.form == "ctx" and d.terms == ("d0", "d1", "d2", "d3")
        assert dict(d.cv)["ctx"] < dict(d.cv)["paper"]
        assert d.ci is not None
        assert d.ci[2][0] <= TRUTH_D[2] <= d.ci[2][1], (node.node_id, d.ci)
        covered += sum(lo <= t <= hi for (lo, hi), t in zip(d.ci, TRUTH_D, strict=True))
        assert d.mape is not None and d.mape < 0.035
        p = node.prefill
        assert p.ok and p.form == "paper"  # the truth is Eq. 1: no extra term earns its place
        assert "chosen by 5-fold CV" in (p.message or "")
    assert covered >= 4 * NODES - 2  # 95% intervals: one or two of 16 may miss


def test_paper_form_with_row_buckets_gives_disjoint_intervals(db: Path) -> None:
    """What the misspecified Eq. 2 with iid-row intervals says about identical nodes."""
    rows = fit_run(db, bootstrap=200)
    d2 = [n.decode.ci[2] for n in rows.nodes if n.decode.ci]
    assert max(lo for lo, _ in d2) > min(hi for _, hi in d2)  # some pair does not overlap
    assert all(n.decode.coef[2] > TRUTH_D[2] for n in rows.nodes)  # d2 absorbs the context
    # Same data, time-window intervals: wider than the row ones.
    timed = fit_run_forms(db, form="paper", ci="time", bootstrap=200)
    for a, b in zip(rows.nodes, timed.nodes, strict=True):
        assert a.decode.coef == pytest.approx(b.decode.coef, rel=1e-9)
        wa = a.decode.ci[2][1] - a.decode.ci[2][0]
        wb = b.decode.ci[2][1] - b.decode.ci[2][0]
        assert wb > wa


def test_chosen_forms_are_stored_and_load_as_a_profile(db: Path, tmp_path: Path) -> None:
    fit = fit_run_forms(db, form="auto", bootstrap=0)
    models = node_models(fit, {n: (8, 256) for n in range(NODES)}, t_fwd=2.0)
    assert sorted(models) == list(range(NODES))
    assert all(m.decode.d3 == pytest.approx(TRUTH_D[3], rel=0.15) for m in models.values())
    assert save_fits(db, fit) == 2 * NODES
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT phase, form, len(coef) FROM model_fits ORDER BY node_id, phase"
    ).fetchall()
    con.close()
    assert set(rows) == {("decode", "ctx", 4), ("prefill", "paper", 4)}
    doc = to_json(fit)
    assert doc["nodes"][0]["decode"]["form"] == "ctx"
    assert doc["nodes"][0]["decode"]["cv_rmse"]["ctx"] > 0
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(doc))
    prof = load_profile(str(path))
    assert prof.decode_form == "ctx"
    assert prof.decode_ctx_s_per_token == pytest.approx(TRUTH_D[3], rel=0.1)
    assert prof.node_model().decode.d3 == prof.decode_ctx_s_per_token


def test_cli_reports_the_form_and_rejects_unknown_ones(db: Path) -> None:
    res = runner.invoke(app, ["fit", str(db), "--form", "auto", "--no-write"])
    assert res.exit_code == 0, res.output
    assert "decode (ctx)" in res.stdout and "not fitted" not in res.stdout
    res = runner.invoke(app, ["fit", str(db), "--form", "auto", "--no-write", "--wide"])
    assert res.exit_code == 0, res.output
    assert "d3 = " in res.stdout
    res = runner.invoke(
        app, ["fit", str(db), "--form", "auto", "--json", "--no-write", "--bootstrap", "0"]
    )
    out = json.loads(res.stdout)
    assert {n["decode"]["form"] for n in out["nodes"]} == {"ctx"}
    # a form of one phase leaves the other phase on its paper form
    res = runner.invoke(
        app, ["fit", str(db), "--form", "ctx", "--json", "--no-write", "--bootstrap", "0"]
    )
    out = json.loads(res.stdout)
    assert {(n["prefill"]["form"], n["decode"]["form"]) for n in out["nodes"]} == {("paper", "ctx")}
    for args, expected in (
        (["--form", "bogus"], "unknown form 'bogus'"),
        (["--ci", "nope"], "--ci must be 'time' or 'rows'"),
    ):
        res = runner.invoke(app, ["fit", str(db), *args])
        assert res.exit_code == 2 and expected in res.stderr


def test_too_few_rows_and_missing_moe_shape_are_messages(tmp_path: Path) -> None:
    """An external engine's log: decode iterations only, no nodes rows."""
    path = tmp_path / "few.duckdb"
    con = duckdb.connect(str(path))
    con.execute(ddl("decode_iterations"))
    con.execute(
        "INSERT INTO decode_iterations (run_id, node_id, iter_id, t_start, duration_s, batch_size, "
        "t_fwd, ctx_tokens) SELECT 'few', 0, i, i, 0.02, 4, 1.0, 100 FROM range(5) t(i)"
    )
    con.close()
    fit = fit_run_forms(path, form="auto")
    (node,) = fit.nodes
    assert not node.decode.ok and "moe_top_k / moe_experts" in (node.decode.message or "")
    assert not node.prefill.ok and "no prefill iterations" in (node.prefill.message or "")
    with pytest.raises(FitInputError, match="ci must be"):
        fit_run_forms(path, ci="hours")  # type: ignore[arg-type]
