"""Benchmark of the figure library on 10M-row tables (SPEC §7 "large runs aggregate in DuckDB").

`run(quick)` writes a run with 10M decode iterations over 8 MoE nodes and 10M finished
requests (quick: 1M each) straight into a temporary DuckDB file through Arrow (numpy columns,
not through the telemetry writer), then times, end to end through a telemetry reader:
- `decode_fit` with the fit computed inside (toolkit.fit.run.fit_run, no bootstrap) and
  with a precomputed fit (the figure alone: binned errors, hash sample, model curves);
- `latency_distributions` (log-binned CDFs and quantiles over all requests).
Each figure is the median of three builds (quick: one). `plot_10m_rows_s` is the slower of
the two end-to-end figures.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from models.iteration import phi
from telemetry import open_reader
from telemetry.database import connect
from telemetry.schema import all_ddl
from toolkit.fit.run import fit_run
from toolkit.plots.fits import decode_fit
from toolkit.plots.latency import latency_distributions

RUN_ID = "plot-bench"
NUM_NODES = 8
DECODE_COEF = (1.2e-2, 8.0e-3, 1.5e-4)
CHUNK = 2_500_000


def _decode_rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    seq = np.arange(start, start + n, dtype=np.int64)
    b = rng.integers(1, 129, n)
    t_fwd = rng.integers(1, 5, n).astype(np.float64)
    d0, d1, d2 = DECODE_COEF
    noise = np.exp(rng.normal(0, 0.03, n))
    dur = (d0 + d1 * phi(b.astype(np.float64), 8, 256, t_fwd) + d2 * b) * noise
    return pa.table(
        {
            "node_id": (seq % NUM_NODES).astype(np.int32),
            "iter_id": seq // NUM_NODES,
            "t_start": seq * 0.002,
            "duration_s": dur,
            "batch_size": b.astype(np.int32),
            "t_fwd": t_fwd,
            "ctx_tokens": b * rng.integers(1024, 65_536, n),
        }
    )


def _request_rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    seq = np.arange(start, start + n, dtype=np.int64)
    arrival = seq * 0.001
    ttft = rng.lognormal(np.log(0.3), 1.0, n)
    t_in = rng.integers(1_000, 100_000, n)
    t_ideal = (t_in * rng.uniform(0.5, 0.99, n)).astype(np.int64)
    return pa.table(
        {
            "i": seq,
            "prefill_node": (seq % 4).astype(np.int32),
            "decode_node": (4 + seq % 4).astype(np.int32),
            "t_arrival": arrival,
            "t_prefill_start": arrival + 0.5 * ttft,
            "t_first_token": arrival + ttft,
            "t_done": arrival + ttft + rng.lognormal(np.log(3.0), 0.8, n),
            "t_in": t_in,
            "t_c": (t_ideal * rng.uniform(0.8, 1.0, n)).astype(np.int64),
            "t_ideal_c": t_ideal,
            "t_out": rng.integers(10, 2_000, n),
        }
    )


def write_bench_db(path: Path, rows: int, seed: int = 0) -> None:
    """A run with `rows` decode iterations and `rows` finished requests, via Arrow inserts."""
    rng = np.random.default_rng(seed)
    con = connect(path)
    try:
        for stmt in all_ddl():
            con.execute(stmt)
        config = json.dumps({"duration_s": rows * 0.001 + 60.0, "warmup_s": 0.0})
        con.execute("INSERT INTO runs VALUES (?, now()::TIMESTAMP, 'bench', ?)", [RUN_ID, config])
        con.execute(
            "INSERT INTO nodes SELECT ?, i, 'n' || i, 'bench', 8, 256 FROM range(?) t(i)",
            [RUN_ID, NUM_NODES],
        )
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            con.register("bench_rows", _decode_rows(rng, start, n))
            con.execute(
                "INSERT INTO decode_iterations BY NAME SELECT ? AS run_id, * FROM bench_rows",
                [RUN_ID],
            )
            con.unregister("bench_rows")
            con.register("bench_rows", _request_rows(rng, start, n))
            con.execute(
                """
                INSERT INTO requests BY NAME
                SELECT ? AS run_id, 'r' || i AS request_id, 'p' || (i // 20) AS program_id,
                       'root' AS branch_id, 0::BIGINT AS t_fetch, * EXCLUDE (i)
                FROM bench_rows
                """,
                [RUN_ID],
            )
            con.unregister("bench_rows")
    finally:
        con.close()


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(quick: bool = False) -> dict[str, Any]:
    rows = 1_000_000 if quick else 10_000_000
    repeats = 1 if quick else 3
    tag = "1m" if quick else "10m"
    with tempfile.TemporaryDirectory(prefix="pdlab-plot-bench-") as tmp:
        db = Path(tmp) / "plots.duckdb"
        write_bench_db(db, rows)
        reader = open_reader(db)
        fit = fit_run(reader, RUN_ID, bootstrap=0)
        fit_end_to_end = _median_s(lambda: decode_fit(reader, RUN_ID), repeats)
        fit_figure = _median_s(lambda: decode_fit(reader, RUN_ID, fit=fit), repeats)
        latency = _median_s(lambda: latency_distributions(reader, RUN_ID), repeats)
    return {
        f"plot_{tag}_rows_s": max(fit_end_to_end, latency),
        f"plot_decode_fit_{tag}_rows_s": fit_end_to_end,
        f"plot_decode_fit_figure_only_{tag}_rows_s": fit_figure,
        f"plot_latency_{tag}_rows_s": latency,
        "plot_rows": rows,
    }
