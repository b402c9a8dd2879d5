"""The bundled runs of a torch DP2×EP2 group (toolkit/data/torch_ep_group, issue 22).

They load into DuckDB as the twin reads a run (engine settings with DP/EP, requests with
the rank that served them, per-rank iterations, lockstep passes, MoE layer loads); the
operator profile measured beside them, calibrated in situ on the calibration run, prices
the per-rank compute of the two other runs within 10%.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism
from toolkit.torch_ep_group import BUNDLE_DIR, bundled_runs, ep_group_db
from toolkit.torch_profile_calibration import calibrate, compute_ratios, pass_rows

RUNS = ("ep2-calibration", "ep2-poisson", "ep2-saturated")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ep_group_db(tmp_path_factory.mktemp("ep") / "runs.duckdb")


def test_bundled_runs_load_as_the_twin_reads_them(db: Path) -> None:
    from toolkit.engine_inputs import load_engine_inputs

    assert set(RUNS) <= set(bundled_runs())
    inputs = load_engine_inputs(db, "ep2-poisson", BUNDLE_DIR / "profile_calibrated.json")
    e = inputs.engine
    assert (e.data_parallel_size, e.expert_parallel_size, e.tensor_parallel_size) == (2, 2, 1)
    assert e.mixed_prefill_decode is False and e.max_num_seqs == 32
    assert inputs.requests.height == 300
    assert set(inputs.requests["node"].unique().to_list()) == {0, 1}
    assert inputs.link.startswith("recorded")
    with duckdb.connect(str(db), read_only=True) as con:
        waves = con.execute(
            "SELECT count(*) FROM (SELECT wave, step FROM dp_passes WHERE run_id = "
            "'ep2-poisson' GROUP BY 1, 2 HAVING count(*) <> 2)"
        ).fetchone()
        assert waves == (0,)  # every step ran on both ranks: the lockstep


def test_calibrated_profile_prices_other_runs_within_ten_percent(db: Path, tmp_path: Path) -> None:
    doc = calibrate(BUNDLE_DIR / "profile", db, "ep2-calibration", tmp_path / "cal")
    assert doc["ratio_after"]["real"] == pytest.approx(1.0, abs=0.02)
    assert doc["ratio_before"]["real"] > 1.5  # operators timed alone under-price serving
    shape = ModelShape.load(tmp_path / "cal" / "config.json")
    pricer = IterationPricer(OperatorTables.load(tmp_path / "cal"), shape, Parallelism(dp=2, ep=2))
    for run in ("ep2-poisson", "ep2-saturated"):
        rows, _config = pass_rows(db, run)
        assert compute_ratios(rows, pricer)["real"] == pytest.approx(1.0, abs=0.10), run
