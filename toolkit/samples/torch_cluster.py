"""A bundled run of a live torch cluster, for fitting models on real timings (SPEC §9).

`toolkit/data/torch_tiny_moe/` holds the `runs`, `nodes`, `prefill_iterations` and
`decode_iterations` rows (Parquet, ~60 KiB) of one minute of `pdlab serve --engines torch`:
three tiny-moe engines (1 prefill, 2 decode), one torch thread each on a shared 2-core
CPU, serving 24 cc agents at token scale 0.02. Every pass time is measured (with device
synchronization), and each decode row carries the distinct experts the pass activated
(`experts_active`), so Eq. 2's phi(B) meets real routing. `scripts/torch_sample_run.py`
records it again. `torch_sample_db(path)` writes it into a DuckDB file that `fit_run`,
`toolkit.plots` and `open_reader` read like any run.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "torch_tiny_moe"
TABLES = ("runs", "nodes", "prefill_iterations", "decode_iterations")


def torch_sample_db(path: str | Path = "torch_sample.duckdb") -> Path:
    """Write the bundled run into the DuckDB file `path` (replaced) and return its path."""
    import duckdb

    path = Path(path)
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as con:
        for t in TABLES:
            src = SAMPLE_DIR / f"{t}.parquet"
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet(?)", [str(src)])
    return path


def write_sample(db: str | Path, run_id: str, out_dir: Path = SAMPLE_DIR) -> list[Path]:
    """Export one run's rows of `TABLES` from `db` as the bundled Parquet files."""
    import duckdb

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with duckdb.connect(str(db), read_only=True) as con:
        for t in TABLES:
            dst = out_dir / f"{t}.parquet"
            con.execute(
                f"COPY (SELECT * FROM {t} WHERE run_id = ?) TO '{dst}' "
                "(FORMAT parquet, COMPRESSION zstd)",
                [run_id],
            )
            written.append(dst)
    return written
