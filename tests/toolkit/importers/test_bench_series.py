"""An LLMServingSim bench run's `timeseries.csv` (the engine's per-tick counters) goes into
`reference_series`; a run without the file imports without a series, a malformed file is an
error naming its line and column and leaves the database as it was."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import duckdb
import pytest

from cluster.data import BUNDLED
from toolkit.importers import ImportFileError, read_vllm_bench, write_runs

RUN = BUNDLED / "real_runs" / "rtxpro6000_qwen3_32b_vllm"


def test_every_tick_and_column_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    run = read_vllm_bench(RUN, run_id="q")
    write_runs(db, [run])
    ticks = list(csv.DictReader((RUN / "timeseries.csv").open()))
    assert run.config["series"]["ticks"] == len(ticks)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT metric, t, value FROM reference_series WHERE run_id = 'q' AND source = 'real' "
            "AND scope = 'cluster' AND node_id IS NULL ORDER BY metric, t"
        ).fetchall()
    got: dict[str, list[tuple[float, float]]] = {}
    for metric, t, value in rows:
        got.setdefault(metric, []).append((t, value))
    columns = {"running_reqs": "running", "waiting_reqs": "waiting", "kv_cache_pct": "kv_cache_pct",
               "throughput_tok_s": "gen_throughput", "prompt_throughput_tok_s": "prompt_throughput"}  # fmt: skip
    assert set(got) == set(columns)
    for metric, col in columns.items():
        assert got[metric] == [(float(r["t"]), float(r[col])) for r in ticks]


def test_without_the_file_there_is_no_series(tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    (copy / "timeseries.csv").unlink()
    run = read_vllm_bench(copy)
    assert "reference_series" not in run.extra and "series" not in run.config


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda rows: rows[3].__setitem__(3, "many"),
            r"line 4: field running: not a number: 'many'",
        ),
        (
            lambda rows: rows[5].__setitem__(4, "-1"),
            r"line 6: field waiting: expected a finite number >= 0",
        ),
        (lambda rows: [r.pop(3) for r in rows], r"line 1: field running: column missing"),
    ],
)
def test_a_malformed_file_names_line_and_column(tmp_path: Path, edit, message) -> None:
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    rows = list(csv.reader((RUN / "timeseries.csv").open()))
    edit(rows)
    with (copy / "timeseries.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with pytest.raises(ImportFileError, match=message):
        read_vllm_bench(copy)
