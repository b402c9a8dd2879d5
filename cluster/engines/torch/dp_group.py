"""A torch engine served by a DP×EP group of processes behind one front end (vLLM DP+EP).

`DPGroup(config, dp=2, ep=2).start()` starts `dp` rank processes (`dp_rank`, one torch
engine each: its own scheduler, paged KV and prefix cache), which join one
torch.distributed world; with `ep == dp` the MoE layers' experts are split over the ranks
and every MoE layer dispatches tokens to the ranks owning their experts (gloo on CPU, NCCL
on CUDA), the ranks stepping together (dummy passes included) as vLLM's DP+EP engines do;
with `ep == 1` the ranks are plain data-parallel replicas. In this process it runs the
coordinator (`dp_coordinator`) and the HTTP front end (`dp_frontend`) that serves the API
of a single engine, behind the same door (`shell.guard`: `token` for the mutating routes,
held by the ranks too; bodies of at most `max_body_bytes`). Rank r publishes its KV events
on port base + r (and replays on a second base + r), as SGLang's DP ranks do, so the front
end's /server_info advertises every rank's publishers. `stop` ends the front end, then
each rank (SIGTERM, SIGKILL after `stop_timeout_s`); the ranks also stop when this process
is gone.

    group = DPGroup(EngineConfig(model=preset("tiny-moe")), dp=2, ep=2, log_dir="run/")
    url = group.start().http_url
    ...
    group.stop()
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cluster.core import ConfigError
from cluster.engines.shell.lifecycle import body_limit
from cluster.engines.shell.loopback import LoopbackServer
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.dp_bootstrap import RoomRanks, group_bootstrap_app
from cluster.engines.torch.dp_coordinator import Balancer, Coordinator
from cluster.engines.torch.dp_frontend import FrontendLog, create_frontend_app

READY = "pdlab dp rank ready:"  # dp_rank.READY (that module imports torch)


class GroupEndpoints(NamedTuple):
    http_url: str
    ranks: list[dict[str, Any]]  # each rank's ready line: http_url, control, publishers, pid
    bootstrap_port: int | None = None  # the group's (prefill role)


@dataclass(slots=True)
class _Rank:
    proc: subprocess.Popen[str]
    stderr_path: Path
    ready: dict[str, Any] = field(default_factory=dict)
    event: threading.Event = field(default_factory=threading.Event)


def check_group(config: EngineConfig, dp: int, ep: int) -> None:
    """ConfigError unless `dp` ranks with EP degree `ep` can serve `config.model`."""
    if dp < 1 or ep < 1:
        raise ConfigError(f"--dp and --ep must be >= 1, got {dp} and {ep}")
    if ep not in (1, dp):
        raise ConfigError(
            f"--ep must be 1 (plain DP) or equal --dp (the EP group spans the DP ranks, "
            f"TP 1), got dp={dp}, ep={ep}"
        )
    m = config.model
    if ep > 1 and not m.is_moe:
        raise ConfigError(f"--ep {ep} needs an MoE model; {m.name} is dense")
    if ep > 1 and m.num_experts % ep:
        raise ConfigError(f"--ep {ep} must divide the {m.num_experts} experts of {m.name}")


class DPGroup:
    """Rank processes, coordinator and front end of one group (module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        dp: int,
        ep: int,
        *,
        role: str = "null",
        host: str = "127.0.0.1",
        port: int = 0,
        bootstrap_port: int = 0,
        enable_pd_role_switch: bool = False,
        log_dir: str | Path | None = None,
        sync_interval: int = 32,
        stats_interval_s: float = 0.1,
        rank_options: dict[str, Any] | None = None,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 15.0,
        token: str | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        check_group(config, dp, ep)
        if sync_interval < 1:
            raise ConfigError(f"--dp-sync-interval must be >= 1, got {sync_interval}")
        self.config, self.dp, self.ep, self.role = config, dp, ep, role
        if role not in ("null", "prefill", "decode"):
            raise ConfigError(f"role must be null, prefill or decode, got {role!r}")
        self.host, self.port, self.bootstrap_port = host, port, bootstrap_port
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.sync_interval = sync_interval
        self.rank_options = dict(rank_options or {})
        if role != "null":  # each rank's own bootstrap server (prefill); ours relays to them
            self.rank_options |= {
                "bootstrap_port": 0,
                "enable_pd_role_switch": enable_pd_role_switch,
            }
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.token = token
        self.max_body_bytes = max_body_bytes or body_limit(config.model.max_context_tokens)
        self.rank_options |= {"token": token, "max_body_bytes": self.max_body_bytes}
        self.balancer = Balancer(dp)
        self.coordinator = Coordinator(self.balancer, host, stats_interval_s)
        self.ranks: list[_Rank] = []
        self.endpoints: GroupEndpoints | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="pdlab-dp-")
        self._front: LoopbackServer | None = None
        self._bootstrap: LoopbackServer | None = None
        self.rooms = RoomRanks()

    def start(self) -> GroupEndpoints:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> GroupEndpoints:
        from dataclasses import asdict

        tmp = Path(self._tmp.name)
        err_dir = self.log_dir or tmp
        err_dir.mkdir(parents=True, exist_ok=True)
        kv_base = free_port_run(self.host, 2 * self.dp)
        replay_base = kv_base + self.dp
        for r in range(self.dp):
            ports = {"kv_events_endpoint": f"tcp://{self.host}:{kv_base + r}",
                     "kv_replay_endpoint": f"tcp://{self.host}:{replay_base + r}"}  # fmt: skip
            spec = {"engine": asdict(self.config), "dp_rank": r, "dp_size": self.dp,
                    "ep_size": self.ep, "init_file": str(tmp / "rendezvous"),
                    "coordinator": self.coordinator.endpoint, "role": self.role,
                    "host": self.host, "log_dir": None if self.log_dir is None else str(self.log_dir),
                    "sync_interval": self.sync_interval, "parent_pid": os.getpid(),
                    "options": ports | self.rank_options}  # fmt: skip
            err = err_dir / f"rank{r}.stderr"
            cmd = [sys.executable, "-m", "cluster.engines.torch.dp_rank", json.dumps(spec)]
            with err.open("w") as f:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True,
                                        cwd=Path(__file__).resolve().parents[3])  # fmt: skip
            rank = _Rank(proc, err)
            threading.Thread(target=_read_ready, args=(rank,), daemon=True).start()
            self.ranks.append(rank)
        deadline = time.monotonic() + self.start_timeout_s
        for r, rank in enumerate(self.ranks):
            while not rank.event.wait(0.1):
                if rank.proc.poll() is not None or time.monotonic() > deadline:
                    tail = rank.stderr_path.read_text()[-1500:]
                    raise RuntimeError(f"DP rank {r} did not start: {tail}")
        self.coordinator.start([rk.ready["control"] for rk in self.ranks])
        if self.log_dir is not None:
            (self.log_dir / "group.json").write_text(json.dumps(self.describe(), indent=1))
        urls = [str(rk.ready["http_url"]) for rk in self.ranks]
        boot = [rk.ready.get("bootstrap_port") for rk in self.ranks]
        overrides: dict[str, Any] = {}  # filled once the ports are bound
        app = create_frontend_app(urls, self.balancer, self.coordinator,
                                  FrontendLog(self.log_dir), self.rooms, overrides,
                                  token=self.token, max_body_bytes=self.max_body_bytes)  # fmt: skip
        self._front = LoopbackServer(app, self.host, self.port, name="DP group front end")
        self.port = overrides["port"] = self._front.port
        if all(boot):
            rank_boot = [f"http://{self.host}:{b}" for b in boot]
            bapp = group_bootstrap_app(self.rooms, rank_boot, page_size=self.config.page_size,
                                       http_port=self.port, token=self.token)  # fmt: skip
            self._bootstrap = LoopbackServer(bapp, self.host, self.bootstrap_port,
                                             name="DP group bootstrap server")  # fmt: skip
            self.bootstrap_port = overrides["disaggregation_bootstrap_port"] = self._bootstrap.port
            self._bootstrap.start()
        self._front.start()
        self.endpoints = GroupEndpoints(
            f"http://{self.host}:{self.port}", [rk.ready for rk in self.ranks],
            self.bootstrap_port if self._bootstrap else None,
        )  # fmt: skip
        return self.endpoints

    def describe(self) -> dict[str, Any]:
        """The group's settings (written to `group.json` in the log directory)."""
        from dataclasses import asdict

        return {"engine": asdict(self.config), "dp": self.dp, "ep": self.ep, "tp": 1,
                "role": self.role, "sync_interval": self.sync_interval,
                "stats_interval_s": self.coordinator.stats_interval_s,
                "load_balance": "vLLM DPLBAsyncMPClient: least 4*waiting + running, first "
                "rank on ties, counts from the ranks every stats_interval_s",
                "all_to_all": "gloo" if self.config.device == "cpu" else "nccl",
                "cpu_count": os.cpu_count(), "load_avg": list(os.getloadavg()),
                "wall_s": time.time(), "monotonic_s": time.monotonic(),
                "ranks": [rk.ready for rk in self.ranks]}  # fmt: skip

    def alive(self) -> bool:
        return bool(self.ranks) and all(rk.proc.poll() is None for rk in self.ranks)

    def stop(self) -> list[int | None]:
        """Stop the front end and the ranks; returns each rank's exit status."""
        for server in (self._front, self._bootstrap):
            if server is not None:
                server.stop()
        self._front = self._bootstrap = None
        for rk in self.ranks:
            if rk.proc.poll() is None:
                rk.proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        deadline = time.monotonic() + self.stop_timeout_s
        for rk in self.ranks:
            try:
                codes.append(rk.proc.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                rk.proc.kill()
                rk.proc.wait(5)
                codes.append(None)
            if rk.proc.stdout is not None:
                rk.proc.stdout.close()
        self.coordinator.close()
        self._tmp.cleanup()
        return codes

    def __enter__(self) -> DPGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port_run(host: str, n: int, tries: int = 50) -> int:
    """A port p with p .. p + n - 1 free on `host` now (a rank binds p + its rank)."""
    import socket

    for _ in range(tries):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        if base + n > 65536:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                held.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports on {host}")


def _read_ready(rank: _Rank) -> None:
    assert rank.proc.stdout is not None
    try:
        for line in rank.proc.stdout:
            if line.startswith(READY):
                rank.ready = json.loads(line[len(READY) :])
                rank.event.set()
    except ValueError:  # stdout closed by `stop`
        pass
