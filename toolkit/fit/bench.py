"""Benchmark of fitting the iteration-time models over 10M logged iterations (SPEC §8).

`run(quick)` writes 10M iterations (quick: 1M), half prefill and half decode, spread over 8
nodes, straight into a temporary DuckDB file through Arrow (ingest speed is measured by the
telemetry suite, not here), then times `toolkit.fit.run.fit_run` end to end: opening the
telemetry reader, the SQL Gram aggregation and held-out MAPE passes over all rows, NNLS and
200 bootstrap resamples per node and phase. The figure is the median of three fits.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from models.iteration import phi
from telemetry.database import connect
from telemetry.schema import all_ddl
from toolkit.fit.run import fit_run, save_fits

RUN_ID = "fit-bench"
NUM_NODES = 8
PREFILL_COEF = (4.0e-3, 6.0e-5, 3.0e-10, 2.0e-6)
DECODE_COEF = (1.2e-2, 8.0e-3, 1.5e-4)


def _seq(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def _prefill_rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    t_uc = np.exp(rng.uniform(np.log(16), np.log(8192), n)).astype(np.int64)
    t_c = np.where(rng.random(n) < 0.6, rng.integers(0, 131_072, n), 0)
    t_rst = np.where(rng.random(n) < 0.3, (t_c * rng.random(n)).astype(np.int64), 0)
    attn = t_uc * t_c + t_uc * (t_uc + 1) / 2.0
    c0, c1, c2, c3 = PREFILL_COEF
    dur = (c0 + c1 * t_uc + c2 * attn + c3 * t_rst) * np.exp(rng.normal(0, 0.03, n))
    return pa.table(
        {
            "node_id": (_seq(start, n) % NUM_NODES).astype(np.int32),
            "iter_id": _seq(start, n) // NUM_NODES,
            "t_start": _seq(start, n) * 0.1,
            "duration_s": dur,
            "num_reqs": rng.integers(1, 8, n).astype(np.int32),
            "t_uc": t_uc,
            "attn_pairs": attn,
            "t_rst": t_rst,
            "t_c": t_c,
        }
    )


def _decode_rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    b = rng.integers(1, 129, n)
    t_fwd = rng.integers(1, 5, n).astype(np.float64)
    d0, d1, d2 = DECODE_COEF
    dur = (d0 + d1 * phi(b.astype(np.float64), 8, 256, t_fwd) + d2 * b) * np.exp(
        rng.normal(0, 0.03, n)
    )
    return pa.table(
        {
            "node_id": (_seq(start, n) % NUM_NODES).astype(np.int32),
            "iter_id": _seq(start, n) // NUM_NODES,
            "t_start": _seq(start, n) * 0.02,
            "duration_s": dur,
            "batch_size": b.astype(np.int32),
            "t_fwd": t_fwd,
            "ctx_tokens": b * 4096,
        }
    )


def write_bench_db(path: Path, num_iterations: int, seed: int = 0) -> None:
    """A run of `num_iterations` iterations (half each phase) written via Arrow."""
    rng = np.random.default_rng(seed)
    con = connect(path)
    try:
        for stmt in all_ddl():
            con.execute(stmt)
        con.execute("INSERT INTO runs VALUES (?, now()::TIMESTAMP, 'bench', NULL)", [RUN_ID])
        con.execute(
            "INSERT INTO nodes SELECT ?, i, 'n' || i, 'bench', 8, 256 FROM range(?) t(i)",
            [RUN_ID, NUM_NODES],
        )
        chunk = 2_500_000
        for table, make, total in (
            ("prefill_iterations", _prefill_rows, num_iterations // 2),
            ("decode_iterations", _decode_rows, num_iterations - num_iterations // 2),
        ):
            for start in range(0, total, chunk):
                rows = make(rng, start, min(chunk, total - start))
                con.register("bench_rows", rows)
                con.execute(
                    f"INSERT INTO {table} BY NAME SELECT ? AS run_id, * FROM bench_rows", [RUN_ID]
                )
                con.unregister("bench_rows")
    finally:
        con.close()


def run(quick: bool = False) -> dict[str, Any]:
    num = 1_000_000 if quick else 10_000_000
    with tempfile.TemporaryDirectory(prefix="pdlab-fit-bench-") as tmp:
        db = Path(tmp) / "fit.duckdb"
        write_bench_db(db, num)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fit = fit_run(db, RUN_ID)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        save_fits(db, fit)
        save_s = time.perf_counter() - t0
    worst = max(
        abs(c / t - 1.0)
        for node in fit.nodes
        for f, truth in ((node.prefill, PREFILL_COEF), (node.decode, DECODE_COEF))
        for c, t in zip(f.coef or (), truth, strict=False)
    )
    return {
        "fit_10m_iterations_s" if not quick else "fit_1m_iterations_s": statistics.median(times),
        "fit_iterations": num,
        "fit_save_model_fits_s": save_s,
        "fit_max_coef_rel_error": worst,
    }
