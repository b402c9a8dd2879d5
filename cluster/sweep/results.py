"""Sweep rows in DuckDB and their aggregation over seeds (paper 003 §5.2).

One row per point and seed:

    sweep_results(sweep_id, point, seed, backend, params JSON, config JSON, workload,
                  retention, scheduling, dispatch, mean_jct_s, p50_jct_s, p99_jct_s,
                  programs_measured, preemptions, mean_ttft_s, p95_ttft_s, mean_tpot_s,
                  mean_queueing_s, mean_e2e_s, throughput_rps, kv_hit_rate, requests,
                  sim_seconds, wall_seconds, created_at, summary JSON)

Non-finite numbers are NULL. `aggregate` averages the seeds of each point and compares
mean JCT with a baseline point, paired by seed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import numpy as np

from cluster.hardware.profiles import HardwareProfile
from telemetry.database import connect

METRICS = (
    "mean_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "programs_measured",
    "preemptions",
    "mean_ttft_s",
    "p95_ttft_s",
    "mean_tpot_s",
    "mean_queueing_s",
    "mean_e2e_s",
    "throughput_rps",
    "kv_hit_rate",
    "requests",
    "sim_seconds",
)
_INT_METRICS = {"programs_measured", "preemptions", "requests"}
SWEEP_TABLE = "sweep_results"
_DDL = f"""CREATE TABLE IF NOT EXISTS {SWEEP_TABLE} (
  sweep_id VARCHAR NOT NULL, point INTEGER NOT NULL, seed BIGINT NOT NULL,
  backend VARCHAR NOT NULL, params JSON, config JSON, workload VARCHAR,
  retention VARCHAR, scheduling VARCHAR, dispatch VARCHAR,
  mean_jct_s DOUBLE, p50_jct_s DOUBLE, p99_jct_s DOUBLE, programs_measured BIGINT,
  preemptions BIGINT, mean_ttft_s DOUBLE, p95_ttft_s DOUBLE, mean_tpot_s DOUBLE,
  mean_queueing_s DOUBLE, mean_e2e_s DOUBLE, throughput_rps DOUBLE, kv_hit_rate DOUBLE,
  requests BIGINT, sim_seconds DOUBLE, wall_seconds DOUBLE, created_at TIMESTAMP,
  summary JSON
)"""


def finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def jsonable(v: Any) -> Any:
    if isinstance(v, HardwareProfile):
        return v.name
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def write_results(
    db_path: str | os.PathLike[str], rows: Iterable[dict[str, Any]], sweep_id: str | None = None
) -> str:
    """Append rows to `sweep_results` in DuckDB; returns the sweep id."""

    sid = sweep_id or f"sweep-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    now = datetime.now()
    records = []
    cols = ["sweep_id", "point", "seed", "backend", "params", "config", "workload", "retention",
            "scheduling", "dispatch", *[m for m in METRICS], "wall_seconds", "created_at", "summary"]  # fmt: skip
    for r in rows:
        rec = {**r, "sweep_id": sid, "created_at": now}
        for k in ("params", "config", "summary"):
            rec[k] = json.dumps(jsonable(r[k]), sort_keys=True)
        records.append([rec.get(c) for c in cols])
    con = connect(db_path)
    try:
        con.execute(_DDL)
        con.executemany(
            f"INSERT INTO {SWEEP_TABLE} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            records,
        )
    finally:
        con.close()
    return sid


def read_results(db_path: str | os.PathLike[str], sweep_id: str | None = None) -> Any:
    """The stored rows (a polars DataFrame), of one sweep or all."""

    con = connect(db_path, read_only=True)
    try:
        q = f"SELECT * FROM {SWEEP_TABLE}"
        if sweep_id is None:
            return con.sql(q + " ORDER BY sweep_id, point, seed").pl()
        return con.sql(q + " WHERE sweep_id = ? ORDER BY point, seed", params=[sweep_id]).pl()
    finally:
        con.close()


def aggregate(rows: list[dict[str, Any]], baseline: int = 0) -> list[dict[str, Any]]:
    """Mean over seeds per point, with the change in mean JCT against point `baseline`."""
    by_point: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    out = []
    for point in sorted(by_point):
        rs = by_point[point]
        agg: dict[str, Any] = {"point": point, "params": rs[0]["params"], "seeds": len(rs)}
        for m in ("mean_jct_s", "p99_jct_s", "preemptions", "mean_queueing_s", "kv_hit_rate"):
            vals = [r[m] for r in rs if r.get(m) is not None]
            agg[m] = float(np.mean(vals)) if vals else None
        jcts = [r["mean_jct_s"] for r in rs if r.get("mean_jct_s") is not None]
        agg["jct_sem_s"] = (
            float(np.std(jcts, ddof=1) / math.sqrt(len(jcts))) if len(jcts) > 1 else None
        )
        out.append(agg)
    base = next((a for a in out if a["point"] == baseline), None)
    for a in out:
        ok = base is not None and base["mean_jct_s"] and a["mean_jct_s"] is not None
        a["delta_jct"] = a["mean_jct_s"] / base["mean_jct_s"] - 1.0 if ok else None  # type: ignore[index]
        # Paired by seed: the same programs and arrivals under both policies.
        a["delta_jct_paired_sem"] = _paired_sem(by_point[a["point"]], by_point.get(baseline, []))
    return out


def _paired_sem(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> float | None:
    ref = {r["seed"]: r["mean_jct_s"] for r in base if r.get("mean_jct_s")}
    d = [
        r["mean_jct_s"] / ref[r["seed"]] - 1.0
        for r in rows
        if r["seed"] in ref and r.get("mean_jct_s")
    ]
    return float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None
