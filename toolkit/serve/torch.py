"""`pdlab serve --engines torch`: a live cluster of torch engine processes (SPEC §6, §9).

The composition root of a live torch cluster: `LaunchedCluster` (cluster.live.launched)
starts one `pdlab engine` process per node (free ports, one torch thread each, the same
seeded weights, `--enable-pd-role-switch`, `--parent-pid` of this process), discovers them
and drives them like SGLang engines behind the control server's REST API and the PD proxy
(`create_sglang_app`: one port for both). An `AgentLoop` plays the workload's agents
against that proxy with token counts scaled to the engine: every segment and every output
length is multiplied by `token_scale` (default 0.02: a cc agent's ~60k-token context
becomes ~1.2k tokens, which the tiny-moe engine prefills in about 0.1 s on one core), so
the prefix structure — shared system prompts, appends, forks, sub-agents, compaction — is
kept at a smaller size; tool gaps are multiplied by `time_scale`. Ctrl-C, SIGTERM or
SIGHUP stop the agents, then the server (the telemetry run is consolidated into `--db`),
then the engines. The engines' mutating routes take the server's token (passed in their
environment, sent with every engine call).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from cluster.core import ConfigError

if TYPE_CHECKING:
    import uvicorn

    from cluster.live.agent_loop import AgentLoop
    from cluster.live.launched import LaunchedCluster

console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class TorchClusterOptions:
    """What `pdlab serve --engines torch` takes from its command line."""

    nodes: int = 3
    split: str = "1P2D"
    model: str = "tiny-moe"
    device: str = "cpu"
    seed: int = 0
    eviction: str = "branch"
    router: str = "ttft"
    planner: str = "gain"
    planner_mode: str = "advise"
    window_s: float = 600.0
    slices: int = 10
    profile: str = "gb300"
    engine_args: tuple[str, ...] = ()
    # the agent client
    workload: str = "cc"
    agents: int | None = 8
    arrival_rate_per_min: float | None = None
    duration_s: float | None = None
    cycle: bool = False  # a trace: the agents cycle its programs instead of replaying it once
    token_scale: float = 0.02
    time_scale: float = 0.1
    max_output_tokens: int = 32


def engine_command(opts: TorchClusterOptions) -> tuple[str, ...]:
    """The `pdlab engine` argv template of every node ({role}, {host}, {port} filled later)."""
    return (
        sys.executable, "-m", "toolkit.cli", "engine", "--model", opts.model,
        "--role", "{role}", "--host", "{host}", "--port", "{port}", "--bootstrap-port", "0",
        "--enable-pd-role-switch", "--device", opts.device, "--threads", "1",
        "--seed", str(opts.seed), "--eviction", opts.eviction,
        "--parent-pid", str(os.getpid()), *opts.engine_args,
    )  # fmt: skip


def build_cluster(
    opts: TorchClusterOptions,
    db: Path | None,
    run_id: str | None,
    log_dir: Path | None = None,
    token: str | None = None,
) -> LaunchedCluster:
    """The `LaunchedCluster` of `opts` (not started; checks every option first). The
    engines' mutating routes take `token` (the server's own; None: a random one), which
    the cluster sends with every engine call."""
    from cluster.core import parse_split
    from cluster.engines.torch.config import preset
    from cluster.kv.eviction import EVICTION_POLICIES
    from cluster.live.cluster_file import ClusterSettings
    from cluster.live.launched import EngineLaunch, LaunchedCluster

    split = parse_split(opts.split, opts.nodes)
    if split is None:
        raise ConfigError("a live torch cluster needs a PD split such as 1P2D, not collocated")
    if opts.eviction not in EVICTION_POLICIES:
        raise ConfigError(
            f"unknown eviction {opts.eviction!r}; choose one of: "
            f"{', '.join(EVICTION_POLICIES.names())}"
        )
    if opts.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {opts.device!r}")
    m = preset(opts.model)
    settings = ClusterSettings(
        tokenizer="toy",
        router=opts.router,
        planner=opts.planner,
        planner_mode=opts.planner_mode,
        window_s=opts.window_s,
        slices=opts.slices,
        profile=opts.profile,
        hardware=f"torch-{opts.device}",
        moe_top_k=m.top_k,
        moe_experts=m.num_experts,
        refit_every_s=10.0,
        # One torch thread per engine on a shared CPU: a /health may wait for a long
        # pass; three failed checks in a row (2 s timeouts) before a node counts as down.
        health_failures=3,
        api_key=token,
    )
    roles = ("prefill",) * split[0] + ("decode",) * split[1]
    launch = EngineLaunch(engine_command(opts), roles, log_dir=log_dir)
    return LaunchedCluster(launch, settings, db_path=db, run_id=run_id, source="torch")


def build_agents(
    opts: TorchClusterOptions, url: str, stop_when: Callable[[], bool] | None = None
) -> AgentLoop:
    """The `AgentLoop` of `opts` against the proxy at `url` (not started)."""
    from cluster.engines.torch.config import preset
    from cluster.live.agent_client import TokenMap
    from cluster.live.agent_loop import AgentLoop
    from cluster.workloads import make_workload

    m = preset(opts.model)
    if not opts.token_scale > 0:
        raise ConfigError(f"--token-scale must be > 0, got {opts.token_scale}")
    # Byte tokens 1..255: no EOS (256) and no 0, whatever the model's vocabulary.
    tokens = TokenMap(
        vocab_lo=1,
        vocab_hi=min(256, m.eos_token_id),
        token_scale=opts.token_scale,
        output_scale=opts.token_scale,
        seed=opts.seed,
    )
    try:
        return AgentLoop(
            url,
            make_workload(opts.workload, seed=opts.seed),
            tokens,
            agents=opts.agents,
            arrival_rate_per_min=opts.arrival_rate_per_min,
            duration_s=opts.duration_s,
            time_scale=opts.time_scale,
            max_output_tokens=opts.max_output_tokens,
            seed=opts.seed,
            stop_when=stop_when,
            cycle=opts.cycle,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def serve_torch(
    opts: TorchClusterOptions,
    *,
    host: str,
    port: int,
    token: str,
    db: Path | None,
    run_id: str | None,
) -> None:
    """Start the engines, serve until Ctrl-C / SIGTERM / SIGHUP, stop everything."""
    from toolkit.serve.loop import bind_port, http_server, run_until_stopped
    from toolkit.serve.processes import log_to_stderr
    from toolkit.serve.sglang import create_sglang_app

    log_to_stderr()
    url = f"http://{host}:{port}"
    local = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::") else url
    server: uvicorn.Server | None = None
    try:
        listen = bind_port(host, port)  # before the engines take ephemeral ports
        cluster = build_cluster(opts, db, run_id, token=token)
        agents = build_agents(opts, local, lambda: server is not None and server.should_exit)
    except ConfigError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    try:
        console.print(f"starting {opts.nodes} torch engines ({opts.model}, {opts.split}) …")
        try:
            cluster.prepare()
        except ConfigError as err:
            console.print(f"[red]error:[/] {err}")
            raise typer.Exit(2) from None
        server = http_server(
            create_sglang_app(cluster, token), host=host, port=port, timeout_graceful_shutdown=5
        )
        engines = ", ".join(f"{p.node_id}:{p.role} {p.url}" for p in cluster.processes)
        banner = (
            f"[bold]pdlab serve --engines torch[/] {url}  engines {engines}\n"
            f"  engine logs {cluster.log_dir}  db {db or '(none)'}\n"
            f"  agents: {opts.workload}, token scale {opts.token_scale:g}, "
            f"time scale {opts.time_scale:g}\n"
            f"  data plane: {url}/generate; mutating control calls: Authorization: Bearer {token}"
        )
        starter = threading.Thread(target=_start_agents, args=(server, agents), daemon=True)
        starter.start()
        run_until_stopped(server, url=url, token=token, banner=banner, listen=listen)
    except KeyboardInterrupt:
        pass
    finally:
        stats = agents.stop()
        cluster.stop()
    s = cluster.summary
    console.print(
        f"agents: {stats.programs_started} programs, {stats.turns_ok} turns served, "
        f"{stats.turns_failed} failed"
    )
    if s is not None:
        console.print(
            f"run {s['run_id']}: {s['completed']} requests completed, {s['errors']} failed, "
            f"{s['switches']} switches, split {s['final_split']}"
        )
        for o in s.get("outages", ()):
            what = "died" if o["died"] else "was down"
            until = "" if o["t_up"] is None else f" until t={o['t_up']:.1f} s"
            console.print(
                f"[yellow]engine {o['node_id']} {what}[/] at t={o['t_down']:.1f} s{until}: "
                f"{o['reason']}"
            )


def _start_agents(server: Any, agents: AgentLoop) -> None:
    """Start the agents once the server accepts connections (not at all if it stops first)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    agents.start()
