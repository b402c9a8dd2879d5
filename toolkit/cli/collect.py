"""`pdlab collect`: live engine telemetry (SGLang / vLLM over ZMQ) into DuckDB (SPEC §3, §6, §7).

`pdlab collect kv-events` subscribes to an engine's KV event publisher (SGLang's or vLLM's:
gap recovery through `--replay`, restarts, reconnects) and writes the `kv_events` table;
`pdlab collect forward-metrics` subscribes to SGLang's (or vLLM's native) forward-pass
metrics and writes `prefill_iterations` and `decode_iterations` (the logs `pdlab fit` fits
Eq. 1–2 on); `pdlab collect vllm-steps` subscribes to pdlab's vLLM stat-logger plugin
(`toolkit.vllm_plugin`) and writes those tables and `requests`. Both register the node,
show a status line (events/s, gaps recovered, losses) and stop cleanly on Ctrl-C, SIGTERM or
after `--seconds`, flushing everything received. `--db` is checked before anything is
subscribed (a file that is not a DuckDB database is a one-line error, exit code 2), and
every ZMQ message is limited to `--max-message-mb` (default 64).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live

from toolkit.cli.style import HELP_STYLE

collect_app = typer.Typer(
    help="Collect live engine telemetry (SGLang/vLLM ZMQ streams) into a DuckDB file.",
    no_args_is_help=True,
    **HELP_STYLE,
)


class _LockedSink:
    """Serializes the collector thread's emits with the main thread's flushes."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.lock = threading.Lock()
        self.errors = 0
        self.last_error: str | None = None

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        with self.lock:
            try:
                self.writer.emit(table, columns)
            except Exception as e:
                # A rejected batch is reported on the status line and at exit; the stream goes on.
                self.errors += 1
                self.last_error = str(e)
                raise

    def flush(self) -> None:
        with self.lock:
            self.writer.flush()


def _check_endpoint(value: str | None, option: str) -> None:
    if value is not None and not (value.startswith(("tcp://", "ipc://", "inproc://"))):
        raise typer.BadParameter(
            f"{value!r} is not a ZMQ endpoint; use tcp://HOST:PORT or ipc://PATH", param_hint=option
        )


def _discover(server: str, node_id: int) -> Any:
    from cluster.core import ConfigError
    from cluster.live.cluster_file import discover_engine

    try:
        return discover_engine(server, max(node_id, 0))
    except ConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--server") from None


def _open_writer(
    db: Path,
    run_id: str | None,
    node_id: int,
    node_name: str | None,
    hardware: str,
    config: dict[str, Any],
    run_start_wall: float,
    source: str = "sglang",
    num_nodes: int = 1,
) -> Any:
    from telemetry import TelemetryError, TelemetryWriter
    from telemetry.database import check_database

    if node_id < 0:
        raise typer.BadParameter(f"must be >= 0, got {node_id}", param_hint="--node-id")
    try:
        check_database(db)
        writer = TelemetryWriter(
            db,
            run_id=run_id,
            source=source,
            config=config,
            started_at=datetime.fromtimestamp(run_start_wall, UTC),
        )
        ids = list(range(node_id, node_id + num_nodes))
        names = [node_name or f"node-{n}" for n in ids]
        if num_nodes > 1:
            names = [f"{name}-dp{i}" for i, name in enumerate(names)]
        writer.add_nodes(
            {
                "node_id": ids,
                "name": names,
                "hardware": [hardware] * num_nodes,
                "moe_top_k": [0] * num_nodes,
                "moe_experts": [0] * num_nodes,
            }
        )
    except TelemetryError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    return writer


def _run(
    what: str,
    collector: Any,
    sink: _LockedSink,
    seconds: float | None,
    status: Callable[[float], str],
    summary: Callable[[], dict[str, Any]],
    as_json: bool,
) -> None:
    """Run until --seconds or a signal; flush periodically; close the writer; print a summary."""
    console = Console(stderr=True)
    stop = threading.Event()
    # Explicit handlers: SIGINT may arrive ignored (a background job of a script).
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    t0 = time.monotonic()
    collector.start()
    try:
        with Live(status(0.0), console=console, refresh_per_second=4, transient=True) as live:
            last_flush = t0
            while not stop.is_set():
                now = time.monotonic()
                if seconds is not None and now - t0 >= seconds:
                    break
                if now - last_flush >= 1.0:
                    sink.flush()
                    last_flush = now
                live.update(status(now - t0))
                stop.wait(0.1 if seconds is None else min(0.1, max(0.0, seconds - (now - t0))))
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        collector.stop()
        with sink.lock:
            sink.writer.close()
    out = {
        "command": what,
        "run_id": sink.writer.run_id,
        "seconds": round(time.monotonic() - t0, 3),
    }
    out |= summary()
    out["rejected_batches"] = sink.errors
    if sink.last_error:
        out["last_error"] = sink.last_error
    if as_json:
        typer.echo(json.dumps(out))
    else:
        console.print(status(time.monotonic() - t0))
        console.print(f"wrote run {out['run_id']} to {sink.writer.db_path}")


@collect_app.command("kv-events")
def kv_events(
    connect: str | None = typer.Option(
        None, "--connect", help="engine KV event PUB endpoint, tcp://HOST:PORT"
    ),
    server: str | None = typer.Option(
        None, "--server", help="engine HTTP URL: read the endpoints from its /server_info"
    ),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry file (created if missing)"),
    node_id: int = typer.Option(0, "--node-id", help="node id of this engine in the run"),
    seconds: float | None = typer.Option(None, "--seconds", min=0.0, help="stop after S seconds"),
    run_id: str | None = typer.Option(
        None, "--run-id", help="id of the new run (default: generated)"
    ),
    replay: str | None = typer.Option(None, "--replay", help="engine replay ROUTER endpoint"),
    topic: str = typer.Option("", "--topic", help="ZMQ topic filter (SGLang default: empty)"),
    catch_up: bool = typer.Option(False, "--catch-up", help="replay the publisher's buffer first"),
    node_name: str | None = typer.Option(
        None, "--node-name", help="Name of the node in the nodes table (default: node-<id>)"
    ),
    hardware: str = typer.Option(
        "unknown", "--hardware", help="The node's hardware, as the nodes table records it"
    ),
    max_message_mb: float = typer.Option(
        64.0, "--max-message-mb", min=0.001, help="largest ZMQ message accepted (MiB)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary on exit"),
) -> None:
    """Subscribe to one engine's KV events and write them to the kv_events table."""
    from cluster.wire.kv_collector import KVEventCollector

    if server is not None:
        spec = _discover(server, node_id)
        connect = connect or spec.kv_events
        replay = replay or spec.kv_replay
        topic = topic or spec.kv_topic
    if connect is None:
        raise typer.BadParameter(
            "give the publisher endpoint, or --server URL of an engine that advertises it",
            param_hint="--connect",
        )
    _check_endpoint(connect, "--connect")
    _check_endpoint(replay, "--replay")
    start = time.time()
    config = {"collect": "kv-events", "connect": connect, "replay": replay, "topic": topic}
    writer = _open_writer(db, run_id, node_id, node_name, hardware, config, start)
    sink = _LockedSink(writer)
    col = KVEventCollector(
        connect,
        node_id=node_id,
        topic=topic,
        replay_endpoint=replay,
        sink=sink,
        run_start_wall=start,
        catch_up=catch_up,
        max_message_bytes=int(max_message_mb * (1 << 20)),
    )

    def status(elapsed: float) -> str:
        s = col.stats
        rate = col.num_events / elapsed if elapsed > 0 else 0.0
        return (
            f"[bold]kv-events[/] node {node_id} | {col.num_events} events ({rate:,.0f}/s) | "
            f"{s.messages} batches | gaps {s.gaps} recovered {s.gaps_recovered} | "
            f"lost {s.messages_lost} | restarts {s.restarts} | malformed {s.malformed} | "
            f"skipped {col.num_skipped} | rejected rows {col.num_rows_rejected}"
        )

    def summary() -> dict[str, Any]:
        counts = {
            "events": col.num_events,
            "rows": col.num_rows,
            "rows_rejected": col.num_rows_rejected,
            "skipped_events": col.num_skipped,
            "bad_timestamps": col.decoder.num_bad_ts,
        }
        return counts | col.stats.as_dict()

    _run("kv-events", col, sink, seconds, status, summary, as_json)


@collect_app.command("forward-metrics")
def forward_metrics(
    connect: str | None = typer.Option(
        None, "--connect", help="SGLang forward-pass metrics PUB endpoint (ipc:// or tcp://)"
    ),
    server: str | None = typer.Option(
        None, "--server", help="engine HTTP URL: read the endpoint from its /server_info"
    ),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry file (created if missing)"),
    node_id: int = typer.Option(0, "--node-id", help="node id of this engine in the run"),
    seconds: float | None = typer.Option(None, "--seconds", min=0.0, help="stop after S seconds"),
    run_id: str | None = typer.Option(
        None, "--run-id", help="id of the new run (default: generated)"
    ),
    node_name: str | None = typer.Option(
        None, "--node-name", help="Name of the node in the nodes table (default: node-<id>)"
    ),
    hardware: str = typer.Option(
        "unknown", "--hardware", help="The node's hardware, as the nodes table records it"
    ),
    chunk_tokens: int | None = typer.Option(
        None, "--chunk-tokens", min=1, help="engine chunked_prefill_size (sharpens the ΣA estimate)"
    ),
    max_message_mb: float = typer.Option(
        64.0, "--max-message-mb", min=0.001, help="largest ZMQ message accepted (MiB)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary on exit"),
) -> None:
    """Subscribe to SGLang forward-pass metrics; write prefill/decode iteration rows."""
    from cluster.sglang.fpm_collector import ForwardMetricsCollector

    if server is not None:
        connect = connect or _discover(server, node_id).forward_metrics
    if connect is None:
        raise typer.BadParameter(
            "give the metrics endpoint, or --server URL of an engine started with "
            "--enable-forward-pass-metrics",
            param_hint="--connect",
        )
    _check_endpoint(connect, "--connect")
    start = time.time()
    config = {"collect": "forward-metrics", "connect": connect, "chunk_tokens": chunk_tokens}
    writer = _open_writer(db, run_id, node_id, node_name, hardware, config, start)
    sink = _LockedSink(writer)
    col = ForwardMetricsCollector(
        connect,
        node_id=node_id,
        sink=sink,
        run_start_wall=start,
        chunk_tokens=chunk_tokens,
        max_message_bytes=int(max_message_mb * (1 << 20)),
    )

    def status(elapsed: float) -> str:
        s = col.stats
        n = col.num_prefill_rows + col.num_decode_rows
        rate = n / elapsed if elapsed > 0 else 0.0
        return (
            f"[bold]forward-metrics[/] node {node_id} | {col.num_prefill_rows} prefill + "
            f"{col.num_decode_rows} decode iterations ({rate:,.0f}/s) | heartbeats "
            f"{col.num_heartbeats} | lost {s.messages_lost} | restarts {s.restarts} | "
            f"malformed {s.malformed} | rejected rows {col.num_rows_rejected}"
        )

    def summary() -> dict[str, Any]:
        return {
            "prefill_iterations": col.num_prefill_rows,
            "decode_iterations": col.num_decode_rows,
            "rows_rejected": col.num_rows_rejected,
            "heartbeats": col.num_heartbeats,
        } | col.stats.as_dict()

    _run("forward-metrics", col, sink, seconds, status, summary, as_json)


@collect_app.command("vllm-steps")
def vllm_steps(
    connect: str = typer.Option(
        ..., "--connect", help="the plugin's PUB endpoint ($PDLAB_VLLM_STEPS), tcp://HOST:PORT"
    ),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry file (created if missing)"),
    node_id: int = typer.Option(0, "--node-id", help="node id of DP rank 0 (rank r: id + r)"),
    dp_size: int = typer.Option(1, "--dp-size", min=1, help="DP ranks the server runs"),
    seconds: float | None = typer.Option(None, "--seconds", min=0.0, help="stop after S seconds"),
    run_id: str | None = typer.Option(
        None, "--run-id", help="id of the new run (default: generated)"
    ),
    replay: str | None = typer.Option(
        None, "--replay", help="the plugin's replay endpoint ($PDLAB_VLLM_STEPS_REPLAY)"
    ),
    catch_up: bool = typer.Option(False, "--catch-up", help="replay the publisher's buffer first"),
    node_name: str | None = typer.Option(
        None, "--node-name", help="Name of the node in the nodes table (default: node-<id>)"
    ),
    hardware: str = typer.Option(
        "unknown", "--hardware", help="The node's hardware, as the nodes table records it"
    ),
    max_message_mb: float = typer.Option(
        64.0, "--max-message-mb", min=0.001, help="largest ZMQ message accepted (MiB)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary on exit"),
) -> None:
    """Subscribe to pdlab's vLLM stat-logger plugin; write iteration and request rows."""
    from cluster.wire.vllm_step_collector import StepEmitter, VLLMStepCollector

    _check_endpoint(connect, "--connect")
    _check_endpoint(replay, "--replay")
    start = time.time()
    config = {"collect": "vllm-steps", "connect": connect, "replay": replay, "dp_size": dp_size}
    writer = _open_writer(
        db, run_id, node_id, node_name, hardware, config, start, "vllm", num_nodes=dp_size
    )
    sink = _LockedSink(writer)
    emitter = StepEmitter(start, sink, node_of={r: node_id + r for r in range(dp_size)})
    col = VLLMStepCollector(
        connect,
        emitter,
        replay_endpoint=replay,
        catch_up=catch_up,
        max_message_bytes=int(max_message_mb * (1 << 20)),
    )

    def status(elapsed: float) -> str:
        s, n = col.stats, emitter.num_rows
        return (
            f"[bold]vllm-steps[/] {emitter.num_steps} steps | {n['prefill_iterations']} prefill "
            f"+ {n['decode_iterations']} decode iterations | {n['requests']} requests | "
            f"untimed {emitter.mapper.untimed} | lost {s.messages_lost} | restarts "
            f"{s.restarts} | malformed {s.malformed} | rejected rows {emitter.num_rows_rejected}"
        )

    def summary() -> dict[str, Any]:
        return {
            "steps": emitter.num_steps,
            **emitter.num_rows,
            "untimed_steps": emitter.mapper.untimed,
            "duration_sources": dict(emitter.mapper.by_source),
            "rows_rejected": emitter.num_rows_rejected,
        } | col.stats.as_dict()

    _run("vllm-steps", col, sink, seconds, status, summary, as_json)
