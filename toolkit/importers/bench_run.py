"""One imported serving run, and writing runs into the SPEC §3 tables in one transaction.

An importer turns a benchmark's files into `BenchRun`s: the `runs` row (its `config` JSON
carries the engine settings, cluster.hardware.engine.EngineSettings, under "engine"), one
`nodes` row per engine (DP rank) and the `requests` rows. `write_runs` validates every
batch at the boundary first, then inserts all runs in one transaction: an import that
fails (a bad row, a run id the database already has, a lock) leaves the database as it was.

Request times are seconds since the run's first arrival on the clock the engine measured
them with (telemetry contract); TTFT = t_first_token - t_arrival, E2E = t_done - t_arrival,
TPOT = (t_done - t_first_token) / (t_out - 1), as toolkit.queries.serving computes them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from telemetry import TelemetryError, live, store
from telemetry.catalog import delete_run_rows
from telemetry.validate import check_new_nodes, validate_batch

REQUEST_COLUMNS = (
    "request_id",
    "program_id",
    "branch_id",
    "t_arrival",
    "prefill_node",
    "decode_node",
    "t_in",
    "t_c",
    "t_fetch",
    "t_out",
    "t_prefill_start",
    "t_first_token",
    "t_done",
    "t_sent",
)


@dataclass(slots=True)
class BenchRun:
    """What one import writes: the runs row, nodes rows and requests rows of one run."""

    run_id: str
    started_at: datetime
    source: str
    config: dict[str, Any]
    node_names: list[str]
    hardware: str
    moe_top_k: int = 0
    moe_experts: int = 0
    requests: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in REQUEST_COLUMNS})
    # rows of further tables (columns by name), e.g. reference_series of an imported run
    extra: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def add_request(self, **row: Any) -> None:
        for c in REQUEST_COLUMNS:
            self.requests[c].append(row.get(c))

    @property
    def num_requests(self) -> int:
        return len(self.requests["request_id"])

    def batches(self) -> dict[str, Any]:
        """Validated Arrow batches of runs, nodes and requests (TelemetryError if invalid)."""
        runs = validate_batch(
            "runs",
            {
                "started_at": [self.started_at],
                "source": [self.source],
                "config": [json.dumps(_json_safe(self.config), sort_keys=True, allow_nan=False)],
            },
            self.run_id,
        )
        n = len(self.node_names)
        nodes = validate_batch(
            "nodes",
            {
                "node_id": list(range(n)),
                "name": self.node_names,
                "hardware": [self.hardware] * n,
                "moe_top_k": [self.moe_top_k] * n,
                "moe_experts": [self.moe_experts] * n,
            },
            self.run_id,
        )
        check_new_nodes(nodes, ())
        requests = validate_batch("requests", self.requests, self.run_id, set(range(n)))
        out = {"runs": runs, "nodes": nodes, "requests": requests}
        for table, cols in self.extra.items():
            out[table] = validate_batch(table, cols, self.run_id, set(range(n)))
        return out


def write_runs(
    db_path: str | Path, runs: Sequence[BenchRun], *, replace: bool = False
) -> list[str]:
    """Insert the runs in one transaction; returns their ids. Nothing is written on error.

    With `replace`, a run id the database already has is deleted first, in the same
    transaction (telemetry.catalog.delete_run_rows: every table's rows of that run), so a
    failed import still leaves the old run in place.
    """
    ids = [r.run_id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TelemetryError(f"run id(s) {', '.join(dup)} given twice in one import")
    for r in runs:
        live.check_run_id(r.run_id)
    batches = [r.batches() for r in runs]
    db = Path(db_path)
    with store.transaction(db, what=f"import run(s) {', '.join(ids)}") as con:
        for rid in ids:
            if live.run_dir(db, rid).exists():
                raise TelemetryError(
                    f"run {rid!r} is a live run in {db} (its segments are still being "
                    "written or were never recovered: `pdlab recover`); import under another id"
                )
            if store.run_exists(con, db, rid) or _has_rows(con, rid):
                if not replace:
                    raise TelemetryError(
                        f"run {rid!r} already exists in {db}; import it under another id "
                        "(--run-id) or replace it (--replace)"
                    )
                delete_run_rows(con, rid)
        for b in batches:
            for table, rows in b.items():
                if rows.num_rows:
                    store.insert(con, table, rows)
    return ids


def _has_rows(con: Any, run_id: str) -> bool:
    """Whether any table holds rows of `run_id` (a run without a runs row counts)."""
    existing = store.table_columns(con)
    return any(
        con.execute(f"SELECT 1 FROM {t} WHERE run_id = ? LIMIT 1", [run_id]).fetchall()
        for t in ("requests", "nodes")
        if t in existing
    )


def _json_safe(value: Any) -> Any:
    """JSON has no infinity or NaN: write them as strings ("inf", "nan")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
