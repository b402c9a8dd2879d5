"""The one serve loop of `pdlab serve` (simulated, SGLang, torch) and `pdlab attach`: an HTTP
server on the control server's app, announced, run until Ctrl-C, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    import uvicorn

console = Console(stderr=True)


def http_server(app: Any, *, host: str, port: int, **config: Any) -> uvicorn.Server:
    """A uvicorn server of `app` (lifespan on: the app starts and stops its cluster)."""
    import uvicorn

    return uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **config)
    )


def run_until_stopped(
    server: uvicorn.Server, *, url: str, token: str, banner: str, name: str = "pdlab serve"
) -> None:
    """Announce the server, then serve until Ctrl-C / SIGTERM / SIGHUP stops it gracefully.

    The first line goes to stdout before the server starts, so wrappers (`pdlab lab`, tests)
    can read the URL and token at once; the banner is for people (stderr)."""
    from toolkit.serve.processes import serving

    print(f"{name}: {url} token={token}", flush=True)
    console.print(banner)
    # uvicorn re-raises the SIGINT (SIGTERM, SIGHUP: toolkit.serve.processes) it handled
    with serving(server), contextlib.suppress(KeyboardInterrupt):
        server.run()
