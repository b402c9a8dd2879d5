"""One run of a telemetry database, read through one connection (SPEC §3 tables).

Every query function of `toolkit.queries` takes a `Run`: the reader connection opened by
`open_run` (so the database is attached once and the live Parquet segments of a run still
being written are read too) with the run resolved. Heavy tables are reduced in DuckDB before
anything reaches Python: time and size bins are GROUP BY queries, samples a deterministic
hash filter (`hash_sample`). A missing database or an unknown run raises `TelemetryError`
naming what exists. Nothing here draws: results are polars frames and plain values.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import duckdb
import polars as pl

from telemetry import TelemetryError, TelemetryReader, open_reader

Source = str | os.PathLike[str] | TelemetryReader
SAMPLE_MOD = 1_000_000  # resolution of hash sampling (fractions down to 1e-6)


class Run:
    """One run of one database, read through a single open reader connection.

    Queries take `?` parameters; `df()` returns polars. Derived run facts (config, warmup,
    end time, node names) are read once on first use.
    """

    def __init__(
        self, reader: TelemetryReader, con: duckdb.DuckDBPyConnection, run_id: str, label: str
    ) -> None:
        self.reader = reader
        self.con = con
        self.run_id = run_id
        self.label = label
        self._config: dict[str, Any] | None = None
        self._t_end: float | None = None

    def df(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        rel = self.con.sql(sql, params=list(params) or None)
        return pl.DataFrame() if rel is None else rel.pl()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, list(params)).fetchall()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self.con.execute(sql, list(params)).fetchall()
        return rows[0][0] if rows else None

    def count(self, table: str, where: str = "true") -> int:
        return int(
            self.scalar(
                f"SELECT count(*) FROM {table} WHERE run_id = ? AND ({where})", [self.run_id]
            )
        )

    def config(self) -> dict[str, Any]:
        """The run's config JSON (empty for runs logged without one)."""
        if self._config is None:
            raw = self.scalar("SELECT config FROM runs WHERE run_id = ? LIMIT 1", [self.run_id])
            try:
                parsed = json.loads(raw) if raw else {}
            except (TypeError, ValueError):
                parsed = {}
            self._config = parsed if isinstance(parsed, dict) else {}
        return self._config

    def warmup_s(self) -> float:
        value = self.config().get("warmup_s")
        return float(value) if isinstance(value, int | float) else 0.0

    def t_end(self) -> float:
        """The run's length: `duration_s` of its config, else its last logged time."""
        if self._t_end is None:
            value = self.config().get("duration_s")
            if isinstance(value, int | float) and value > 0:
                self._t_end = float(value)
            else:
                q = """
                    SELECT greatest(
                        (SELECT max(coalesce(t_done, t_first_token, t_arrival)) FROM requests
                         WHERE run_id = ?),
                        (SELECT max(t_start + duration_s) FROM prefill_iterations WHERE run_id = ?),
                        (SELECT max(t_start + duration_s) FROM decode_iterations WHERE run_id = ?),
                        (SELECT max(coalesce(t_done, t_decided)) FROM phase_switches
                         WHERE run_id = ?))
                """
                last = self.scalar(q, [self.run_id] * 4)
                self._t_end = float(last) if last is not None else 0.0
        return self._t_end

    def nodes(self) -> pl.DataFrame:
        """node_id, name, moe_top_k, moe_experts of the run's `nodes` rows, by node_id."""
        return self.df(
            "SELECT node_id, name, hardware, moe_top_k, moe_experts FROM nodes "
            "WHERE run_id = ? ORDER BY node_id",
            [self.run_id],
        )


def _resolve(con: duckdb.DuckDBPyConnection, run_id: str | None, label: str) -> str:
    runs = [
        r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY started_at, run_id").fetchall()
    ]
    if run_id is None:
        if len(runs) == 1:
            return str(runs[0])
        if not runs:
            raise TelemetryError(f"{label} holds no runs")
        raise TelemetryError(f"{label} holds {len(runs)} runs; choose one of: {', '.join(runs)}")
    if run_id in runs:
        return run_id
    # Logs written by external engines may lack a runs row; their iteration rows still count.
    for table in ("prefill_iterations", "decode_iterations", "requests"):
        if con.execute(f"SELECT 1 FROM {table} WHERE run_id = ? LIMIT 1", [run_id]).fetchall():
            return run_id
    raise TelemetryError(f"unknown run {run_id!r} in {label}; runs: {', '.join(runs) or 'none'}")


def as_reader(source: Source) -> TelemetryReader:
    """A telemetry reader of a path (which must exist) or the reader itself."""
    if isinstance(source, TelemetryReader):
        return source
    if isinstance(source, str | os.PathLike):
        return open_reader(source)
    raise TelemetryError(
        f"expected a database path or a telemetry reader, got {type(source).__name__}"
    )


@contextmanager
def open_run(source: Source, run_id: str | None = None) -> Iterator[Run]:
    """One reader connection with the run resolved; raises TelemetryError for a bad DB/run."""
    reader = as_reader(source)
    label = str(reader.db_path)
    with reader.connect() as con:
        yield Run(reader, con, _resolve(con, run_id, label), label)


def hash_sample(
    keys: str, per_group: dict[int, int], group_col: str, limit: int
) -> tuple[str, list[Any]]:
    """A WHERE fragment keeping about `limit` rows per group, chosen by a hash of `keys`.

    Deterministic (same rows on every call, unlike a reservoir sample under threads) and one
    cheap filter pass: group g keeps rows whose hash falls below limit/count_g of the range
    (with 20% headroom; callers cut the exact count with `row_number() <= limit`).
    """
    cases = []
    params: list[Any] = []
    for group, count in per_group.items():
        frac = min(1.0, 1.2 * limit / max(count, 1))
        cases.append(f"WHEN {group_col} = ? THEN ?")
        params += [group, math.ceil(frac * SAMPLE_MOD)]
    if not cases:
        return "false", []
    where = f"hash({keys}) % {SAMPLE_MOD} < CASE {' '.join(cases)} ELSE 0 END"
    return where, params


def time_bin_width(t_end: float, bins: int) -> float:
    """A round bin width (1, 2, 5 × 10^k seconds) giving about `bins` bins over [0, t_end]."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    raw = max(t_end, 1e-9) / bins
    exp = math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * 10**exp >= raw:
            return m * 10**exp
    return 10.0 ** (exp + 1)  # pragma: no cover


def switch_lines(run: Run) -> list[float]:
    """Completion times of the run's phase switches (drawn as dotted lines on time axes)."""
    rows = run.rows(
        "SELECT DISTINCT t_done FROM phase_switches WHERE run_id = ? AND t_done IS NOT NULL "
        "ORDER BY 1",
        [run.run_id],
    )
    return [float(r[0]) for r in rows]
