"""The bundled torch-cluster run: real pass times and real routing (SPEC §9; notebook 02).

A decode pass of one request activates exactly k experts per MoE layer, so its measured
coverage is k/E; over batches it follows Eq. 2's phi(B) = 1 − (1 − k/E)^B closely (the
random-weight router is not perfectly uniform, so coverage lags a little at larger B). The
fit converges per node on measured times, and the spread of equal-work decode passes is
reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from models.iteration import phi
from toolkit.fit.run import fit_run, mape_table
from toolkit.plots import phi_curve
from toolkit.queries import decode_noise, open_run, phi_data
from toolkit.samples.torch_cluster import torch_sample_db


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return torch_sample_db(tmp_path_factory.mktemp("torch") / "sample.duckdb")


def test_measured_phi_is_k_over_e_alone_and_follows_the_model(db: Path) -> None:
    with open_run(db) as run:
        data = phi_data(run)
    (shape,) = data.shapes
    assert (shape.top_k, shape.num_experts) == (2, 16)
    by_b = {m.batch_size: m for m in shape.measured}
    assert by_b[1].mean == 2 / 16 and by_b[1].std == 0.0
    assert len(by_b) >= 6
    for b, m in by_b.items():
        if m.iterations >= 20:
            assert m.mean == pytest.approx(phi(b, 2, 16), abs=0.05), b
            assert m.mean <= phi(b, 2, 16) + 1e-9  # never more coverage than uniform routing
    fig = phi_curve(db)
    (measured,) = [t for t in fig.data if (t.meta or {}).get("measured")]
    assert list(measured.x) == sorted(by_b)


def test_models_fit_the_measured_passes_and_the_noise_is_reported(db: Path) -> None:
    fit = fit_run(db)
    table = mape_table(fit).filter(mape_table(fit)["train_rows"] > 0)
    assert sorted(zip(table["node"], table["phase"], strict=True)) == [
        (0, "prefill"), (1, "decode"), (2, "decode"),
    ]  # fmt: skip
    assert all(0 < m < 100 for m in table["heldout_mape_pct"])
    with open_run(db) as run:
        noise = decode_noise(run)
    assert set(noise["node_id"]) == {1, 2} and (noise["iterations"] >= 20).all()
    assert (noise["cv"] > 0).all() and (noise["p90_over_p10"] > 1).all()
