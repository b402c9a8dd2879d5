"""Fitting Eq. 1-2 per node from DuckDB (toolkit.fit.run) on synthetic and hand-made logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from models.fitting import GramStats, decode_features, fit_from_gram, prefill_features
from telemetry import TelemetryWriter, open_reader
from telemetry.schema import TABLES
from toolkit.fit.run import FitInputError, fit_run, save_fits, to_json
from toolkit.fit.synth import DEFAULT_TRUTH, synth_logs

# Four nodes with different hardware (coefficients) and MoE shapes.
TRUTHS = [
    {
        "prefill": tuple(c * s for c, s in zip(DEFAULT_TRUTH["prefill"], scale, strict=True)),
        "decode": tuple(c * s for c, s in zip(DEFAULT_TRUTH["decode"], dscale, strict=True)),
        "moe_top_k": k,
        "moe_experts": e,
    }
    for scale, dscale, k, e in (
        ((1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0), 8, 256),
        ((1.5, 0.8, 1.2, 2.0), (0.9, 1.3, 0.7), 8, 256),
        ((0.7, 1.3, 0.6, 0.5), (1.2, 0.6, 1.5), 8, 256),
        ((1.2, 0.6, 1.6, 1.0), (1.1, 1.1, 1.1), 6, 160),
    )
]


@pytest.fixture(scope="module")
def synth_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("fit") / "synth.duckdb"
    run_id = synth_logs(
        db, nodes=4, prefill_iters=12_000, decode_iters=20_000, truth=TRUTHS, noise=0.03, seed=7
    )
    return db, run_id


@pytest.fixture(scope="module")
def synth_fit(synth_db: tuple[Path, str]) -> Any:
    return fit_run(synth_db[0])


def test_recovers_every_coefficient_of_every_node_within_2_percent(synth_fit: Any) -> None:
    assert [n.node_id for n in synth_fit.nodes] == [0, 1, 2, 3]
    for node, truth in zip(synth_fit.nodes, TRUTHS, strict=True):
        for fit, true in ((node.prefill, truth["prefill"]), (node.decode, truth["decode"])):
            assert fit.ok, fit.message
            rel = np.abs(np.array(fit.coef) / np.array(true) - 1.0)
            assert np.all(rel < 0.02), (node.node_id, fit.phase, rel)
            assert fit.fixed == ()


def test_heldout_mape_is_at_the_noise_level(synth_fit: Any) -> None:
    # 3% lognormal noise: E|e| = 0.03 * sqrt(2/pi) = 2.4%.
    for node in synth_fit.nodes:
        for fit in (node.prefill, node.decode):
            assert 0.015 < fit.mape < 0.045
            total = fit.samples + fit.samples_test
            assert 0.15 < fit.samples_test / total < 0.25  # holdout 0.2 by hash


def test_bootstrap_intervals_cover_the_truth(synth_fit: Any) -> None:
    inside = total = 0
    for node, truth in zip(synth_fit.nodes, TRUTHS, strict=True):
        for fit, true in ((node.prefill, truth["prefill"]), (node.decode, truth["decode"])):
            ci = np.array(fit.ci)
            assert np.all(ci[:, 0] <= fit.coef) and np.all(np.array(fit.coef) <= ci[:, 1])
            hit = (ci[:, 0] <= true) & (np.array(true) <= ci[:, 1])
            inside += int(hit.sum())
            total += len(true)
            # A miss is a near miss: by less than the interval's width (the relative-error
            # estimator is biased by about -1.5 sigma^2 = -0.14%).
            miss = np.maximum(ci[:, 0] - true, np.array(true) - ci[:, 1])
            assert np.all(miss < ci[:, 1] - ci[:, 0])
    assert inside / total >= 0.75  # nominal 95%, 28 intervals


def test_sql_aggregation_matches_numpy_on_the_same_rows(synth_db: tuple[Path, str]) -> None:
    db, run_id = synth_db
    fit = fit_run(db, run_id, node_ids=[1], holdout=0.0, bootstrap=0)
    con = duckdb.connect(str(db), read_only=True)
    pre = con.execute(
        "SELECT t_uc, attn_pairs, t_rst, duration_s FROM prefill_iterations WHERE node_id = 1"
    ).fetchnumpy()
    dec = con.execute(
        "SELECT batch_size, t_fwd, duration_s FROM decode_iterations WHERE node_id = 1"
    ).fetchnumpy()
    con.close()
    x = prefill_features(pre["t_uc"], pre["attn_pairs"], pre["t_rst"])
    expect, _ = fit_from_gram(GramStats.from_rows(x, pre["duration_s"]), ("c0", "c1", "c2", "c3"))
    np.testing.assert_allclose(fit.nodes[0].prefill.coef, expect, rtol=1e-8)
    xd = decode_features(dec["batch_size"], dec["t_fwd"], 8, 256)
    expect_d, _ = fit_from_gram(GramStats.from_rows(xd, dec["duration_s"]), ("d0", "d1", "d2"))
    np.testing.assert_allclose(fit.nodes[0].decode.coef, expect_d, rtol=1e-8)
    assert fit.nodes[0].prefill.samples == 12_000 and fit.nodes[0].prefill.mape is None
    assert "holdout = 0" in (fit.nodes[0].prefill.message or "")


def test_heldout_mape_is_computed_on_the_hashed_rows(synth_db: tuple[Path, str]) -> None:
    db, run_id = synth_db
    fit = fit_run(db, run_id, node_ids=[2], holdout=0.3, bootstrap=0)
    c = np.array(fit.nodes[0].prefill.coef)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT t_uc, attn_pairs, t_rst, duration_s FROM prefill_iterations "
        "WHERE node_id = 2 AND hash(node_id, iter_id) % 10000 < 3000"
    ).fetchnumpy()
    con.close()
    pred = prefill_features(rows["t_uc"], rows["attn_pairs"], rows["t_rst"]) @ c
    expect = np.mean(np.abs(pred - rows["duration_s"]) / rows["duration_s"])
    assert fit.nodes[0].prefill.mape == pytest.approx(expect, rel=1e-9)
    assert fit.nodes[0].prefill.samples_test == len(rows["duration_s"])


def test_refitting_is_idempotent(synth_db: tuple[Path, str], tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(synth_db[0].read_bytes())
    first = fit_run(db)
    assert save_fits(db, first) == 8
    again = fit_run(db)
    assert save_fits(db, again) == 8
    assert [n.prefill.coef for n in first.nodes] == [n.prefill.coef for n in again.nodes]
    assert [n.decode.mape for n in first.nodes] == [n.decode.mape for n in again.nodes]
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT run_id, node_id, phase, coef, samples, mape FROM model_fits ORDER BY node_id, phase"
    ).fetchall()
    stamps = con.execute("SELECT DISTINCT fitted_at FROM model_fits").fetchall()
    con.close()
    assert len(rows) == 8 and len(stamps) == 1  # the first fit's rows were replaced
    expect = sorted(
        (first.run_id, n.node_id, f.phase, list(f.coef), f.samples, f.mape)
        for n in first.nodes
        for f in (n.prefill, n.decode)
    )
    assert sorted(rows) == expect


def _write_run(
    db: Path, nodes: list[dict[str, Any]], prefill: dict[int, Any], decode: dict[int, Any]
) -> str:
    """A run through the telemetry writer: per node, prefill (t_uc, A, t_rst, y) and decode
    (B, t_fwd, y) arrays."""
    with TelemetryWriter(db, source="test") as w:
        w.add_nodes(nodes)
        for n, (t_uc, a, t_rst, y) in prefill.items():
            k = len(y)
            w.append(
                "prefill_iterations",
                {
                    "node_id": [n] * k,
                    "iter_id": np.arange(k),
                    "t_start": np.arange(k, dtype=float),
                    "duration_s": y,
                    "num_reqs": np.ones(k, np.int32),
                    "t_uc": t_uc,
                    "attn_pairs": a,
                    "t_rst": t_rst,
                    "t_c": np.zeros(k, np.int64),
                },
            )
        for n, (b, t_fwd, y) in decode.items():
            k = len(y)
            w.append(
                "decode_iterations",
                {
                    "node_id": [n] * k,
                    "iter_id": np.arange(k),
                    "t_start": np.arange(k, dtype=float),
                    "duration_s": y,
                    "batch_size": b,
                    "t_fwd": t_fwd,
                    "ctx_tokens": b * 1000,
                },
            )
        return w.run_id


def _node(i: int, k: int = 8, e: int = 256) -> dict[str, Any]:
    return {"node_id": i, "name": f"n{i}", "hardware": "H200", "moe_top_k": k, "moe_experts": e}


def _prefill(n: int, seed: int, restores: bool = True) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    t_uc = rng.integers(16, 8192, n)
    t_c = rng.integers(0, 50_000, n)
    a = t_uc * t_c + t_uc * (t_uc + 1) / 2.0
    t_rst = (t_c * rng.random(n)).astype(np.int64) if restores else np.zeros(n, np.int64)
    y = prefill_features(t_uc, a, t_rst) @ np.array(DEFAULT_TRUTH["prefill"])
    return t_uc, a, t_rst, y * np.exp(rng.normal(0, 0.01, n))


def _decode(
    n: int, seed: int, k: int = 8, e: int = 256, b: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 129, n) if b is None else b
    t_fwd = np.ones(n)
    y = decode_features(b, t_fwd, k, e) @ np.array(DEFAULT_TRUTH["decode"])
    return b, t_fwd, y * np.exp(rng.normal(0, 0.01, n))


def test_bad_nodes_get_messages_and_the_others_are_fitted(tmp_path: Path) -> None:
    db = tmp_path / "mixed.duckdb"
    run_id = _write_run(
        db,
        [_node(0), _node(1), _node(2), _node(3, 0, 0), _node(4)],
        prefill={0: _prefill(400, 0), 3: _prefill(400, 3), 4: _prefill(400, 4, restores=False)},
        decode={
            0: _decode(400, 0),
            1: _decode(5, 1),  # too few
            2: _decode(400, 2, b=np.full(400, 4)),  # one batch size: degenerate
            3: _decode(400, 3, 0, 0),  # dense
        },
    )
    fit = fit_run(db)
    assert fit.run_id == run_id
    by = {n.node_id: n for n in fit.nodes}
    assert by[0].prefill.ok and by[0].decode.ok and by[0].prefill.message is None
    assert not by[1].decode.ok and by[1].decode.coef is None
    assert by[1].decode.message.startswith("node 1 decode: only ")
    assert "need at least 8" in by[1].decode.message
    assert by[1].prefill.message == "node 1 prefill: no prefill iterations logged"
    assert "degenerate samples" in by[2].decode.message and by[2].decode.coef is None
    assert by[3].decode.ok and by[3].decode.fixed == ("d1",) and by[3].decode.coef[1] == 0.0
    assert "dense model (moe_experts = 0)" in by[3].decode.message
    np.testing.assert_allclose(
        by[3].decode.coef[::2], np.array(DEFAULT_TRUTH["decode"])[::2], rtol=0.02
    )
    assert by[4].prefill.fixed == ("c3",) and "no host restores" in by[4].prefill.message
    assert by[4].decode.message == "node 4 decode: no decode iterations logged"
    out = to_json(fit)
    entry = next(e for e in out["nodes"] if e["node_id"] == 1)
    assert entry["decode"]["coef"] is None and "only" in entry["decode"]["message"]
    # Failed fits write nothing; successful ones are stored.
    assert save_fits(db, fit) == 5
    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute("SELECT node_id, phase FROM model_fits ORDER BY ALL").fetchall()
    con.close()
    assert stored == [(0, "decode"), (0, "prefill"), (3, "decode"), (3, "prefill"), (4, "prefill")]


def _external_db(path: Path) -> None:
    """A DB an outside engine wrote with plain DDL: no pdlab_meta, no runs, no constraints."""
    con = duckdb.connect(str(path))
    for table in ("nodes", "prefill_iterations", "decode_iterations"):
        cols = ", ".join(f"{c.name} {c.sql}" for c in TABLES[table])
        con.execute(f"CREATE TABLE {table} ({cols})")
    con.execute("INSERT INTO nodes VALUES ('ext', 0, 'gpu0', 'H100', 8, 256)")
    t_uc, a, t_rst, y = _prefill(300, 11)
    y[:3] = [0.0, -1.0, float("nan")]  # bad rows the schema would have rejected
    con.execute(
        "INSERT INTO prefill_iterations (run_id, node_id, iter_id, t_start, duration_s, "
        "num_reqs, t_uc, attn_pairs, t_rst, t_c) SELECT 'ext', 0, i, i, y, 1, u, a, r, 0 "
        "FROM (SELECT unnest(range(300)) AS i, unnest(?) AS u, unnest(?) AS a, unnest(?) AS r, unnest(?) AS y)",
        [t_uc.tolist(), a.tolist(), t_rst.tolist(), y.tolist()],
    )
    b, t_fwd, yd = _decode(300, 12)
    for node in (0, 1):  # node 1 has no nodes row
        con.execute(
            "INSERT INTO decode_iterations (run_id, node_id, iter_id, t_start, duration_s, "
            "batch_size, t_fwd, ctx_tokens) SELECT 'ext', ?, i, i, y, b, f, 0 "
            "FROM (SELECT unnest(range(300)) AS i, unnest(?) AS b, unnest(?) AS f, unnest(?) AS y)",
            [node, b.tolist(), t_fwd.tolist(), yd.tolist()],
        )
    con.close()


def test_external_database_without_pdlab_bookkeeping(tmp_path: Path) -> None:
    db = tmp_path / "external.duckdb"
    _external_db(db)
    fit = fit_run(db)  # run found through the iteration tables (no runs table)
    assert fit.run_id == "ext"
    by = {n.node_id: n for n in fit.nodes}
    assert by[0].prefill.ok and "3 iterations excluded" in by[0].prefill.message
    np.testing.assert_allclose(by[0].prefill.coef, DEFAULT_TRUTH["prefill"], rtol=0.05)
    assert by[0].decode.ok
    assert by[1].decode.coef is None and "no row in `nodes`" in by[1].decode.message
    assert by[1].prefill.message == "node 1 prefill: no prefill iterations logged"
    assert save_fits(db, fit) == 2  # node 0 prefill and decode
    con = duckdb.connect(str(db), read_only=True)
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    con.close()
    assert tables == {"nodes", "prefill_iterations", "decode_iterations", "model_fits"}


def test_a_run_still_being_written_can_be_fitted(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    with TelemetryWriter(db, run_id="live-run") as w:
        w.add_nodes([_node(0)])
        b, t_fwd, y = _decode(200, 5)
        w.append(
            "decode_iterations",
            {
                "node_id": [0] * 200,
                "iter_id": np.arange(200),
                "t_start": np.arange(200.0),
                "duration_s": y,
                "batch_size": b,
                "t_fwd": t_fwd,
                "ctx_tokens": b * 10,
            },
        )
        w.flush()  # a live segment, not yet in the DB file
        fit = fit_run(db)
        assert fit.run_id == "live-run" and fit.nodes[0].decode.samples > 100
        assert save_fits(db, fit) == 1


def test_input_errors_are_clear(tmp_path: Path, synth_db: tuple[Path, str]) -> None:
    with pytest.raises(FitInputError, match="does not exist"):
        fit_run(tmp_path / "missing.duckdb")
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    with pytest.raises(FitInputError, match="no prefill_iterations or decode_iterations table"):
        fit_run(empty)
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello")
    with pytest.raises(
        FitInputError, match=r"notes\.txt is not a DuckDB database \(it looks like text\)"
    ):
        fit_run(not_db)
    db, run_id = synth_db
    with pytest.raises(FitInputError, match="no run 'nope'.*" + run_id):
        fit_run(db, "nope")
    with pytest.raises(FitInputError, match=r"node\(s\) \[9\] not in run"):
        fit_run(db, node_ids=[9])
    with pytest.raises(FitInputError, match="holdout must be a fraction"):
        fit_run(db, holdout=1.5)


def test_several_runs_need_a_run_id(tmp_path: Path) -> None:
    db = tmp_path / "two.duckdb"
    a = synth_logs(db, nodes=1, prefill_iters=200, decode_iters=200, seed=1)
    b = synth_logs(db, nodes=2, prefill_iters=200, decode_iters=200, seed=2)
    with pytest.raises(FitInputError, match=f"holds 2 runs; choose one with --run: .*{a}|{b}"):
        fit_run(db)
    assert len(fit_run(db, b).nodes) == 2 and len(fit_run(db, a).nodes) == 1


def test_a_column_missing_from_an_external_table_is_named(tmp_path: Path) -> None:
    db = tmp_path / "no_rst.duckdb"
    con = duckdb.connect(str(db))
    con.execute(
        "CREATE TABLE prefill_iterations (run_id VARCHAR, node_id INTEGER, iter_id BIGINT, "
        "t_start DOUBLE, duration_s DOUBLE, num_reqs INTEGER, t_uc BIGINT, attn_pairs DOUBLE, t_c BIGINT)"
    )
    con.execute(
        "INSERT INTO prefill_iterations SELECT 'x', 0, i, i, 0.01 + i * 1e-6, 1, 100 + i, 1e4, 0 "
        "FROM range(50) t(i)"
    )
    con.close()
    # Before the schema check, every row read t_rst as NULL and was silently excluded.
    with pytest.raises(
        FitInputError, match="table prefill_iterations lacks the required column t_rst"
    ):
        fit_run(db)


def test_synthetic_truth_is_validated() -> None:
    with pytest.raises(ValueError, match="node 1: coefficients must be >= 0"):
        synth_logs("unused.duckdb", nodes=2, truth=[{}, {"prefill": (1.0, -1.0, 0.0, 0.0)}])
    with pytest.raises(ValueError, match="moe_top_k <= moe_experts"):
        synth_logs("unused.duckdb", nodes=1, truth={"moe_top_k": 9, "moe_experts": 8})
    with pytest.raises(ValueError, match="one per node"):
        synth_logs("unused.duckdb", nodes=3, truth=[{}, {}])


def test_a_telemetry_reader_can_be_passed_instead_of_a_path(synth_db: tuple[Path, str]) -> None:
    db, run_id = synth_db
    by_path = fit_run(db, run_id, node_ids=[0], bootstrap=0)
    by_reader = fit_run(open_reader(db), run_id, node_ids=[0], bootstrap=0)
    assert by_reader.nodes == by_path.nodes
