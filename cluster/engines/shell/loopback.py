"""A uvicorn server on a pre-bound loopback socket, run on its own thread (an engine's HTTP
API and its PD bootstrap server)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class LoopbackServer:
    """A uvicorn server on a pre-bound loopback socket, run on its own thread."""

    def __init__(self, app: FastAPI, host: str, port: int, *, name: str = "HTTP server") -> None:
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
        # and without it every keep-alive response waits ~40 ms for a delayed ACK.
        self.name = name
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10.0
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the {self.name} did not start")
            time.sleep(0.01)

    def request_stop(self) -> None:
        """Ask the server to wind down without waiting (several can wind down at once)."""
        self.server.should_exit = True

    def stop(self) -> None:
        self.request_stop()
        self.thread.join(5.0)
        self.sock.close()
