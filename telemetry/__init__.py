"""Telemetry: the DuckDB schema of SPEC §3, batched writers, live-readable segments, readers."""

from telemetry.schema import SCHEMA_VERSION, TABLES

__all__ = ["SCHEMA_VERSION", "TABLES"]
