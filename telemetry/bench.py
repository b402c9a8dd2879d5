"""Telemetry ingest benchmark (SPEC §8: >= 1M rows/s batched ingest).

Realistic prefill and decode iteration rows (SPEC §3) go through `TelemetryWriter.append`
in batches of 100k and `close()` into a fresh DuckDB file. `ingest_rows_per_s` is end to
end (writer open to close: validation, Parquet segments, consolidation); the two parts are
reported too: `ingest_live_rows_per_s` (until the rows are readable as live segments) and
`ingest_finalize_rows_per_s` (DuckDB's insert of the segments at close, the dominant cost).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from telemetry.writer import TelemetryWriter

NUM_NODES = 8


def prefill_batch(rng: np.random.Generator, start: int, n: int) -> dict[str, np.ndarray]:
    t_uc = rng.integers(1, 8192, n)
    t_c = rng.integers(0, 65536, n)
    return {
        "node_id": rng.integers(0, NUM_NODES, n, dtype=np.int32),
        "iter_id": np.arange(start, start + n, dtype=np.int64),
        "t_start": np.arange(start, start + n, dtype=np.float64) * 0.05,
        "duration_s": rng.uniform(0.01, 0.5, n),
        "num_reqs": rng.integers(1, 16, n, dtype=np.int32),
        "t_uc": t_uc,
        "attn_pairs": (t_uc * t_c + t_uc * (t_uc + 1) / 2).astype(np.float64),
        "t_rst": rng.integers(0, 4096, n),
        "t_c": t_c,
    }


def decode_batch(rng: np.random.Generator, start: int, n: int) -> dict[str, np.ndarray]:
    return {
        "node_id": rng.integers(0, NUM_NODES, n, dtype=np.int32),
        "iter_id": np.arange(start, start + n, dtype=np.int64),
        "t_start": np.arange(start, start + n, dtype=np.float64) * 0.02,
        "duration_s": rng.uniform(0.005, 0.05, n),
        "batch_size": rng.integers(1, 256, n, dtype=np.int32),
        "t_fwd": np.ones(n),
        "ctx_tokens": rng.integers(0, 1 << 20, n),
    }


class IngestTimes(NamedTuple):
    rows: int
    append_s: float  # validation + Parquet segments: the rows are readable live after this
    close_s: float  # consolidation into DuckDB
    total_s: float  # writer open to close, end to end


def ingest(db_path: Path, total_rows: int, batch_rows: int, seed: int = 0) -> IngestTimes:
    """Write `total_rows` iteration rows (half prefill, half decode) and time the phases."""
    rng = np.random.default_rng(seed)
    batches = []
    for start in range(0, total_rows, batch_rows):
        n = min(batch_rows, total_rows - start)
        make = prefill_batch if (start // batch_rows) % 2 == 0 else decode_batch
        table = "prefill_iterations" if make is prefill_batch else "decode_iterations"
        # Producers hand Arrow columns (what engines and the simulator build).
        batches.append((table, {k: pa.array(v) for k, v in make(rng, start, n).items()}))
    nodes = [
        {"node_id": i, "name": f"n{i}", "hardware": "H200", "moe_top_k": 8, "moe_experts": 256}
        for i in range(NUM_NODES)
    ]
    t0 = time.perf_counter()
    writer = TelemetryWriter(db_path, run_id="bench", source="bench")
    writer.add_nodes(nodes)
    t1 = time.perf_counter()
    for table, data in batches:
        writer.append(table, data)
    writer.flush()
    t2 = time.perf_counter()
    writer.close()
    t3 = time.perf_counter()
    return IngestTimes(total_rows, t2 - t1, t3 - t2, t3 - t0)


def run(quick: bool = False) -> dict[str, float]:
    total = 1_000_000 if quick else 2_000_000
    with tempfile.TemporaryDirectory(prefix="pdlab-bench-") as tmp:
        t = ingest(Path(tmp) / "bench.duckdb", total, 100_000)
    return {
        "ingest_rows_per_s": round(t.rows / t.total_s),
        "ingest_live_rows_per_s": round(t.rows / t.append_s),
        "ingest_finalize_rows_per_s": round(t.rows / t.close_s),
    }
