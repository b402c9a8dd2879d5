"""Digests of a run's telemetry tables: a row count and a SHA-256 of the rows in
insertion order per table (the run id left out), so two runs of one configuration on two
versions of the code compare table by table (the speed work's "same answers" check;
`scripts/telemetry_digest.py` prints them).
"""

from __future__ import annotations

import hashlib

import duckdb

SKIP_TABLES = {"runs", "pdlab_meta", "pdlab_live_finalized", "pdlab_run_status"}


def table_digests(db: str, run_id: str | None = None) -> dict[str, tuple[int, str]]:
    con = duckdb.connect(db, read_only=True)
    try:
        if run_id is None:
            run_id = con.execute("select run_id from runs order by started_at desc").fetchone()[0]
        tables = [
            t
            for (t,) in con.execute(
                "select table_name from information_schema.tables"
                " where table_schema='main' and table_type='BASE TABLE' order by table_name"
            ).fetchall()
            if t not in SKIP_TABLES
        ]
        out: dict[str, tuple[int, str]] = {}
        for t in tables:
            cols = [
                c
                for (c,) in con.execute(
                    "select column_name from information_schema.columns"
                    " where table_name = ? order by ordinal_position",
                    [t],
                ).fetchall()
            ]
            if "run_id" not in cols:
                continue
            keep = [c for c in cols if c != "run_id"]
            sel = ", ".join(f'"{c}"' for c in keep)
            h = hashlib.sha256()
            n = 0
            cur = con.execute(f"select {sel} from {t} where run_id = ? order by rowid", [run_id])
            while True:
                rows = cur.fetchmany(100_000)
                if not rows:
                    break
                n += len(rows)
                for r in rows:
                    h.update(repr(r).encode())
            out[t] = (n, h.hexdigest()[:16])
        return out
    finally:
        con.close()
