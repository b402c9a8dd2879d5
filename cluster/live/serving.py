"""Serving a live SGLang cluster over HTTP: its data plane and a loopback server (SPEC §6).

`add_data_plane` mounts the proxy's routes on an app; `pdlab serve --sglang`
(toolkit/serve/sglang.py) mounts them on the control server's app, so the REST API
and the data plane share one port. `ServerThread` runs an app with uvicorn on a loopback
socket from a background thread (tests, scripts/gpu_check.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

from cluster.live.tokens import ROUTES

if TYPE_CHECKING:
    from cluster.live.cluster import SGLangCluster


def add_data_plane(app: Any, cluster: SGLangCluster) -> None:
    """Mount the data plane of `cluster` on a FastAPI `app`: /generate, /v1/completions,
    /v1/chat/completions, POST /v1/branches/{id}/finish, GET /health and GET /v1/models.

    Data-plane routes need no token, like SGLang's routers. The app's lifespan is extended
    to close the proxy's HTTP clients on shutdown (after the app's own lifespan ends).
    """
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        async with inner(a):
            try:
                yield
            finally:
                if cluster.proxy is not None:
                    await cluster.proxy.aclose()

    app.router.lifespan_context = lifespan
    app.state.sglang = cluster

    def not_started() -> JSONResponse:
        return JSONResponse({"detail": "the SGLang cluster has not started yet"}, 503)

    # The proxy exists once the cluster started: these routes look it up per call.
    def forward(route: str) -> Any:
        async def handle(request: Request) -> Any:
            if cluster.proxy is None:
                return not_started()
            return await cluster.proxy.handle(route, request)

        handle.__name__ = "data_" + route.strip("/").replace("/", "_")
        return handle

    for route in ROUTES:
        app.add_api_route(route, forward(route), methods=["POST"])

    async def finish_branch(branch_id: str) -> Any:
        if cluster.proxy is None:
            return not_started()
        return await cluster.proxy.finish_branch(branch_id)

    async def data_health() -> Any:
        if cluster.proxy is None:
            return not_started()
        return await cluster.proxy.health()

    async def list_models() -> Any:
        if cluster.proxy is None:
            return not_started()
        return models_json(cluster)

    app.add_api_route("/v1/branches/{branch_id:path}/finish", finish_branch, methods=["POST"])
    app.add_api_route("/health", data_health, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])


def models_json(cluster: SGLangCluster) -> dict[str, Any]:
    """OpenAI's `GET /v1/models` answer: the models the engines serve (their
    `served_model_name` from /server_info), each once, in node order. Clients (the `openai`
    SDK, LangChain, benchmark tools) probe it before sending requests."""
    engines = sorted(cluster.config.engines, key=lambda e: e.node_id)
    names = dict.fromkeys(e.name for e in engines if e.name)
    created = int(cluster.run_start_wall)
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "pdlab", "root": n}
            for n in names
        ],
    }


class ServerThread:
    """Serve an ASGI app with uvicorn on a loopback socket from a background thread.

    Used by tests and `scripts/gpu_check.py`; `pdlab serve --sglang` runs uvicorn itself.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
        # and without it every keep-alive response waits ~40 ms for a delayed ACK.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see its log)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {timeout_s:.0f} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30.0)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ServerThread", "add_data_plane", "models_json"]
