"""A sink that declares it keeps nothing (`discards_rows`, NullSink) gets no rows built, one
that names the tables it reads (`reads_tables`) gets only those, and the run's answers do not
depend on it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.core import MemorySink, NullSink, tee
from cluster.sim.buffer import BufferedSink
from cluster.sim.simulator import SimConfig, Simulator

VOLATILE = {"wall_seconds", "speedup", "run_id"}


def _stable(summary: dict[str, Any]) -> str:
    """The summary without wall-clock figures, as text (NaN compares equal to itself)."""
    return json.dumps({k: v for k, v in summary.items() if k not in VOLATILE}, sort_keys=True)


class CountingNullSink(NullSink):
    """A NullSink that counts what reaches it (nothing should)."""

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        self.calls += 1


def test_a_discarding_sink_is_handed_nothing_and_wants_no_table():
    sink = CountingNullSink()
    buf = BufferedSink(sink, batch_rows=1)
    assert buf.discards and not buf.wants("decode_iterations")
    buf.emit("decode_iterations", {"node_id": [0, 1], "iter_id": [0, 1]})
    buf.row("prefill_iterations", node_id=0, iter_id=0)
    buf.flush()
    assert sink.calls == 0 and buf.rows_emitted == {}


def test_a_keeping_sink_gets_every_table_it_does_not_skip():
    sink = MemorySink()
    buf = BufferedSink(sink, skip=frozenset({"kv_events"}))
    assert not buf.discards
    assert buf.wants("decode_iterations") and not buf.wants("kv_events")
    buf.emit("decode_iterations", {"node_id": [0, 1], "iter_id": [0, 1]})
    buf.emit("kv_events", {"t": [0.0]})
    buf.row("prefill_iterations", node_id=3, iter_id=7)
    buf.flush()
    assert sink.tables["decode_iterations"] == {"node_id": [0, 1], "iter_id": [0, 1]}
    assert sink.tables["prefill_iterations"] == {"node_id": [3], "iter_id": [7]}
    assert "kv_events" not in sink.tables


class RequestsOnly(MemorySink):
    """A sink that reads one table (as a server's metrics without a database)."""

    reads_tables = frozenset({"requests"})


def test_a_sink_naming_its_tables_gets_only_those_and_a_tee_gets_their_union():
    sink = RequestsOnly()
    buf = BufferedSink(sink)
    assert buf.wants("requests") and not buf.wants("kv_events")
    buf.emit("kv_events", {"t": [0.0]})
    buf.row("decode_iterations", node_id=3, iter_id=7)
    buf.row("requests", request_id="r")
    buf.flush()
    assert set(sink.tables) == {"requests"}
    assert "kv_events" in buf.skip and "decode_iterations" in buf.skip
    # Teed with a sink that reads everything (a database), every table is built again.
    both = tee(RequestsOnly(), MemorySink())
    assert both is not None and BufferedSink(both).wants("kv_events")
    narrow = tee(RequestsOnly(), None)
    assert isinstance(narrow, RequestsOnly) and tee(None, None) is None


def test_the_summary_is_the_same_whether_or_not_rows_are_built():
    cfg = SimConfig(
        workload="cc",
        nodes=4,
        split="2P2D",
        agents=8,
        duration_s=300,
        warmup_s=40,
        planner="static",
        telemetry="full",
        l2_tokens=200_000,  # small host memory: evictions are logged too
        seed=9,
    )
    kept = MemorySink()
    full = Simulator(cfg, sink=kept).run()
    dropped = Simulator(cfg, sink=NullSink()).run()
    assert _stable(full) == _stable(dropped)
    # the kept run built the rows the dropped one skipped
    for table in ("decode_iterations", "prefill_iterations", "kv_events", "evictions"):
        assert kept.tables.get(table), table
