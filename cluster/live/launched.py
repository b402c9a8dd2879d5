"""A live PD cluster whose engine processes pdlab starts and stops itself (SPEC §6, §9).

`LaunchedCluster` is an `SGLangCluster` (cluster.py) that owns its engines: `prepare()`
starts one process per node from a command template (`EngineLaunch.command`, an argv whose
`{node_id}`, `{role}`, `{host}` and `{port}` are filled per engine; ports are chosen free),
waits until every engine answers `/health`, and builds the cluster from
`EngineSpec(node_id, http_url, role)` — discovery through /server_info fills the rest.
`stop()` stops the cluster, then the processes. `pdlab serve --engines torch` launches
`pdlab engine` processes this way; any engine speaking the SGLang subset of §6 would do.

The engines share one bearer token for their mutating routes (/pd_role_switch,
/kv_eviction, /flush_cache): the cluster settings' `api_key` when set, else a new random
one. Each engine gets it in its environment ($PDLAB_ENGINE_TOKEN, never on a command line
that `ps` shows) and the cluster sends it with every engine call.

Every engine runs in a session (process group) of its own, so a terminal's Ctrl-C reaches
only the process that launched it, which stops the cluster first (collectors, switches,
the telemetry run) and the engines after: SIGTERM to each engine's process group, SIGKILL
to the groups still alive `stop_timeout_s` later. A failed launch stops the engines it
started and raises `ConfigError` with the failing engine's log tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from cluster.core import ConfigError
from cluster.live.cluster import SGLangCluster
from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec

log = logging.getLogger(__name__)
PLACEHOLDERS = ("{node_id}", "{role}", "{host}", "{port}")
TOKEN_ENV = "PDLAB_ENGINE_TOKEN"  # what `pdlab engine` and the stand-in read their token from


@dataclass(frozen=True, slots=True)
class EngineLaunch:
    """How to start the engines: one per entry of `roles` ("prefill" | "decode")."""

    command: tuple[str, ...]
    roles: tuple[str, ...]
    host: str = "127.0.0.1"
    startup_timeout_s: float = 300.0
    stop_timeout_s: float = 20.0
    log_dir: Path | None = None  # engine logs; default a new temporary directory
    env: Mapping[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("the engine command is empty")
        if "{port}" not in " ".join(self.command):
            raise ConfigError("the engine command must take its HTTP port as {port}")
        bad = [r for r in self.roles if r not in ("prefill", "decode")]
        if bad or "prefill" not in self.roles or "decode" not in self.roles:
            raise ConfigError(
                f"a PD cluster needs prefill and decode engines only, got roles {self.roles}"
            )
        if not (self.startup_timeout_s > 0 and self.stop_timeout_s > 0):
            raise ConfigError("startup_timeout_s and stop_timeout_s must be > 0")

    def argv(self, node_id: int, role: str, port: int) -> list[str]:
        values = {"{node_id}": str(node_id), "{role}": role, "{host}": self.host,
                  "{port}": str(port)}  # fmt: skip
        out = []
        for arg in self.command:
            for key, value in values.items():
                arg = arg.replace(key, value)
            out.append(arg)
        return out


class EngineProcess:
    """One launched engine: its process (a session leader), URL and log file."""

    def __init__(self, node_id: int, role: str, url: str, argv: list[str], log_path: Path,
                 env: Mapping[str, str] | None) -> None:  # fmt: skip
        self.node_id, self.role, self.url, self.log_path = node_id, role, url, log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=None if env is None else dict(env),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # its session: the engine and anything it started

    def tail(self, n: int = 1500) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return text[-n:].strip() or "(no output)"

    def close_log(self) -> None:
        self._log.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LaunchedCluster(SGLangCluster):
    """An SGLang-protocol PD cluster over engine processes it starts (module docstring)."""

    def __init__(
        self,
        launch: EngineLaunch,
        settings: ClusterSettings,
        db_path: str | Path | None = None,
        run_id: str | None = None,
        source: str = "sglang",
    ) -> None:
        token = settings.api_key or secrets.token_urlsafe(18)
        settings = dataclasses.replace(settings, api_key=token)
        super().__init__(ClusterConfig((), settings, source="launched"), db_path, run_id)
        env = dict(os.environ if launch.env is None else launch.env) | {TOKEN_ENV: token}
        self.launch = dataclasses.replace(launch, env=env)
        self.source = source
        self.processes: list[EngineProcess] = []
        self._dead: set[int] = set()
        self._watcher: threading.Thread | None = None
        self.log_dir: Path | None = None

    def prepare(self) -> None:
        """Start the engines, wait for their /health, discover them (idempotent)."""
        if self._prepared:
            return
        try:
            self._launch_all()
            super().prepare()
        except BaseException:
            self.stop_engines()
            raise

    def start(self) -> None:
        try:
            super().start()
        except BaseException:
            self.stop_engines()
            raise
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch, name="pdlab-engine-watch", daemon=True
            )
            self._watcher.start()

    def stop(self) -> dict[str, Any] | None:
        try:
            return super().stop()
        finally:
            self.stop_engines()

    def _launch_all(self) -> None:
        la = self.launch
        self.log_dir = la.log_dir or Path(tempfile.mkdtemp(prefix="pdlab-engines-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        specs = []
        for node, role in enumerate(la.roles):
            port = free_port(la.host)
            url = f"http://{la.host}:{port}"
            argv = la.argv(node, role, port)
            log.info("launching engine %d (%s) on %s: %s", node, role, url, " ".join(argv))
            self.processes.append(
                EngineProcess(node, role, url, argv, self.log_dir / f"engine-{node}.log", la.env)
            )
            specs.append(EngineSpec(node_id=node, http_url=url, role=role))
        self._wait_healthy()
        self.config = ClusterConfig(tuple(specs), self.settings, source="launched")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.launch.startup_timeout_s
        waiting = list(self.processes)
        with httpx.Client(timeout=2.0) as client:
            while waiting:
                for p in list(waiting):
                    if not p.alive():
                        raise ConfigError(
                            f"engine {p.node_id} exited with {p.proc.returncode} while starting "
                            f"(log {p.log_path}):\n{p.tail()}"
                        )
                    try:
                        if client.get(f"{p.url}/health").status_code == 200:
                            waiting.remove(p)
                    except httpx.HTTPError:
                        pass
                if waiting and time.monotonic() > deadline:
                    p = waiting[0]
                    raise ConfigError(
                        f"engine {p.node_id} ({p.url}) not healthy within "
                        f"{self.launch.startup_timeout_s:g} s (log {p.log_path}):\n{p.tail()}"
                    )
                if waiting:
                    time.sleep(0.2)

    def stop_engines(self) -> list[int | None]:
        """SIGTERM every engine's process group, SIGKILL what is left after the timeout;
        the engines' exit codes (negative: the signal that ended it). Idempotent."""
        procs = self.processes
        for p in procs:
            if p.alive():
                p.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.launch.stop_timeout_s
        for p in procs:
            try:
                p.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("engine %d ignored SIGTERM; killing it", p.node_id)
        for p in procs:
            p.signal(signal.SIGKILL)  # the group: children an engine may have left behind
            p.proc.wait()
            p.close_log()
        return [p.proc.returncode for p in procs]

    def _watch(self) -> None:
        """An engine whose process exited is dead: down for good (no more health checks),
        its KV gone (directory entries dropped, a `cleared` row), and the run ends
        `failed` saying so (`outages`)."""
        while not self._stop.wait(self.settings.health_interval_s):
            for p in self.processes:
                if p.alive() or p.node_id in self._dead:
                    continue
                self._dead.add(p.node_id)
                reason = f"its process exited with {p.proc.returncode} (log {p.log_path})"
                self.mark_down(p.node_id, reason)
                with self.lock:
                    self.fleet.mark_dead(p.node_id, reason)
                    dropped = self.cp.drop_node_blocks(p.node_id)
                log.error("engine %d died: %s; %d blocks left the directory", p.node_id,
                          reason, dropped)  # fmt: skip

    def health_details(self) -> dict[str, Any]:
        return super().health_details() | {
            "engine_pids": [p.pid for p in self.processes],
            "engine_logs": None if self.log_dir is None else str(self.log_dir),
        }


__all__ = ["EngineLaunch", "EngineProcess", "LaunchedCluster", "free_port"]
