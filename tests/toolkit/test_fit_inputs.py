"""`pdlab fit` and `pdlab report` on databases that break the schema: one line, exit code 2.

The tables are checked first (telemetry.check): missing or misspelt required columns, values
a column's type cannot take, NULL ids. Stored types that merely differ are cast. Before,
these crashed with tracebacks or binder errors, or (a misspelt column) silently fitted
nothing and exited 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from toolkit.fit.run import FitInputError, fit_run
from toolkit.fit.synth import synth_logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def logs(tmp_path: Path) -> Callable[..., Path]:
    """A synthetic run, then `sql` statements applied to the file (another tool's schema)."""

    def make(*sql: str, truth: dict | None = None) -> Path:
        db = tmp_path / f"db{len(list(tmp_path.glob('*.duckdb')))}.duckdb"
        synth_logs(db, "r", nodes=2, prefill_iters=300, decode_iters=300, seed=1, truth=truth)
        con = duckdb.connect(str(db))
        for stmt in sql:
            con.execute(stmt)
        con.close()
        return db

    return make


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


def test_misspelt_column_is_named_and_exits_2(logs, tmp_path: Path) -> None:
    db = logs("ALTER TABLE prefill_iterations RENAME COLUMN attn_pairs TO attention_pairs")
    for cmd in (["fit", str(db)], ["report", str(db), "-o", str(tmp_path / "r.html")]):
        res = _cli(*cmd, cwd=tmp_path)
        err = " ".join(res.stderr.split())
        assert res.returncode == 2, (cmd, res.stdout, res.stderr)
        assert "prefill_iterations lacks the required column attn_pairs" in err, err
        assert "found 'attention_pairs': misspelt?" in err and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        (
            [
                "ALTER TABLE decode_iterations ALTER COLUMN run_id DROP NOT NULL",
                "UPDATE decode_iterations SET run_id = NULL WHERE iter_id < 5",
            ],
            "decode_iterations.run_id is NULL in 10 row(s)",
        ),
        (
            [
                "ALTER TABLE prefill_iterations ALTER COLUMN node_id DROP NOT NULL",
                "UPDATE prefill_iterations SET node_id = NULL WHERE iter_id = 3",
            ],
            "prefill_iterations.node_id is NULL in",
        ),
        (
            [
                "ALTER TABLE decode_iterations ALTER COLUMN node_id TYPE DOUBLE",
                "UPDATE decode_iterations SET node_id = node_id + 0.5 WHERE iter_id = 7",
            ],
            "decode_iterations.node_id is stored as DOUBLE and holds '",
        ),
        (
            [
                "ALTER TABLE prefill_iterations ALTER COLUMN duration_s TYPE VARCHAR",
                "UPDATE prefill_iterations SET duration_s = 'fast' WHERE iter_id = 2",
            ],
            "prefill_iterations.duration_s is stored as VARCHAR and holds 'fast'",
        ),
        (
            [
                "ALTER TABLE decode_iterations ALTER COLUMN batch_size TYPE BOOLEAN USING batch_size > 8"
            ],
            "decode_iterations.batch_size is stored as BOOLEAN, which cannot hold INTEGER values",
        ),
    ],
)
def test_bad_values_are_named(logs, sql: list[str], words: str) -> None:
    db = logs(*sql)
    with pytest.raises(FitInputError) as err:
        fit_run(db, bootstrap=0)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_castable_types_are_used(logs) -> None:
    db = logs(
        "ALTER TABLE decode_iterations ALTER COLUMN node_id TYPE DOUBLE",
        "ALTER TABLE prefill_iterations ALTER COLUMN duration_s TYPE VARCHAR",
        "ALTER TABLE prefill_iterations ALTER COLUMN t_uc TYPE DOUBLE",
    )
    fit = fit_run(db, bootstrap=0)
    assert [n.node_id for n in fit.nodes] == [0, 1]
    assert all(n.prefill.ok and n.decode.ok for n in fit.nodes)
    assert fit.nodes[0].prefill.mape < 0.1


def test_top_k_equal_to_experts_fits_with_d1_fixed(logs) -> None:
    db = logs("UPDATE nodes SET moe_top_k = moe_experts")
    fit = fit_run(db, bootstrap=0)  # log1p(-1) raised a math domain error here
    for node in fit.nodes:
        assert node.decode.ok and "d1" in node.decode.fixed
        assert "moe_top_k = moe_experts" in (node.decode.message or "")


def test_string_coefficients_in_model_fits_are_named(logs, tmp_path: Path) -> None:
    db = logs(
        "ALTER TABLE model_fits ALTER COLUMN coef TYPE VARCHAR",
        "INSERT INTO model_fits (run_id, node_id, phase, fitted_at, coef, samples, mape) "
        "VALUES ('r', 0, 'prefill', now()::TIMESTAMP, 'fast', 10, 0.1)",
    )
    res = _cli("report", str(db), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "model_fits.coef is stored as VARCHAR and holds 'fast'" in err
