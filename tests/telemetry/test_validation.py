"""Boundary validation (SPEC §3): precise errors, and a rejected batch changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from telemetry import TABLES, TelemetryError, TelemetryWriter, open_reader

Batch = dict[str, Any]


def setv(column: str, value: Any, row: int = 17) -> Callable[[Batch], Batch]:
    def mutate(b: Batch) -> Batch:
        b[column][row] = value
        return b

    return mutate


def replace(column: str, values: Callable[[list[Any]], Any]) -> Callable[[Batch], Batch]:
    def mutate(b: Batch) -> Batch:
        b[column] = values(b[column])
        return b

    return mutate


def drop(column: str) -> Callable[[Batch], Batch]:
    def mutate(b: Batch) -> Batch:
        del b[column]
        return b

    return mutate


def float_with(v: float) -> Callable[[list[Any]], Any]:
    def make(col: list[Any]) -> Any:
        arr = np.array(col, dtype=np.float64)
        arr[17] = v
        return arr

    return make


CASES = [
    (
        "prefill_iterations",
        setv("duration_s", -0.5),
        "prefill_iterations row 17, column duration_s: -0.5 is not > 0 (durations must be positive)",
    ),
    (
        "decode_iterations",
        setv("batch_size", 0),
        "decode_iterations row 17, column batch_size: 0 is not > 0 (batch_size must be positive)",
    ),
    (
        "prefill_iterations",
        setv("t_uc", -3),
        "prefill_iterations row 17, column t_uc: -3 is not >= 0 (t_uc must be nonnegative)",
    ),
    (
        "prefill_iterations",
        setv("attn_pairs", float("nan")),
        "prefill_iterations row 17, column attn_pairs: nan is not finite (NaN and ±inf are not allowed)",
    ),
    (
        "planner_windows",
        replace("mean_gain", float_with(-np.inf)),
        "planner_windows row 17, column mean_gain: -inf is not finite (NaN and ±inf are not allowed)",
    ),
    (
        "prefill_iterations",
        setv("num_reqs", None),
        "prefill_iterations row 17, column num_reqs: null is not allowed (num_reqs is required)",
    ),
    (
        "prefill_iterations",
        setv("t_uc", "12"),
        "prefill_iterations row 17, column t_uc: '12' of type str cannot be stored in a BIGINT "
        "column (allowed: 64-bit integers)",
    ),
    (
        "prefill_iterations",
        replace("num_reqs", float_with(1.5)),
        "prefill_iterations row 17, column num_reqs: 1.5 cannot be stored as INTEGER without loss "
        "(allowed: integers from -2147483648 to 2147483647)",
    ),
    (
        "prefill_iterations",
        replace("num_reqs", lambda c: np.array([*c[:17], 2**40, *c[18:]], dtype=np.int64)),
        "prefill_iterations row 17, column num_reqs: 1099511627776 cannot be stored as INTEGER "
        "without loss (allowed: integers from -2147483648 to 2147483647)",
    ),
    (
        "planner_windows",
        replace("slices", lambda c: pa.array([True] * len(c))),
        "planner_windows row 0, column slices: True of type bool cannot be stored in a INTEGER "
        "column (allowed: integers from -2147483648 to 2147483647)",
    ),
    (
        "router_decisions",
        replace("request_id", lambda c: pa.array(range(len(c)))),
        "router_decisions row 0, column request_id: 0 of type int64 cannot be stored in a VARCHAR "
        "column (allowed: strings)",
    ),
    (
        "kv_events",
        setv("tier", "ssd"),
        "kv_events row 17, column tier: 'ssd' is not allowed (allowed: gpu, host)",
    ),
    (
        "phase_switches",
        setv("trigger", "auto"),
        "phase_switches row 17, column trigger: 'auto' is not allowed (allowed: planner, manual)",
    ),
    (
        "evictions",
        setv("node_id", 9),
        "evictions row 17, column node_id: 9 is not allowed (nodes of run 'v': 0, 1, 2)",
    ),
    (
        "requests",
        setv("decode_node", 5),
        "requests row 17, column decode_node: 5 is not allowed (nodes of run 'v': 0, 1, 2)",
    ),
    (
        "branch_counts",
        lambda b: {**b, "run_id": ["v"] * 17 + ["other"] + ["v"] * 2},
        "branch_counts row 17, column run_id: 'other' is not this run ('v')",
    ),
    (
        "model_fits",
        setv("coef", [1.0, float("inf")]),
        "model_fits row 17, column coef: [1.0, inf] holds inf (allowed: lists of finite numbers)",
    ),
    (
        "branch_events",
        drop("version"),
        "branch_events, column version: missing column; required: t, branch_id, program_id, kind, "
        "version",
    ),
    (
        "branch_events",
        lambda b: {**b, "depth": [1] * 20},
        "branch_events, column depth: unexpected column; allowed columns: run_id, t, branch_id, "
        "program_id, kind, parent_id, version",
    ),
    (
        "branch_events",
        replace("t", lambda c: c[:5]),
        "branch_events: columns have different lengths: {'t': 5, 'branch_id': 20, "
        "'program_id': 20, 'kind': 20, 'parent_id': 20, 'version': 20}",
    ),
    (
        "kv_event",
        lambda b: b,
        "unknown telemetry table 'kv_event'; tables are: " + ", ".join(TABLES),
    ),
]


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory, rows, nodes) -> Iterator[TelemetryWriter]:
    # One writer for the module: every rejected batch must leave it exactly as it was.
    db = tmp_path_factory.mktemp("validation") / "v.duckdb"
    w = TelemetryWriter(db, run_id="v", flush_interval_s=3600)
    w.add_nodes(nodes())
    w.append("prefill_iterations", rows("prefill_iterations", 20))
    w.flush()
    w.append("decode_iterations", rows("decode_iterations", 5))
    yield w
    w.close()


def state(w: TelemetryWriter) -> tuple[dict[str, int], dict[str, int], list[str]]:
    with open_reader(w.db_path).connect() as con:
        counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES}
    buffered = {t: w.buffered_rows(t) for t in TABLES}
    files = sorted(str(p.relative_to(w.live_dir)) for p in w.live_dir.rglob("*"))
    return counts, buffered, files


@pytest.mark.parametrize(("table", "mutate", "message"), CASES, ids=[c[2][:48] for c in CASES])
def test_rejected_batch_names_table_row_column_and_changes_nothing(
    writer, rows, table, mutate, message
):
    before = state(writer)
    batch = mutate(rows(table if table in TABLES else "kv_events", 20))
    with pytest.raises(TelemetryError) as err:
        writer.append(table, batch)
    assert str(err.value) == message
    assert state(writer) == before
    if err.value.row is not None:
        assert err.value.table == table and f"row {err.value.row}" in message
        assert err.value.column is not None and f"column {err.value.column}" in message


def test_first_bad_row_is_reported_among_many(writer, rows):
    batch = rows("decode_iterations", 5000)
    batch["duration_s"][4321] = 0.0
    batch["duration_s"][4999] = -1.0
    with pytest.raises(TelemetryError, match=r"row 4321, column duration_s: 0\.0 is not > 0"):
        writer.append("decode_iterations", batch)
    big = np.arange(5000, dtype=np.int64)
    big[3000] = 2**33
    with pytest.raises(TelemetryError, match="row 3000, column batch_size: 8589934592 cannot"):
        writer.append("decode_iterations", {**rows("decode_iterations", 5000), "batch_size": big})


def test_nodes_are_validated_and_unique(db, nodes):
    with TelemetryWriter(db, run_id="n") as w:
        w.add_nodes(nodes())
        before = state(w)
        with pytest.raises(
            TelemetryError, match="nodes row 1, column node_id: 2 is already a node"
        ):
            w.add_nodes(nodes((7, 2)))
        with pytest.raises(TelemetryError, match="nodes row 0, column moe_top_k: -1 is not >= 0"):
            w.add_nodes([{**nodes((8,))[0], "moe_top_k": -1}])
        with pytest.raises(
            TelemetryError, match="nodes row 1, column node_id: 5 is already a node"
        ):
            w.append("nodes", nodes((5, 5)))
        assert state(w) == before
        w.add_nodes(nodes((7,)))
        w.append("evictions", {**_one_eviction(), "node_id": [7]})
    assert open_reader(db).nodes("n")["node_id"].to_list() == [0, 1, 2, 7]
    assert open_reader(db).table("evictions")["node_id"].to_list() == [7]


def _one_eviction() -> dict[str, list[Any]]:
    return {
        "t": [1.0],
        "tier": ["host"],
        "block_hash": [-5],
        "branch_count": [0],
        "last_access": [0.5],
        "policy": ["lru"],
    }


def test_no_nodes_registered_hint(db):
    with (
        TelemetryWriter(db, run_id="bare") as w,
        pytest.raises(
            TelemetryError,
            match=r"node_id: 0 is not allowed \(nodes of run 'bare': none registered",
        ),
    ):
        w.append("evictions", {**_one_eviction(), "node_id": [0]})


def test_unsupported_batch_type(writer):
    with pytest.raises(TelemetryError, match="unsupported batch type int"):
        writer.append("kv_events", 3)
    with pytest.raises(TelemetryError, match="kv_events row 1: a row must be a dict"):
        writer.append("kv_events", [{"t": 1.0}, 5])
    with pytest.raises(TelemetryError, match="column tier: expected a sequence of values, got str"):
        writer.append("kv_events", {"t": [1.0], "tier": "gpu"})
    with pytest.raises(TelemetryError, match="column t: expected a sequence of values, got float"):
        writer.append("kv_events", {"t": 1.0})
