"""Iteration-time fit figures and phi(B): the drawn numbers are the fitted models' numbers."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from models.iteration import DecodeModel, PrefillModel, phi
from toolkit.fit.run import fit_run
from toolkit.plots import decode_fit, phi_curve, prefill_fit


@pytest.fixture(scope="module")
def fit(sim_run):
    return fit_run(sim_run.db, sim_run.run_id, bootstrap=0)


def _table(db, sql: str) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).pl()


def _node(trace) -> int:
    return int(trace.legendgroup.removeprefix("node"))


def test_prefill_points_are_the_model_predictions_of_logged_iterations(sim_run, fit):
    fig = prefill_fit(sim_run.db, sim_run.run_id, fit=fit, sample=150)
    coef = {n.node_id: n.prefill.coef for n in fit.nodes if n.prefill.ok}
    logged = _table(
        sim_run.db,
        "SELECT node_id, iter_id, duration_s FROM prefill_iterations "
        f"WHERE run_id = '{sim_run.run_id}'",
    )
    scatter = [t for t in fig.data if t.type == "scattergl"]
    assert {_node(t) for t in scatter} == set(coef)
    for tr in scatter:
        node = _node(tr)
        cd = np.asarray(tr.customdata)
        assert 0 < len(cd) <= 150
        predicted = PrefillModel.from_coef(coef[node]).predict(cd[:, :3])
        np.testing.assert_allclose(np.asarray(tr.x), 1e3 * predicted, rtol=1e-9)
        want = (
            logged.filter(pl.col("node_id") == node)
            .join(pl.DataFrame({"iter_id": cd[:, 4].astype(np.int64)}), on="iter_id", how="semi")
            .sort("iter_id")
        )
        got = np.asarray(tr.y)[np.argsort(cd[:, 4])]
        np.testing.assert_allclose(got, 1e3 * want["duration_s"].to_numpy(), rtol=1e-12)
        assert (
            f"MAPE {100 * next(n.prefill.mape for n in fit.nodes if n.node_id == node):.1f}%"
            in tr.name
        )


def test_sampling_is_deterministic(sim_run, fit):
    a = prefill_fit(sim_run.db, sim_run.run_id, fit=fit, sample=100)
    b = prefill_fit(sim_run.db, sim_run.run_id, fit=fit, sample=100)
    for ta, tb in zip(a.data, b.data, strict=True):
        np.testing.assert_array_equal(np.asarray(ta.x), np.asarray(tb.x))


def test_decode_points_curve_and_binned_errors_follow_the_model(sim_run, fit):
    fig = decode_fit(sim_run.db, sim_run.run_id, fit=fit)
    coef = {n.node_id: n.decode.coef for n in fit.nodes if n.decode.ok}
    rows = _table(
        sim_run.db,
        f"SELECT node_id, batch_size, t_fwd, duration_s FROM decode_iterations "
        f"WHERE run_id = '{sim_run.run_id}'",
    )
    for tr in (t for t in fig.data if t.type == "scattergl"):
        cd = np.asarray(tr.customdata)
        model = DecodeModel.from_coef(coef[_node(tr)], top_k=8, num_experts=256)
        expect = model.predict(np.asarray(tr.x, dtype=float), cd[:, 1])
        np.testing.assert_allclose(cd[:, 0], 1e3 * expect, rtol=1e-9)
    curves = [t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("model") == "decode"]
    assert {c.meta["node_id"] for c in curves} == set(coef)
    for c in curves:
        node = c.meta["node_id"]
        mine = rows.filter(pl.col("node_id") == node)
        assert c.meta["t_fwd"] == pytest.approx(mine["t_fwd"].mean())
        model = DecodeModel.from_coef(coef[node], 8, 256, t_fwd=c.meta["t_fwd"])
        np.testing.assert_allclose(
            np.asarray(c.y), 1e3 * model.predict(np.asarray(c.x)), rtol=1e-12
        )
        # Error by B (second panel) equals the mean relative error computed here.
        (err,) = [t for t in fig.data if t.xaxis == "x2" and t.legendgroup == f"node{node}"]
        pred = model.predict(mine["batch_size"].to_numpy().astype(float), mine["t_fwd"].to_numpy())
        rel = (mine["duration_s"].to_numpy() - pred) / mine["duration_s"].to_numpy()
        b = mine["batch_size"].to_numpy()
        for x, y in zip(err.x, err.y, strict=True):
            assert y == pytest.approx(100 * rel[b == x].mean(), abs=1e-9)
        assert sorted(err.x) == sorted(set(b.tolist()))


def test_nodes_without_a_fit_are_named(sim_run, fit):
    fig = decode_fit(sim_run.db, sim_run.run_id, fit=fit)
    failed = [
        n.node_id for n in fit.nodes if not n.decode.ok and n.decode.samples_test + n.decode.samples
    ]
    noted = [int(m.split(":")[0].removeprefix("node ")) for m in fig.layout.meta["not_fitted"]]
    assert noted == failed
    drawn = {_node(t) for t in fig.data if t.type == "scattergl"}
    assert drawn.isdisjoint(failed) and drawn
    if failed:
        assert f"not fitted: node {failed[0]}" in fig.layout.title.text


def test_a_fit_of_another_run_is_refused(sim_run, fit):
    with pytest.raises(ValueError, match="RunFit passed is of run"):
        prefill_fit(sim_run.db, sim_run.run_id, fit=fit._replace(run_id="other"))


def test_phi_curve_is_app_b3_for_the_nodes_shape(sim_run):
    fig = phi_curve(sim_run.db, sim_run.run_id, max_batch=40)
    (bars,) = [t for t in fig.data if t.type == "bar"]
    (curve,) = [t for t in fig.data if t.type == "scatter"]
    t_fwd = _table(
        sim_run.db, f"SELECT avg(t_fwd) FROM decode_iterations WHERE run_id = '{sim_run.run_id}'"
    ).item()
    assert curve.meta["t_fwd"] == pytest.approx(t_fwd, abs=5e-4)
    assert curve.meta["nodes"] == [0, 1, 2, 3]
    np.testing.assert_allclose(curve.y, phi(np.arange(1, 41), 8, 256, curve.meta["t_fwd"]))
    assert sum(bars.y) == pytest.approx(1.0)
