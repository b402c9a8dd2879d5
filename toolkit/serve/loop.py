"""The one serve loop of `pdlab serve` (simulated, SGLang, torch) and `pdlab attach`: an HTTP
server on the control server's app, announced, run until Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING, Any

from rich.console import Console

from cluster.core import ConfigError

if TYPE_CHECKING:
    import uvicorn

console = Console(stderr=True)


def http_server(app: Any, *, host: str, port: int, **config: Any) -> uvicorn.Server:
    """A uvicorn server of `app` (lifespan on: the app starts and stops its cluster)."""
    import uvicorn

    return uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **config)
    )


def bind_port(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound at once: a composition root binds it before it
    starts engines, whose own ephemeral ports (PD bootstrap, ZMQ streams) could otherwise take
    the port a caller picked free a moment earlier (seen in CI: errno 98 after the engines
    were up). A port in use is a one-line ConfigError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def run_until_stopped(
    server: uvicorn.Server,
    *,
    url: str,
    token: str,
    banner: str,
    name: str = "pdlab serve",
    listen: socket.socket | None = None,
) -> None:
    """Announce the server, then serve until Ctrl-C / SIGTERM / SIGHUP stops it gracefully.

    The first line goes to stdout before the server starts, so wrappers (`pdlab lab`, tests)
    can read the URL and token at once; the banner is for people (stderr). `listen`: the
    socket `bind_port` bound (else uvicorn binds host:port itself when it starts)."""
    from toolkit.serve.processes import serving

    print(f"{name}: {url} token={token}", flush=True)
    console.print(banner)
    # uvicorn re-raises the SIGINT (SIGTERM, SIGHUP: toolkit.serve.processes) it handled
    with serving(server), contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=None if listen is None else [listen])
