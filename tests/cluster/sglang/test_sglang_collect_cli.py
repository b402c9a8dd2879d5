"""`pdlab collect kv-events` / `forward-metrics` against the SGLang stand-in, rows in DuckDB."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from cluster.engines.standin.server import StandinEngine
from telemetry import open_reader
from toolkit.cli import app


def _traffic(url: str, n: int, delay_s: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        for i in range(n):
            httpx.post(
                f"{url}/generate",
                timeout=10,
                json={"text": f"request {i} " * 12, "sampling_params": {"max_new_tokens": 3}},
            )

    t = threading.Thread(target=run)
    t.start()
    return t


def test_collect_kv_events_writes_every_event(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    with StandinEngine("null") as engine:
        ep = engine.endpoints
        assert ep is not None and ep.kv_events and ep.kv_replay
        # Two requests before the collector exists: only --catch-up (replay) can bring them.
        for i in range(2):
            httpx.post(
                f"{ep.http_url}/generate",
                timeout=10,
                json={"text": f"early {i} " * 12, "sampling_params": {"max_new_tokens": 2}},
            )
        t = _traffic(ep.http_url, 5, 0.5)
        result = CliRunner().invoke(
            app,
            [
                "collect",
                "kv-events",
                "--connect",
                ep.kv_events,
                "--replay",
                ep.kv_replay,
                "--db",
                str(db),
                "--node-id",
                "3",
                "--seconds",
                "2.0",
                "--run-id",
                "live-1",
                "--catch-up",
                "--json",
            ],
        )
        t.join()
        published = engine.kv_publisher.next_seq  # type: ignore[union-attr]
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == "live-1" and summary["messages"] == published == 7
    # The two early ones come only from the replay; on a loaded machine the collector may
    # subscribe after the first live requests too, and recovers those as well: none is lost.
    assert summary["messages_recovered"] >= 2 and summary["messages_lost"] == 0
    rows = open_reader(db).table("kv_events", run_id="live-1")
    assert rows.height == summary["rows"] > 0
    assert set(rows["node_id"].to_list()) == {3} and set(rows["kind"].to_list()) == {"stored"}
    runs = open_reader(db).runs()
    assert runs.filter(runs["run_id"] == "live-1")["source"].to_list() == ["sglang"]


def test_collect_forward_metrics_writes_iterations(tmp_path: Path) -> None:
    db = tmp_path / "fpm.duckdb"
    with StandinEngine("null") as engine:
        ep = engine.endpoints
        assert ep is not None and ep.forward_metrics  # found through /server_info (--server)
        t = _traffic(ep.http_url, 4, 0.5)
        result = CliRunner().invoke(
            app,
            [
                "collect",
                "forward-metrics",
                "--connect",
                ep.forward_metrics,
                "--db",
                str(db),
                "--seconds",
                "2.0",
                "--chunk-tokens",
                "8192",
                "--json",
            ],
        )
        t.join()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["prefill_iterations"] == 4 and summary["decode_iterations"] == 8
    reader = open_reader(db)
    prefill = reader.table("prefill_iterations")
    decode = reader.table("decode_iterations")
    assert prefill.height == 4 and decode.height == 8
    assert (prefill["duration_s"] > 0).all() and (decode["batch_size"] == 1).all()


def test_collect_rejects_bad_endpoints_and_node_ids(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "collect",
            "kv-events",
            "--connect",
            "localhost:5557",
            "--db",
            str(tmp_path / "x.duckdb"),
            "--seconds",
            "0",
        ],
    )
    assert r.exit_code == 2 and "tcp://HOST:PORT" in r.output
    r = runner.invoke(
        app,
        [
            "collect",
            "forward-metrics",
            "--connect",
            "tcp://127.0.0.1:1",
            "--db",
            str(tmp_path / "x.duckdb"),
            "--node-id",
            "-1",
        ],
    )
    assert r.exit_code == 2 and "--node-id" in r.output
    assert not (tmp_path / "x.duckdb").exists()
