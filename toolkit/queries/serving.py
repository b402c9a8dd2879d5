"""Serving metrics of a run's requests: TTFT, TPOT, E2E and throughput (SPEC §9).

Per finished request (t_first_token and t_done logged): TTFT = t_first_token - t_arrival,
E2E = t_done - t_arrival, TPOT = (t_done - t_first_token) / (t_out - 1) for t_out > 1 (as
vLLM's and LLMServingSim's benchmarks define them). Statistics: mean and the 50th, 90th,
95th and 99th percentiles with linear interpolation between order statistics (DuckDB's
quantile_cont, numpy's default, the bench validation's). Throughput: finished requests and
output tokens per second between the first arrival and the last completion. The same
numbers are what `pdlab twin` calls "real" for an imported run.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from toolkit.queries.run import Run, Source, open_run

STATS = (("mean", None), ("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
METRICS = {
    "ttft": "t_first_token - t_arrival",
    "tpot": "(t_done - t_first_token) / (t_out - 1)",
    "e2e": "t_done - t_arrival",
}


class ServingMetrics(NamedTuple):
    """Seconds per metric and statistic, throughput, and the requests counted."""

    run_id: str
    requests: int
    unfinished: int
    stats: dict[str, dict[str, float | None]]  # metric -> stat -> seconds
    throughput_rps: float | None
    output_tokens_per_s: float | None
    duration_s: float | None

    def flat(self) -> dict[str, float | None]:
        """{"ttft_mean_s": ..., "tpot_p99_s": ..., "throughput_rps": ...}."""
        out: dict[str, float | None] = {
            f"{m}_{s}_s": v for m, per in self.stats.items() for s, v in per.items()
        }
        out["throughput_rps"] = self.throughput_rps
        out["output_tokens_per_s"] = self.output_tokens_per_s
        return out


def query(run: Run) -> ServingMetrics:
    done = "t_first_token IS NOT NULL AND t_done IS NOT NULL"
    stats: dict[str, dict[str, float | None]] = {}
    for metric, expr in METRICS.items():
        where = done + (" AND t_out > 1" if metric == "tpot" else "")
        cols = ", ".join(
            f"avg({expr})" if q is None else f"quantile_cont({expr}, {q})" for _, q in STATS
        )
        row = run.rows(f"SELECT {cols} FROM requests WHERE run_id = ? AND {where}", [run.run_id])[0]
        stats[metric] = {
            name: (None if v is None else float(v)) for (name, _), v in zip(STATS, row, strict=True)
        }
    n, unfinished, t0, t1, tokens = run.rows(
        f"SELECT count(*) FILTER ({done}), count(*) FILTER (NOT ({done})), min(t_arrival), "
        f"max(t_done), sum(t_out) FILTER ({done}) FROM requests WHERE run_id = ?",
        [run.run_id],
    )[0]
    span = None if t0 is None or t1 is None else float(t1 - t0)
    ok = span is not None and span > 0
    return ServingMetrics(
        run.run_id,
        int(n),
        int(unfinished),
        stats,
        n / span if ok and span else None,
        float(tokens) / span if ok and span and tokens is not None else None,
        span,
    )


def serving_metrics(source: Source, run_id: str | None = None) -> ServingMetrics:
    """The serving metrics of one run of a telemetry database."""
    with open_run(source, run_id) as run:
        return query(run)


def as_table(m: ServingMetrics) -> list[tuple[Any, ...]]:
    """Rows (metric, mean, p50, p90, p95, p99), times in milliseconds, for printing."""
    return [
        (name.upper(), *(None if v is None else 1000 * v for v in per.values()))
        for name, per in m.stats.items()
    ]
