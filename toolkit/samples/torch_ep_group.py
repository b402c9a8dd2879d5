"""Bundled runs of a torch engine DP×EP group: the ground truth of the twin's DP+EP model.

`toolkit/data/torch_ep_group/` holds, per recorded run, its rows of the SPEC §3 tables
(`runs` with the engine settings, `nodes`, `requests` with the DP rank that served each,
`prefill_iterations`, `decode_iterations`, `dp_passes`, `moe_layer_loads`; Parquet) in
a folder named for the run (repeats of a workload, `ep2-poisson-b`..`-d` and
`ep2-saturated-b`..`-d`, keep runs, nodes and requests only: what their timings need), and
the operator profile measured on the same machine just before the first runs (`profile/`:
the LLMServingSim-layout bundle with `config.json`, `link.json` and `meta.json`;
`profile.json`: what `pdlab profile import` made of it) with its in-situ calibration
fitted on run `ep2-fit` (`profile_calibrated/`, toolkit.profiles.torch_calibration).
`scripts/ep_group_run.py --bundle` records a run into it; `scripts/torch_op_profile.py`
measures the profile, or calibrates it. `ep_group_db(path)` writes every bundled run into a
DuckDB file:

    pdlab twin $(python -c 'from toolkit.samples.torch_ep_group import ep_group_db; print(ep_group_db())') \\
        --run ep2-poisson-a --profile toolkit/data/torch_ep_group/profile_calibrated.json
"""

from __future__ import annotations

from pathlib import Path

BUNDLE_DIR = Path(__file__).resolve().parents[1] / "data" / "torch_ep_group"
PROFILE = BUNDLE_DIR / "profile.json"
TABLES = ("runs", "nodes", "requests", "prefill_iterations", "decode_iterations",
          "dp_passes", "moe_layer_loads")  # fmt: skip


def bundled_runs(bundle: Path = BUNDLE_DIR) -> list[str]:
    return sorted(p.name for p in bundle.iterdir() if (p / "runs.parquet").is_file())


def ep_group_db(path: str | Path = "torch_ep_group.duckdb", bundle: Path = BUNDLE_DIR) -> Path:
    """Write every bundled run into the DuckDB file `path` (replaced); returns the path."""
    from telemetry.store import transaction

    path = Path(path)
    path.unlink(missing_ok=True)
    with transaction(path, what="load the bundled DP×EP runs") as con:
        for run in bundled_runs(bundle):
            for t in TABLES:
                src = bundle / run / f"{t}.parquet"
                if src.is_file():
                    con.execute(
                        f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet(?)", [str(src)]
                    )
    return path


def write_bundle(db: str | Path, run_id: str, bundle: Path = BUNDLE_DIR) -> list[Path]:
    """Export one run's rows of `TABLES` from `db` into `bundle/run_id/`."""
    import duckdb

    out = bundle / run_id
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with duckdb.connect(str(db), read_only=True) as con:
        for t in TABLES:
            dst = out / f"{t}.parquet"
            con.execute(
                f"COPY (SELECT * FROM {t} WHERE run_id = ?) TO '{dst}' "
                "(FORMAT parquet, COMPRESSION zstd)",
                [run_id],
            )
            written.append(dst)
    return written
