"""`pdlab engine --model tiny-moe --port P`: one torch serving engine node (SPEC §9).

A real (random-weight) transformer behind SGLang's HTTP API, KV events and forward-pass
metrics (`cluster.engines.torch`); list such engines in a cluster file and `pdlab serve
--sglang FILE` drives them like SGLang engines. The process prints one line
`pdlab engine ready: {json endpoints}` once it serves, and stops cleanly (sockets closed,
exit 0) on SIGTERM, SIGHUP or Ctrl-C — and, with `--parent-pid`, when that process is gone
(`pdlab serve --engines torch` passes its own pid, so even a `kill -9` of the server leaves
no engine behind). torch is imported inside the command so `pdlab --help` stays fast.

The mutating routes (/flush_cache, /kv_eviction, /pd_role_switch) need
`Authorization: Bearer <token>`: `--token` or $PDLAB_ENGINE_TOKEN (what `pdlab serve
--engines torch` passes its engines), else a generated one, written to a file only the
user can read (its path printed at start, the file removed at exit). Request bodies are
at most `--max-body-bytes` (default 16 bytes per token of the model's context + 1 MiB).

`--dp N [--ep N]` serves the model from a group of N engine processes, one per DP rank,
behind one front end on `--port` with the same HTTP API (`cluster.engines.torch.dp_group`):
each rank schedules its own requests and KV; with `--ep N` the MoE experts are split over
the ranks, every MoE layer dispatches tokens to their experts' ranks and back (gloo on CPU,
NCCL on CUDA) and idle ranks run dummy passes so the ranks step together, as vLLM's DP+EP
engines do. The front end sends each request to the least loaded rank (vLLM's rule:
min 4·waiting + running). `--log-dir` keeps every rank's passes, MoE layer loads and
requests (JSON lines; `scripts/ep_group_run.py` stores them in DuckDB). The group's front
end takes the same door as one engine: the token (every rank holds it too), the body
limit, mutations POST and JSON only.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cluster.core import ConfigError

if TYPE_CHECKING:
    from cluster.engines.torch.dp_group import DPGroup
    from cluster.engines.torch.engine import TorchEngine

# --role -> the engine's role ("null" is SGLang's name for a collocated engine)
ROLES = {"collocated": "null", "null": "null", "prefill": "prefill", "decode": "decode"}


def engine_command(
    model: str = typer.Option("tiny-moe", "--model", help="tiny-moe, small-moe or small-dense."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Bind address of the HTTP API (loopback by default)."
    ),
    port: int = typer.Option(
        30000, "--port", min=0, max=65535, help="HTTP port (0 = any free port)."
    ),
    role: str = typer.Option(
        "collocated",
        "--role",
        help="collocated (SGLang's 'null', accepted too), prefill or decode.",
    ),
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
    kv_events_endpoint: str | None = typer.Option(
        None,
        "--kv-events-endpoint",
        help="ZMQ PUB endpoint of the KV events, e.g. tcp://127.0.0.1:5557 (default: a free port on --host, printed when ready).",
    ),
    kv_replay_endpoint: str | None = typer.Option(
        None,
        "--kv-replay-endpoint",
        help="ZMQ ROUTER endpoint answering KV-event replay requests (default: a free port on --host, printed when ready).",
    ),
    forward_metrics_endpoint: str | None = typer.Option(
        None,
        "--forward-metrics-endpoint",
        help="ZMQ PUB endpoint of the forward-pass metrics (default: a free port on --host, printed when ready).",
    ),
    parent_pid: int | None = typer.Option(
        None, "--parent-pid", help="Stop when this process is gone (the launcher's pid)."
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="PDLAB_ENGINE_TOKEN",
        show_envvar=True,
        help="Bearer token of the mutating routes (default: generated, written to a file).",
    ),
    max_body_bytes: int | None = typer.Option(
        None, "--max-body-bytes", min=1024, help="Largest request body (413 beyond it)."
    ),
    dp: int = typer.Option(1, "--dp", help="Data-parallel ranks (engine processes) of a group."),
    ep: int = typer.Option(
        1, "--ep", help="Expert-parallel degree: 1, or --dp to split the experts over the ranks."
    ),
    dp_sync_interval: int = typer.Option(
        32, "--dp-sync-interval", help="Steps between the ranks' 'all done?' all-reduce (vLLM 32)."
    ),
    log_dir: str | None = typer.Option(
        None, "--log-dir", help="A group's per-rank logs of passes, MoE loads and requests."
    ),
) -> None:
    """Serve one torch engine (SGLang's HTTP API, KV events, forward-pass metrics)."""
    args = EngineArgs(**locals())  # the first statement: the locals are the options
    _check_torch_and_role(args.role)
    secret, generated, group, engine = _build(args)
    if group is not None:
        _serve_group(group, args.parent_pid, generated)
    elif engine is not None:
        _serve_engine(engine, args, secret, generated)


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """The options of `pdlab engine`, as given."""

    model: str
    host: str
    port: int
    role: str
    device: str
    dtype: str
    threads: int
    seed: int
    page_size: int
    kv_gpu_tokens: int
    kv_host_tokens: int
    chunk_tokens: int
    max_running: int
    eviction: str
    enable_pd_role_switch: bool
    bootstrap_port: int
    kv_events_endpoint: str | None
    kv_replay_endpoint: str | None
    forward_metrics_endpoint: str | None
    parent_pid: int | None
    token: str | None
    max_body_bytes: int | None
    dp: int
    ep: int
    dp_sync_interval: int
    log_dir: str | None


def _check_torch_and_role(role: str) -> None:
    """torch installed (one line saying how to get it) and a known --role, else exit 2."""
    from toolkit.extras import torch_missing

    if (missing := torch_missing("pdlab engine")) is not None:
        typer.echo(f"error: {missing}", err=True)
        raise typer.Exit(2)
    if role not in ROLES:
        typer.echo(
            f"error: --role must be collocated (or null), prefill or decode, got {role!r}",
            err=True,
        )
        raise typer.Exit(2)


def _build(args: EngineArgs) -> tuple[str, bool, DPGroup | None, TorchEngine | None]:
    """The token (and whether it was generated), and the DP group or the one engine."""
    from cluster.engines.shell.guard import engine_token
    from cluster.engines.torch.config import EngineConfig, preset
    from cluster.engines.torch.dp_group import DPGroup
    from cluster.engines.torch.engine import TorchEngine

    role = ROLES[args.role]
    try:
        secret, generated = engine_token(args.token)
        cfg = EngineConfig(
            model=preset(args.model),
            seed=args.seed,
            page_size=args.page_size,
            gpu_pages=max(args.kv_gpu_tokens // args.page_size, 0),
            host_pages=max(args.kv_host_tokens // args.page_size, 0),
            chunk_tokens=args.chunk_tokens,
            max_running=args.max_running,
            eviction=args.eviction,
            device=args.device,
            dtype=args.dtype,
            num_threads=args.threads,
        )
        if args.dp > 1 or args.ep > 1 or args.log_dir:
            group = DPGroup(cfg, args.dp, args.ep, role=role, host=args.host, port=args.port,
                            log_dir=args.log_dir, sync_interval=args.dp_sync_interval,
                            bootstrap_port=args.bootstrap_port,
                            enable_pd_role_switch=args.enable_pd_role_switch, token=secret,
                            max_body_bytes=args.max_body_bytes)  # fmt: skip
            return secret, generated, group, None
        engine = TorchEngine(
            cfg,
            role,  # type: ignore[arg-type]
            host=args.host,
            port=args.port,
            kv_events_endpoint=args.kv_events_endpoint,
            kv_replay_endpoint=args.kv_replay_endpoint,
            forward_metrics_endpoint=args.forward_metrics_endpoint,
            bootstrap_port=args.bootstrap_port,
            enable_pd_role_switch=args.enable_pd_role_switch,
            token=secret,
            max_body_bytes=args.max_body_bytes,
        )
    except (ConfigError, ValueError, RuntimeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    return secret, generated, None, engine


def _serve_engine(engine: TorchEngine, args: EngineArgs, secret: str, generated: bool) -> None:
    """Start the engine, announce it, serve until a signal (or the launcher is gone)."""
    import zmq

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        endpoints = engine.start()
    except (OSError, RuntimeError, zmq.ZMQError) as err:
        engine.stop()
        typer.echo(f"error: cannot serve on {args.host}:{args.port}: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        token_file = _announce_token(secret, generated, engine.port, engine.max_body_bytes)
    except OSError as err:
        engine.stop()
        typer.echo(f"error: cannot write the engine's token file: {err}", err=True)
        raise typer.Exit(2) from None
    print(f"pdlab engine ready: {json.dumps(endpoints._asdict())}", flush=True)
    try:
        while not stop.wait(0.1):
            if args.parent_pid is not None and os.getppid() != args.parent_pid:
                break  # the launcher is gone (this process was reparented)
    finally:
        engine.stop()
        if token_file is not None:
            token_file.unlink(missing_ok=True)


def _announce_token(secret: str, generated: bool, port: int, max_body_bytes: int) -> Path | None:
    """Write a generated token to a file only the user can read (its path, else None) and
    say on stderr what the mutating routes need."""
    from cluster.engines.shell.guard import write_token_file

    token_file = write_token_file(secret, f"engine-{port}.token") if generated else None
    where = f"generated, in {token_file}" if token_file else "from --token / $PDLAB_ENGINE_TOKEN"
    typer.echo(
        f"pdlab engine: /flush_cache, /kv_eviction and /pd_role_switch need "
        f"'Authorization: Bearer <token>' (token {where}); bodies up to {max_body_bytes} bytes",
        err=True,
    )
    return token_file


def _serve_group(group: DPGroup, parent_pid: int | None, generated: bool) -> None:
    """`pdlab engine --dp N --ep E`: the group's ranks, coordinator and front end."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        endpoints = group.start()
    except (OSError, RuntimeError) as err:
        typer.echo(f"error: cannot start the DP group: {err}", err=True)
        raise typer.Exit(2) from None
    token_file = None
    try:
        assert group.token is not None  # `pdlab engine` always has one
        token_file = _announce_token(group.token, generated, group.port, group.max_body_bytes)
        print(f"pdlab engine ready: {json.dumps(endpoints._asdict())}", flush=True)
        while not stop.wait(0.1):
            if parent_pid is not None and os.getppid() != parent_pid:
                break
            if not group.alive():
                typer.echo("error: a DP rank exited; stopping the group", err=True)
                break
    except OSError as err:
        typer.echo(f"error: cannot write the engine's token file: {err}", err=True)
        raise typer.Exit(2) from None
    finally:
        group.stop()
        if token_file is not None:
            token_file.unlink(missing_ok=True)
