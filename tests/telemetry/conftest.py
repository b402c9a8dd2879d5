"""Shared fixtures: valid rows for any SPEC §3 table, derived from the schema itself."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from telemetry.schema import TABLES, Column

NODE_IDS = (0, 1, 2)
RowsFn = Callable[..., dict[str, list[Any]]]


def node_rows(ids: tuple[int, ...] = NODE_IDS) -> list[dict[str, Any]]:
    return [
        {"node_id": i, "name": f"node-{i}", "hardware": "H200", "moe_top_k": 8, "moe_experts": 256}
        for i in ids
    ]


def _value(col: Column, i: int, rng: np.random.Generator, node_ids: tuple[int, ...]) -> Any:
    if col.nullable and i % 4 == 3:
        return None
    if col.allowed is not None:
        return col.allowed[int(rng.integers(len(col.allowed)))]
    if col.node_ref:
        return node_ids[int(rng.integers(len(node_ids)))]
    low = 1 if col.positive else 0
    match col.sql:
        case "VARCHAR":
            return f"{col.name}-{int(rng.integers(1000))}"
        case "JSON":
            return '{"k": 1}'
        case "INTEGER":
            return int(rng.integers(low, 2**31 - 1))
        case "BIGINT":
            signed = not (col.nonnegative or col.positive)
            return int(rng.integers(-(2**62) if signed else low, 2**62))
        case "DOUBLE":
            v = float(rng.uniform(1e-6, 1e6))
            return v if (col.nonnegative or col.positive or i % 2) else -v
        case "BOOLEAN":
            return bool(i % 2)
        case "TIMESTAMP":
            return datetime(2025, 1, 1) + timedelta(microseconds=int(rng.integers(10**12)))
        case "DOUBLE[]":
            return [float(x) for x in rng.normal(size=int(rng.integers(0, 5)))]
    raise AssertionError(col.sql)


def sample_rows(
    table: str, n: int, seed: int = 0, node_ids: tuple[int, ...] = NODE_IDS
) -> dict[str, list[Any]]:
    """`n` valid rows of `table` as columns (without run_id)."""
    rng = np.random.default_rng(seed)
    cols = [c for c in TABLES[table] if c.name != "run_id"]
    out = {c.name: [_value(c, i, rng, node_ids) for i in range(n)] for c in cols}
    if table == "nodes":
        out["node_id"] = list(range(n))
    return out


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "telemetry.duckdb"


@pytest.fixture(scope="session")
def rows() -> RowsFn:
    return sample_rows


@pytest.fixture(scope="session")
def nodes() -> Callable[..., list[dict[str, Any]]]:
    return node_rows
