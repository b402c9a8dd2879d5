"""One engine process without its scheduler: publishers, servers, state and generation plumbing.

`EngineShell.start` opens the ZMQ publishers (KV events with SGLang's replay ROUTER; forward
pass metrics on the given endpoint or, as SGLang does by default, an IPC socket
"{ipc_name}.{dp_rank}"), binds the HTTP server, builds the scheduler (`_build_scheduler`),
serves the PD bootstrap server when the engine may act as a prefill (`_bootstrap_app`),
then starts the scheduler and the HTTP API (`_http_app`); `stop` winds them down in
reverse. An engine subclasses it with what differs: its scheduler, its requests and what
its prefill hands to decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypedDict, TypeVar, Unpack

import httpx
from fastapi import FastAPI

from cluster.engines.shell import bootstrap as shell_bootstrap
from cluster.engines.shell.loopback import LoopbackServer
from cluster.engines.shell.scheduling import Finish, OnUpdate, Role, SchedulerThread, check_role
from cluster.engines.shell.serving_metrics import Load, MetricsStyle, ServingMetrics
from cluster.engines.shell.stamps import EMITTED, Stamps
from cluster.wire.publisher import ZmqBatchPublisher

S = TypeVar("S", bound=SchedulerThread[Any])
# (output ids so far, finish, cached tokens, the request's stage stamps: shell.stamps)
Update = tuple[list[int], "Finish | None", int, Stamps]


class EngineEndpoints(NamedTuple):
    """Where a started engine listens (ports resolved)."""

    http_url: str
    kv_events: str | None
    kv_replay: str | None
    forward_metrics: str | None
    bootstrap_port: int | None


class ShellOptions(TypedDict, total=False):
    """Where an engine listens and what it publishes (every key optional)."""

    host: str  # default 127.0.0.1
    port: int  # HTTP; 0 picks a free one
    kv_events: bool  # publish KV events (default True)
    kv_events_endpoint: str | None  # default tcp://{host}:0
    kv_replay_endpoint: str | None  # default tcp://{host}:0
    kv_topic: str
    forward_metrics: bool  # publish forward-pass metrics (default True)
    forward_metrics_endpoint: str | None  # default: the engine's `fpm_default`
    bootstrap_port: int  # 0 picks a free one
    enable_pd_role_switch: bool  # default False
    token: str | None  # bearer token of the mutating routes (default None: none needed)
    max_body_bytes: int | None  # default `body_limit(max_model_len)`


T = TypeVar("T")
# (client, bootstrap host, bootstrap port, room, timeout_s) -> what the prefill left
FetchRoom = Callable[[httpx.AsyncClient, str, int, int, float], Awaitable[T]]


class _Progress(Protocol):
    cached_tokens: int
    stamps: Stamps


class EngineShell(Generic[S]):
    """Lifecycle and shared state of one engine (module docstring); `S` is its scheduler."""

    server_name = "engine's HTTP server"  # as a failed start names it
    # Where forward-pass metrics go by default: SGLang's IPC socket, or TCP on `host`.
    fpm_default: Literal["ipc", "tcp"] = "ipc"
    metrics_style: MetricsStyle = "sglang"  # the names of GET /metrics

    def __init__(
        self, role: Role, *, transfer_timeout_s: float, **options: Unpack[ShellOptions]
    ) -> None:
        unknown = sorted(set(options) - ShellOptions.__optional_keys__)
        if unknown:
            allowed = ", ".join(sorted(ShellOptions.__optional_keys__))
            raise TypeError(f"unknown engine options {unknown}; allowed: {allowed}")
        self.role: Role = check_role(role)
        host = self.host = options.get("host", "127.0.0.1")
        self.port = options.get("port", 0)
        self.kv_events = options.get("kv_events", True)
        self.kv_events_endpoint = options.get("kv_events_endpoint") or f"tcp://{host}:0"
        self.kv_replay_endpoint = options.get("kv_replay_endpoint") or f"tcp://{host}:0"
        self.kv_topic = options.get("kv_topic", "")
        self.forward_metrics = options.get("forward_metrics", True)
        fpm = options.get("forward_metrics_endpoint")
        self.forward_metrics_endpoint = fpm or (
            f"tcp://{host}:0" if self.fpm_default == "tcp" else None
        )
        self.bootstrap_port = options.get("bootstrap_port", 0)
        self.enable_pd_role_switch = options.get("enable_pd_role_switch", False)
        self.token = options.get("token")
        self._max_body_bytes = options.get("max_body_bytes")
        self.transfer_timeout_s = transfer_timeout_s
        self.kv_publisher: ZmqBatchPublisher | None = None
        self.fpm_publisher: ZmqBatchPublisher | None = None
        self.scheduler: S | None = None
        self.endpoints: EngineEndpoints | None = None
        self._fpm_dir: tempfile.TemporaryDirectory[str] | None = None
        self._http: LoopbackServer | None = None
        self._bootstrap: LoopbackServer | None = None
        self._client: httpx.AsyncClient | None = None  # used on the HTTP server's loop only
        self._loop: asyncio.AbstractEventLoop | None = None  # the HTTP server's
        self._handoffs: set[asyncio.Future[Any]] = set()  # decode sides waiting for a room
        self._stopping = False
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._started_at = 0.0
        self.serving_metrics: ServingMetrics | None = None

    # ---- what an engine supplies ----------------------------------------------------------
    def _build_scheduler(self) -> S:
        """The scheduler, once the HTTP port (and so the worker id) is known."""
        raise NotImplementedError

    def _http_app(self) -> FastAPI:
        raise NotImplementedError

    def _bootstrap_app(self) -> FastAPI:
        raise NotImplementedError

    def _registry(self) -> shell_bootstrap.RoomRegistry[Any]:
        """Where finished prefills wait for their decode side (the bootstrap app's)."""
        raise NotImplementedError

    def _fpm_publisher(self, endpoint: str) -> Any:
        """Where the scheduler's per-pass metrics go (SGLang's FPM stream by default)."""
        return ZmqBatchPublisher(endpoint)

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> EngineEndpoints:
        if self.kv_events:
            self.kv_publisher = ZmqBatchPublisher(
                self.kv_events_endpoint,
                replay_endpoint=self.kv_replay_endpoint,
                topic=self.kv_topic,
                replay_style="vllm" if self.metrics_style == "vllm" else "sglang",
            )
        if self.forward_metrics:
            endpoint = self.forward_metrics_endpoint
            if endpoint is None:  # SGLang's default: an IPC socket "{ipc_name}.{dp_rank}"
                self._fpm_dir = tempfile.TemporaryDirectory(prefix="pdlab-fpm-")
                endpoint = f"ipc://{Path(self._fpm_dir.name) / 'fpm'}.0"
            self.fpm_publisher = self._fpm_publisher(endpoint)
        self._http = LoopbackServer(self._http_app(), self.host, self.port, name=self.server_name)
        self.port = self._http.port
        self.scheduler = self._build_scheduler()
        self.serving_metrics = self._serving_metrics()
        if self.role == "prefill" or (self.role != "null" and self.enable_pd_role_switch):
            self._bootstrap = LoopbackServer(
                self._bootstrap_app(), self.host, self.bootstrap_port, name=self.server_name
            )
            self.bootstrap_port = self._bootstrap.port
            self._bootstrap.start()
        self.scheduler.start()
        self._http.start()
        self._started_at = time.time()
        self.endpoints = EngineEndpoints(
            f"http://{self.host}:{self.port}",
            self.kv_publisher.endpoint if self.kv_publisher else None,
            self.kv_publisher.replay_endpoint if self.kv_publisher else None,
            self.fpm_publisher.endpoint if self.fpm_publisher else None,
            self.bootstrap_port if self._bootstrap else None,
        )
        return self.endpoints

    def stop(self) -> None:
        self._stopping = True
        self._registry().close()  # long polls for rooms answer now
        if self._loop is not None and not self._loop.is_closed():
            for wait in list(self._handoffs):
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(wait.cancel)
        if self.scheduler is not None and self.scheduler.alive:
            # Answer what is in flight (an abort, 503) before the HTTP server closes, so no
            # handler is left for uvicorn to cancel at its graceful-shutdown deadline.
            self.scheduler.abort_all("the engine is stopping")
            deadline = time.monotonic() + 2.0
            while (self._inflight or not self.scheduler.is_idle()) and time.monotonic() < deadline:
                time.sleep(0.01)
        servers = [s for s in (self._http, self._bootstrap) if s is not None]
        for server in servers:  # both wind down at once
            server.request_stop()
        for server in servers:
            server.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        for pub in (self.kv_publisher, self.fpm_publisher):
            if pub is not None:
                pub.close()
        if self._fpm_dir is not None:
            self._fpm_dir.cleanup()

    def __enter__(self) -> EngineShell[S]:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- state ----------------------------------------------------------------------------
    @property
    def sched(self) -> S:
        if self.scheduler is None:
            raise RuntimeError("the engine has not started")
        return self.scheduler

    @property
    def max_model_len(self) -> int:
        raise NotImplementedError

    @property
    def max_body_bytes(self) -> int:
        """The largest request body the HTTP server reads (413 beyond it)."""
        return self._max_body_bytes or body_limit(self.max_model_len)

    @property
    def started_at(self) -> float:
        """Unix time the engine started serving (0 before)."""
        return self._started_at

    @property
    def inflight(self) -> int:
        """HTTP generation requests being answered."""
        return self._inflight

    def track(self, delta: int) -> None:
        """An answer starts (+1) or ends (-1): a role switch needs none in progress."""
        with self._inflight_lock:
            self._inflight += delta

    def is_fully_idle(self) -> bool:
        return self._inflight == 0 and self.sched.is_idle()

    def healthy(self) -> bool:
        """What GET /health says: the scheduler thread runs."""
        return self.sched.alive

    def kv_usage(self) -> float:
        """Fraction of the device KV blocks in use (GET /metrics); engines override it."""
        return 0.0

    def load(self) -> Load:
        """(running, waiting, KV use) at this moment, for GET /metrics' gauges."""
        sched = self.scheduler
        if sched is None:
            return 0, 0, 0.0
        return len(sched.running), len(sched.waiting), self.kv_usage()

    def _serving_metrics(self) -> ServingMetrics:
        model = str(getattr(self, "served_model", "pdlab"))
        return ServingMetrics(self.metrics_style, model, self.load)

    def kv_events_info(self, page_size: int) -> tuple[str | None, dict[str, Any] | None]:
        """/server_info's `kv_events_config` (JSON) and `kv_events` descriptor, as SGLang's."""
        pub = self.kv_publisher
        if pub is None:
            return None, None
        kv_cfg = json.dumps({"publisher": "zmq", "endpoint": pub.endpoint,
                             "replay_endpoint": pub.replay_endpoint, "topic": self.kv_topic,
                             "bind": True})  # fmt: skip
        host, port = _host_port(pub.endpoint)
        descriptor: dict[str, Any] = {"publisher": "zmq", "endpoint_host": host,
                                      "endpoint_port_base": port, "topic": self.kv_topic,
                                      "block_size": page_size, "dp_size": 1}  # fmt: skip
        if pub.replay_endpoint:
            descriptor["replay_endpoint_port_base"] = _host_port(pub.replay_endpoint)[1]
        return kv_cfg, descriptor

    # ---- generation -----------------------------------------------------------------------
    async def pd_handoff(
        self, role: Role, rid: str, body: dict[str, Any], fetch: FetchRoom[T]
    ) -> tuple[T | None, Finish | None]:
        """(what the prefill left, refusal) for one request: SGLang's abort of a PD request
        without a bootstrap room; on a decode engine, `fetch` of the room from the bootstrap
        server the request names (an abort with status 500 when that fails)."""
        room = body.get("bootstrap_room")
        if role != "null" and room is None:
            msg = f"Disaggregated request received without bootstrap room id. req.rid={rid!r}"
            return None, {"type": "abort", "message": f"Invalid request: {msg}", "status_code": 400}
        if role != "decode":
            return None, None
        host = str(body.get("bootstrap_host") or "127.0.0.1")  # SGLang's defaults
        port = int(body.get("bootstrap_port") or 8998)
        room_id = int(body["bootstrap_room"])  # present: checked above
        wait = asyncio.ensure_future(
            fetch(self._bootstrap_client(), host, port, room_id, self.transfer_timeout_s)
        )
        self._loop = asyncio.get_running_loop()
        self._handoffs.add(wait)
        try:
            got = await wait
        except (httpx.HTTPError, RuntimeError, TimeoutError, ValueError) as e:
            return None, {"type": "abort", "message": str(e), "status_code": 500}
        except asyncio.CancelledError:
            if not (self._stopping and wait.cancelled()):
                raise  # the client went away
            return None, {"type": "abort", "message": "the engine is stopping", "status_code": 503}
        finally:
            self._handoffs.discard(wait)
        return got, None

    def _bootstrap_client(self) -> httpx.AsyncClient:
        """One client for the decode side's bootstrap calls (building one costs ~40 ms)."""
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient()
        return self._client

    async def updates(
        self, submit: Callable[[OnUpdate], _Progress]
    ) -> AsyncGenerator[Update, None]:
        """Submit a request built around an `OnUpdate` and yield its updates on this loop.

        Closed or cancelled before its finish (the client went away), the request is
        aborted in the scheduler, which frees its KV and its seat (`SchedulerThread.abort`).
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[list[int], Finish | None, float]] = asyncio.Queue()

        def on_update(ids: list[int], fin: Finish | None) -> None:
            # Called on the scheduler thread: hand the update to this request's event loop,
            # with when the scheduler produced it (the stream-out stage starts there); the
            # loop is gone once the HTTP server stopped: nobody waits for the update any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, (ids, fin, time.time()))

        req = submit(on_update)
        finished = False
        try:
            while not finished:
                ids, fin, emitted = await queue.get()
                finished = fin is not None
                yield ids, fin, req.cached_tokens, {**req.stamps, EMITTED: emitted}
        finally:
            if not finished:
                self.sched.abort(req)


def body_limit(max_model_len: int) -> int:
    """Bytes of the largest body a request may need: 16 per token of the context (a token
    id written as JSON, or an escaped byte of text) plus 1 MiB for everything else."""
    return 16 * max_model_len + (1 << 20)


def _host_port(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.split("://", 1)[1].rpartition(":")
    return host, int(port)
