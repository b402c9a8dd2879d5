"""The ingest benchmark writes what it claims (no timing is asserted)."""

from __future__ import annotations

from telemetry import open_reader
from telemetry.bench import ingest


def test_ingest_writes_every_row_once(db):
    times = ingest(db, total_rows=2_500, batch_rows=1_000)
    assert times.rows == 2_500
    r = open_reader(db)
    counts = r.sql(
        "SELECT (SELECT count(DISTINCT iter_id) FROM prefill_iterations) AS p, "
        "(SELECT count(*) FROM decode_iterations) AS d"
    ).to_dicts()[0]
    assert counts == {"p": 1_500, "d": 1_000}
    assert r.runs()["live"].to_list() == [False]
