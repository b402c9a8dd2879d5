"""`pdlab validate DB`: every real run of a database through the twin, one table (issue 22).

`validate_runs(db, runs=None, profiles=None)` replays each real run that has a reference
and returns a `ValidationTable`: per run and metric the real value, the twin's, the error,
its 95% interval, whether that interval contains 0 (the real value is inside the twin's
interval: `covered`), and the same error of each peer simulator whose figures the data has.
- cluster runs imported with `pdlab import lss-run` (toolkit.validate.cluster): the cluster
  twin (toolkit.twin.lss) against the imported series and mean-latency table;
- benchmark runs imported with `pdlab import vllm-bench` / `sglang-bench`
  (toolkit.validate.bench): `pdlab twin` (toolkit.twin.run) with the operator profile given for
  the run in `profiles` (run id -> profile JSON); without one the run is listed as skipped.
Metrics and how their error reads (`kind`):
- relative: `ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s`, `throughput_tok_s` (output tokens
  per second, first arrival to last token), `span_s` (first arrival to last token), and
  `kv_mem_mean_mib`: error = twin / real - 1;
- per tick (the error is the metric itself, 0 is perfect): `throughput_tick_mape` (fraction,
  ticks with real throughput > 0), `prefix_hit_tick_mae` (percentage points, every
  instance's ticks), `kv_mem_tick_wape` (KV in use: sum |twin - real| / sum real over every
  instance's ticks), `pool_hit_tick_mae`, `pool_mem_tick_wape` (the shared CPU pool); with
  more than one instance also per instance (`prefix_hit_tick_mae[i]`, `kv_mem_tick_wape[i]`).
Intervals (`ci95`, of the error): for relative rows the twin's combined interval, the row's
own spread (request resampling of the means through toolkit.twin.metrics.compare, the real
run's per-request times where it has them, else its mean; the real series' 1 s tick
resolution for spans and series throughput; a moving-block bootstrap over ticks for the
mean KV) with the model's error (toolkit.twin.interval: the profile's held-out residuals,
each ranged replay parameter at its ends, toolkit.twin.parameters), each source's (down, up)
in `sources`; `covered`: the interval contains 0 (the real value lies in the twin's 95%
prediction interval), `known`: both ends are bounded (a parameter end the replay cannot run
leaves a side "not known": the row is then not covered), `half_width` in units of the
error. Per-tick rows keep the moving-block bootstrap of their error as `ci95`, which an
error of 0 is never inside; their `covered` is whether the real series lies in the twin's
per-tick 95% band on at least 95% of the ticks (toolkit.validate.cluster), `ticks_covered`
that share. The `silicon` subcommand (issue 23, `toolkit/validate/silicon.py`) is dispatched
by the CLI before a database path is read (toolkit.cli.validate).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from telemetry import TelemetryError, open_reader
from toolkit.twin.interval import PROFILE_REPLAYS
from toolkit.validate.rows import ValidationRow, ValidationTable

REAL_SOURCES = ("lss-run", "vllm-bench", "sglang-bench")
__all__ = ["ValidationRow", "ValidationTable", "real_runs", "validate_runs"]


def real_runs(db: str | Path) -> pl.DataFrame:
    """run_id, source, importer of the database's imported real runs, in start order."""
    runs = open_reader(db).runs()
    return runs.filter(pl.col("source").is_in(list(REAL_SOURCES)))


def validate_runs(
    db: str | Path,
    runs: Sequence[str] | None = None,
    profiles: dict[str, str | Path] | None = None,
    *,
    samples: int = 1000,
    seed: int = 0,
    profile_replays: int = PROFILE_REPLAYS,
) -> ValidationTable:
    """Replay and compare every real run (or `runs`) of `db` (module docstring)."""
    from toolkit.validate.bench import bench_rows
    from toolkit.validate.cluster import cluster_rows

    found = real_runs(db)
    sources = dict(zip(found["run_id"].to_list(), found["source"].to_list(), strict=True))
    if runs:
        missing = [r for r in runs if r not in sources]
        if missing:
            raise TelemetryError(
                f"{db}: no imported real run {', '.join(repr(m) for m in missing)}; real runs: "
                f"{', '.join(sources) or 'none'}"
            )
    profiles = dict(profiles or {})
    unknown = sorted(set(profiles) - set(sources))
    if unknown:
        raise TelemetryError(f"--profile for {', '.join(unknown)}: no such real run in {db}")
    rows: list[ValidationRow] = []
    skipped: list[tuple[str, str]] = []
    series: dict[str, pl.DataFrame] = {}
    notes: dict[str, list[str]] = {}
    for run in runs or list(sources):
        if sources[run] == "lss-run":
            got = cluster_rows(db, run, samples=samples, seed=seed, profile_replays=profile_replays)
        elif run in profiles:
            got = bench_rows(
                db, run, profiles[run], samples=samples, seed=seed,
                profile_replays=profile_replays,
            )  # fmt: skip
        else:
            skipped.append((run, "no operator profile given (--profile RUN=PROFILE.json)"))
            continue
        if not got.rows:
            skipped.append((run, "no reference series or latency imported with it"))
            continue
        rows.extend(got.rows)
        series[run] = got.series
        notes[run] = got.notes
    return ValidationTable(rows, skipped, series, notes)
