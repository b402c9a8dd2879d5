"""`pdlab engine --model tiny-moe --port P`: one torch serving engine node (SPEC §9).

A real (random-weight) transformer behind SGLang's HTTP API, KV events and forward-pass
metrics (`cluster.engines.torch`); list such engines in a cluster file and `pdlab serve
--sglang FILE` drives them like SGLang engines. The process prints one line
`pdlab engine ready: {json endpoints}` once it serves, and stops cleanly (sockets closed,
exit 0) on SIGTERM, SIGHUP or Ctrl-C — and, with `--parent-pid`, when that process is gone
(`pdlab serve --engines torch` passes its own pid, so even a `kill -9` of the server leaves
no engine behind). torch is imported inside the command so `pdlab --help` stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import threading

import typer

from cluster.core import ConfigError


def engine_command(
    model: str = typer.Option("tiny-moe", "--model", help="tiny-moe, small-moe or small-dense."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(
        30000, "--port", min=0, max=65535, help="HTTP port (0 = any free port)."
    ),
    role: str = typer.Option("null", "--role", help="null (collocated), prefill or decode."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    threads: int = typer.Option(1, "--threads", help="torch threads on CPU."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per KV page (block)."),
    kv_gpu_tokens: int = typer.Option(16384, "--kv-gpu-tokens", help="Device KV capacity."),
    kv_host_tokens: int = typer.Option(
        65536, "--kv-host-tokens", help="Host KV capacity (0 = no host tier)."
    ),
    chunk_tokens: int = typer.Option(512, "--chunk-tokens", help="Prefill tokens per pass."),
    max_running: int = typer.Option(64, "--max-running", help="Running requests at most."),
    eviction: str = typer.Option("lru", "--eviction", help="lru or branch."),
    enable_pd_role_switch: bool = typer.Option(
        False, "--enable-pd-role-switch", help="Accept POST /pd_role_switch (keeps the cache)."
    ),
    bootstrap_port: int = typer.Option(
        0, "--bootstrap-port", min=0, max=65535, help="PD bootstrap server port."
    ),
    kv_events_endpoint: str | None = typer.Option(None, "--kv-events-endpoint"),
    kv_replay_endpoint: str | None = typer.Option(None, "--kv-replay-endpoint"),
    forward_metrics_endpoint: str | None = typer.Option(None, "--forward-metrics-endpoint"),
    parent_pid: int | None = typer.Option(
        None, "--parent-pid", help="Stop when this process is gone (the launcher's pid)."
    ),
) -> None:
    """Serve one torch engine (SGLang's HTTP API, KV events, forward-pass metrics)."""
    import zmq

    from cluster.engines.torch.config import EngineConfig, preset
    from cluster.engines.torch.engine import TorchEngine

    if role not in ("null", "prefill", "decode"):
        typer.echo(f"error: --role must be null, prefill or decode, got {role!r}", err=True)
        raise typer.Exit(2)
    try:
        cfg = EngineConfig(
            model=preset(model),
            seed=seed,
            page_size=page_size,
            gpu_pages=max(kv_gpu_tokens // page_size, 0),
            host_pages=max(kv_host_tokens // page_size, 0),
            chunk_tokens=chunk_tokens,
            max_running=max_running,
            eviction=eviction,
            device=device,
            dtype=dtype,
            num_threads=threads,
        )
        engine = TorchEngine(
            cfg,
            role,  # type: ignore[arg-type]
            host=host,
            port=port,
            kv_events_endpoint=kv_events_endpoint,
            kv_replay_endpoint=kv_replay_endpoint,
            forward_metrics_endpoint=forward_metrics_endpoint,
            bootstrap_port=bootstrap_port,
            enable_pd_role_switch=enable_pd_role_switch,
        )
    except (ConfigError, ValueError, RuntimeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        endpoints = engine.start()
    except (OSError, RuntimeError, zmq.ZMQError) as err:
        engine.stop()
        typer.echo(f"error: cannot serve on {host}:{port}: {err}", err=True)
        raise typer.Exit(2) from None
    print(f"pdlab engine ready: {json.dumps(endpoints._asdict())}", flush=True)
    try:
        while not stop.wait(0.1):
            if parent_pid is not None and os.getppid() != parent_pid:
                break  # the launcher is gone (this process was reparented)
    finally:
        engine.stop()
