"""The telemetry run of a live SGLang cluster (SPEC §3, §6).

`open_run` opens the run (source `sglang`, or the launcher's) in DuckDB (the cluster file's settings without the API key,
the engines, their nodes rows) with `started_at` at the run's clock origin, so collectors,
proxy and control plane all write run seconds. `LockedSink` funnels many threads' rows into
the one (not thread-safe) writer; a rejected batch is logged and counted, never fatal.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster.live.cluster_file import ClusterConfig

log = logging.getLogger(__name__)


class LockedSink:
    """Serializes emits of many threads into one (not thread-safe) telemetry writer.

    A rejected batch is logged with the writer's message and counted (`errors`); it never
    fails a client request or stops a collector. Rows already accepted stay accepted.
    """

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.lock = threading.Lock()
        self.errors = 0
        self.last_error: str | None = None

    @property
    def run_id(self) -> str:
        return str(self.writer.run_id)

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        with self.lock:
            try:
                self.writer.emit(table, columns)
            except Exception as e:
                self.errors += 1
                self.last_error = f"{table}: {e}"
                log.error("telemetry batch for %s rejected: %s", table, e)

    def flush(self) -> None:
        with self.lock:
            self.writer.flush()

    def close(self) -> None:
        with self.lock:
            self.writer.close()

    def abort(self, reason: str) -> None:
        """End the run as failed with `reason` (the rows written so far are kept)."""
        with self.lock:
            self.writer.abort(reason)


def open_run(
    db_path: Path,
    config: ClusterConfig,
    block_tokens: int,
    run_id: str | None,
    started_wall: float,
    source: str = "sglang",
) -> LockedSink:
    """A new run (`source`: "sglang", "torch", ...) in `db_path` with the cluster's nodes."""
    from telemetry import TelemetryWriter

    s = config.settings
    config_json: dict[str, Any] = {
        "cluster": dataclasses.asdict(s) | {"block_tokens": block_tokens},
        "engines": [dataclasses.asdict(e) for e in config.engines],
        "cluster_file": config.source,
    }
    config_json["cluster"].pop("api_key", None)
    writer = TelemetryWriter(
        db_path,
        run_id=run_id,
        source=source,
        config=config_json,
        started_at=datetime.fromtimestamp(started_wall, UTC),
    )
    engines = sorted(config.engines, key=lambda e: e.node_id)
    ids = [e.node_id for e in engines]
    writer.add_nodes(
        {
            "node_id": ids,
            "name": [f"node-{e.node_id} {e.http_url}" for e in engines],
            "hardware": [s.hardware] * len(ids),
            "moe_top_k": [s.moe_top_k if s.moe_experts else 0] * len(ids),
            "moe_experts": [s.moe_experts] * len(ids),
        }
    )
    return LockedSink(writer)
