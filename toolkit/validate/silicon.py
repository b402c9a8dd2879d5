"""`pdlab validate silicon [CSV]`: pdlab's twin and AIConfigurator's estimator on real deployments.

Every row of AIConfigurator's `silicon_sample.csv` (or a CSV of the same columns) is
replayed on the twin (`silicon_twin.SiliconTwin`: profiles composed from the kernel
tables, the benchmark's closed loop on the engine model) and, in the same run, estimated
by AIConfigurator's own `cli_estimate` (`silicon_aic`), then compared with the measured
mean TTFT and TPOT. Nothing is fitted to a row or a partition: the replay sees only the
kernel tables, the model config, the backends' documented defaults and the benchmark
protocol (`closed_loop.INFERENCEX`).

`summarize` gives the `--json` object: `all` and each partition (system/backend/mode/
family) with its row count and both tools' MAPE (fractions) for TTFT and TPOT over the rows
both predicted, `unsupported` (reason -> rows pdlab does not replay), `rows_total`, and
coverage, and `assumptions` (what the replay assumed beyond the tables: `cpu_overhead`, CPU
per iteration outside the kernels, 0 unless asked, in multiples of vidur's A100 measurement
of vLLM's schedule + prepare_inputs, toolkit.twin.parameters). `store` writes a run (source 'validate-silicon') with one `silicon_validation`
row per CSV row (telemetry/schema.py).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cluster.core import ConfigError
from cluster.sim.engine_model.pricing import IterationOverhead
from toolkit.validate.silicon_rows import SiliconRow, load_rows
from toolkit.validate.silicon_twin import SiliconTwin, Unsupported

SOURCE = "validate-silicon"
FLOOR_SLACK = 0.5  # a row is flagged when its TPOT is under half its memory floor


@dataclass(frozen=True, slots=True)
class RowResult:
    row_id: str
    partition: str
    system: str
    backend: str
    mode: str
    family: str
    model: str
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    pdlab_ttft_ms: float | None = None
    pdlab_tpot_ms: float | None = None
    aic_ttft_ms: float | None = None
    aic_tpot_ms: float | None = None
    unsupported: str | None = None
    aic_error: str | None = None
    profile: str | None = None
    requests: int | None = None
    tpot_floor_ms: float | None = None  # the least TPOT the row's own numbers allow

    @property
    def consistent(self) -> bool:
        """False when the measured TPOT is under half the memory floor of its concurrency."""
        return self.tpot_floor_ms is None or self.tpot_ms >= FLOOR_SLACK * self.tpot_floor_ms

    @property
    def pdlab_ok(self) -> bool:
        return self.pdlab_ttft_ms is not None

    @property
    def aic_ok(self) -> bool:
        return self.aic_ttft_ms is not None


def default_csv() -> Path:
    """The installed aiconfigurator-core's silicon_sample.csv (AicMissing if absent)."""
    from cluster.hardware.aiconfigurator_db import package_systems_dir

    return package_systems_dir() / "silicon_sample.csv"


def default_model_dirs(systems_dir: Path | None) -> list[Path]:
    """AIConfigurator's shipped model configs (next to its systems/), if installed."""
    import importlib.util

    dirs = []
    if systems_dir is not None and (systems_dir.parent / "model_configs").is_dir():
        dirs.append(systems_dir.parent / "model_configs")
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is not None and spec.origin is not None:
        d = Path(spec.origin).parent / "model_configs"
        if d.is_dir() and d not in dirs:
            dirs.append(d)
    return dirs


def _base(row: SiliconRow) -> dict[str, Any]:
    return {
        "row_id": row.row_id, "partition": row.partition, "system": row.system,
        "backend": row.backend, "mode": row.mode, "family": row.family,
        "model": row.model_path, "isl": row.isl, "osl": row.osl,
        "concurrency": row.concurrency, "ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms,
    }  # fmt: skip


def validate_rows(
    rows: Sequence[SiliconRow],
    twin: SiliconTwin,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[RowResult]:
    """Replay every row, in the CSV's order; rows are grouped so profiles build once."""
    order = sorted(
        range(len(rows)), key=lambda i: (rows[i].system, rows[i].backend, rows[i].model_path)
    )
    out: list[RowResult | None] = [None] * len(rows)
    for n, i in enumerate(order):
        row = rows[i]
        rec = _base(row)
        try:
            r = twin.replay(row)
            rec.update(
                pdlab_ttft_ms=r.ttft_ms,
                pdlab_tpot_ms=r.tpot_ms,
                profile=r.profile,
                requests=r.requests,
                tpot_floor_ms=twin.tpot_floor_ms(row),
            )
        except Unsupported as exc:
            rec["unsupported"] = str(exc)
        out[i] = RowResult(**rec)
        if progress is not None:
            progress(n + 1, len(rows))
    return [r for r in out if r is not None]


def _mape(pred: Iterable[float], real: Iterable[float]) -> float | None:
    errs = [abs(p / r - 1.0) for p, r in zip(pred, real, strict=True) if r > 0]
    return sum(errs) / len(errs) if errs else None


def _scores(rs: list[RowResult], aic_on: bool) -> dict[str, Any]:
    both = [r for r in rs if r.pdlab_ok and (r.aic_ok or not aic_on)]
    out: dict[str, Any] = {
        "rows": len(both),
        "rows_pdlab": sum(r.pdlab_ok for r in rs),
        "rows_aiconfigurator": sum(r.aic_ok for r in rs),
        "pdlab": {
            "ttft_mape": _mape([r.pdlab_ttft_ms for r in both], [r.ttft_ms for r in both]),  # type: ignore[misc]
            "tpot_mape": _mape([r.pdlab_tpot_ms for r in both], [r.tpot_ms for r in both]),  # type: ignore[misc]
        },
        "aiconfigurator": None,
    }
    if aic_on:
        out["aiconfigurator"] = {
            "ttft_mape": _mape([r.aic_ttft_ms for r in both], [r.ttft_ms for r in both]),  # type: ignore[misc]
            "tpot_mape": _mape([r.aic_tpot_ms for r in both], [r.tpot_ms for r in both]),  # type: ignore[misc]
        }
    return out


def cpu_overhead_assumption(factor: float) -> dict[str, Any]:
    """The per-iteration CPU the replay adds, with its source (`factor` x vidur's)."""
    from toolkit.twin.parameters import CPU_PER_ITERATION_S, CPU_PER_SEQUENCE_S

    return {
        "factor": factor,
        "per_iteration_s": factor * CPU_PER_ITERATION_S,
        "per_sequence_s": factor * CPU_PER_SEQUENCE_S,
        "source": "assumed: x vidur's A100 measurement of vLLM's schedule + prepare_inputs "
        "per iteration (microsoft/vidur a100_cpu_overheads, commit e2d00e9; fit over batches "
        "8-128), the twin's cpu_overhead parameter; not fitted to this sample",
    }


def summarize(
    results: list[RowResult],
    *,
    aic_on: bool,
    runtime_s: float | None = None,
    cpu_overhead: float = 0.0,
) -> dict[str, Any]:
    """The `--json` object (module docstring)."""
    by: dict[str, list[RowResult]] = defaultdict(list)
    for r in results:
        if r.pdlab_ok:
            by[r.partition].append(r)
    disagg = [r for r in results if r.mode == "disagg"]
    ok = [r for r in results if r.pdlab_ok]
    doc: dict[str, Any] = {
        "all": _scores(ok, aic_on),
        "consistent": {
            **_scores([r for r in ok if r.consistent], aic_on),
            "flagged": sum(not r.consistent for r in ok),
        },
        "partitions": [{"partition": p, **_scores(rs, aic_on)} for p, rs in sorted(by.items())],
        "unsupported": dict(Counter(r.unsupported for r in results if r.unsupported).most_common()),
        "rows_total": len(results),
        "coverage": {
            "rows": sum(r.pdlab_ok for r in results),
            "share": sum(r.pdlab_ok for r in results) / max(len(results), 1),
            "disagg_rows": sum(r.pdlab_ok for r in disagg),
            "disagg_total": len(disagg),
            "disagg_share": sum(r.pdlab_ok for r in disagg) / max(len(disagg), 1),
        },
        "aiconfigurator_installed": aic_on,
        "assumptions": {"cpu_overhead": cpu_overhead_assumption(cpu_overhead)},
    }
    if aic_on:
        doc["aiconfigurator_errors"] = dict(
            Counter(r.aic_error.split(":")[0] for r in results if r.aic_error).most_common()
        )
    if runtime_s is not None:
        doc["runtime_s"] = runtime_s
    return doc


def _with_aic(r: RowResult, est: Any | None) -> RowResult:
    if est is None or not r.pdlab_ok:
        return r
    return replace(r, aic_ttft_ms=est.ttft_ms, aic_tpot_ms=est.tpot_ms, aic_error=est.error)


def validate_silicon(
    csv_path: str | Path | None = None,
    *,
    systems_dir: Path | None = None,
    model_dirs: Sequence[Path] = (),
    use_aic: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    cpu_overhead: float = 0.0,
) -> tuple[list[RowResult], dict[str, Any]]:
    """Load the CSV, replay every row and estimate it with AIConfigurator; (results, summary).

    AIConfigurator's estimator runs in a child process while the twin replays (it costs
    about as much, and the two share nothing), on the rows whose model pdlab composes.
    `progress(stage, done, total)` reports 'pdlab' rows replayed and 'aiconfigurator'
    rows estimated. `cpu_overhead` (>= 0) adds that many times vidur's per-iteration CPU
    (`cpu_overhead_assumption`) to every iteration the twin prices.
    """
    import tempfile

    from toolkit.validate import silicon_aic

    start = time.perf_counter()
    rows = load_rows(csv_path if csv_path is not None else default_csv())
    dirs = [*model_dirs, *default_model_dirs(systems_dir)]
    if not cpu_overhead >= 0.0:
        raise ConfigError(f"cpu_overhead must be a number >= 0, got {cpu_overhead!r}")
    cpu = cpu_overhead_assumption(cpu_overhead)
    overhead = IterationOverhead(cpu["per_iteration_s"], cpu["per_sequence_s"])
    twin = SiliconTwin(systems_dir, dirs, overhead=overhead)
    on = use_aic and silicon_aic.available()
    report = progress or (lambda _stage, _done, _total: None)
    ests: dict[int, Any] = {}
    if not on:
        results = validate_rows(rows, twin, progress=lambda n, t: report("pdlab", n, t))
    else:
        wanted = [i for i, r in enumerate(rows) if twin.composes(r)]
        with tempfile.TemporaryDirectory(prefix="pdlab-aic-") as tmp:
            proc, out = silicon_aic.start_worker([rows[i] for i in wanted], Path(tmp))
            try:
                results = validate_rows(rows, twin, progress=lambda n, t: report("pdlab", n, t))
                while proc.poll() is None:
                    report("aiconfigurator", len(silicon_aic.read_results(out)), len(wanted))
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            got = silicon_aic.read_results(out)
            if proc.returncode != 0 or len(got) != len(wanted):
                err = (proc.stderr.read() if proc.stderr else b"").decode()[-300:]
                raise RuntimeError(f"AIConfigurator's estimator process failed: {err}")
            report("aiconfigurator", len(got), len(wanted))
        ests = dict(zip(wanted, got, strict=True))
        results = [_with_aic(r, ests.get(i)) for i, r in enumerate(results)]
    runtime_s = time.perf_counter() - start
    return results, summarize(results, aic_on=on, runtime_s=runtime_s, cpu_overhead=cpu_overhead)


def store(db: str | Path, results: list[RowResult], summary: dict[str, Any], csv_path: str) -> str:
    """Write the run (source 'validate-silicon') and its `silicon_validation` rows; its id."""
    from telemetry.writer import TelemetryWriter

    config = {"csv": csv_path, "summary": {k: v for k, v in summary.items() if k != "partitions"}}
    cols: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        for k, v in asdict(r).items():
            cols[k].append(v)
    w = TelemetryWriter(db, source=SOURCE, config=config)
    try:
        w.append("silicon_validation", dict(cols))
    except BaseException as exc:
        w.abort(str(exc))
        raise
    w.close()
    return w.run_id
