"""A small httpx client of the control server's REST API (SPEC §6), for notebooks and widgets.

Every method returns the decoded JSON. A refusal of the server (4xx/5xx) raises
`PdlabApiError` carrying the status and the server's message; an unreachable server raises
it with `status=None`, so callers (the dashboard) show one kind of error, not tracebacks.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

URL_ENV = "PDLAB_URL"
TOKEN_ENV = "PDLAB_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8600"


class PdlabApiError(RuntimeError):
    """The server refused a call (`status` is its HTTP status) or could not be reached (None)."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(detail if status is None else f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class PdlabClient:
    """Client of one `pdlab serve`. `token` is needed for mutating calls only."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    @classmethod
    def from_env(cls, timeout_s: float = 10.0) -> PdlabClient:
        """Server URL from $PDLAB_URL (default 127.0.0.1:8600), token from $PDLAB_TOKEN."""
        return cls(
            os.environ.get(URL_ENV, DEFAULT_URL), os.environ.get(TOKEN_ENV) or None, timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PdlabClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = self._http.request(method, path, json=body, headers=headers)
        except httpx.TransportError as err:
            raise PdlabApiError(None, f"cannot reach {self.url}{path}: {err}") from None
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise PdlabApiError(resp.status_code, str(detail))
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    # ---- reads ---------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def cluster(self) -> dict[str, Any]:
        return self._call("GET", "/v1/cluster")

    def timeline(self, since: float = 0.0) -> dict[str, Any]:
        return self._call("GET", f"/v1/timeline?since={since}")

    def planner(self) -> dict[str, Any]:
        return self._call("GET", "/v1/planner")

    def router(self) -> dict[str, Any]:
        return self._call("GET", "/v1/router")

    def branches(self, limit: int = 100) -> dict[str, Any]:
        return self._call("GET", f"/v1/branches?limit={limit}")

    def branch(self, branch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/branches/{branch_id}")

    def directory_stats(self) -> dict[str, Any]:
        return self._call("GET", "/v1/directory/stats")

    def metrics(self) -> str:
        """The Prometheus exposition text of `/metrics`."""
        return str(self._call("GET", "/metrics"))

    # ---- mutations (bearer token) --------------------------------------------------------------
    def switch(self, node: int, phase: str) -> dict[str, Any]:
        """Switch `node` to `phase` ('prefill' | 'decode'); logged with trigger 'manual'."""
        return self._call("POST", f"/v1/nodes/{node}/phase", {"phase": phase})

    def set_planner(
        self, mode: str | None = None, window_s: float | None = None, slices: int | None = None
    ) -> dict[str, Any]:
        body = {"mode": mode, "window_s": window_s, "slices": slices}
        return self._call("PUT", "/v1/planner", {k: v for k, v in body.items() if v is not None})

    def apply_planner(self) -> dict[str, Any]:
        """Evaluate the planner now and start the switches of its recommended split."""
        return self._call("POST", "/v1/planner/apply")

    def set_router(
        self, policy: str | None = None, copy_price: float | None = None
    ) -> dict[str, Any]:
        body = {"policy": policy, "copy_price": copy_price}
        return self._call("PUT", "/v1/router", {k: v for k, v in body.items() if v is not None})

    # ---- helpers ---------------------------------------------------------------------------
    def wait_for_phase(self, node: int, phase: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll until `node` serves `phase` with no switch pending; returns its node state."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            state = next(n for n in self.cluster()["nodes"] if n["id"] == node)
            if state["phase"] == phase and state["switching"] is None:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"node {node} still {state['phase']} (switching: {state['switching']}) "
                    f"after {timeout_s:.0f} s"
                )
            time.sleep(0.2)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A `pdlab serve` subprocess started by `launch_server`; `stop()` ends it cleanly."""

    def __init__(self, proc: Any, url: str, token: str, db: str | None, log_path: str) -> None:
        self.proc = proc
        self.url = url
        self.token = token
        self.db = db
        self.log_path = log_path

    def client(self, timeout_s: float = 10.0) -> PdlabClient:
        return PdlabClient(self.url, self.token, timeout_s)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGINT (the server finishes the run and consolidates its telemetry), then SIGKILL."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_server(
    *args: str,
    port: int | None = None,
    token: str | None = None,
    db: str | os.PathLike[str] | None = None,
    speed: float = 10.0,
    timeout_s: float = 60.0,
) -> ServerProcess:
    """Start `pdlab serve` on loopback with `args` (simulation options) and wait until healthy.

    Used by notebooks that are not given a server ($PDLAB_URL) and by the tests. The server's
    output goes to a temporary log file, quoted in the error if it does not come up. It stops
    by itself (closing its run) when this process ends without stopping it (`--parent-pid`):
    a notebook's kernel shut down mid-run leaves no server behind.
    """
    import secrets
    import subprocess
    import sys
    import tempfile
    import time

    port = port or free_port()
    token = token or secrets.token_urlsafe(12)
    cmd = [sys.executable, "-m", "toolkit.cli", "serve", "--port", str(port), "--token", token,
           "--speed", str(speed), "--parent-pid", str(os.getpid()),
           *(["--db", str(db)] if db is not None else []), *args]  # fmt: skip
    with tempfile.NamedTemporaryFile(
        "wb", prefix="pdlab-serve-", suffix=".log", delete=False
    ) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = ServerProcess(
        proc, f"http://127.0.0.1:{port}", token, None if db is None else str(db), log.name
    )
    deadline = time.monotonic() + timeout_s
    with server.client(timeout_s=2.0) as c:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"pdlab serve exited with {proc.returncode}:\n{server.log()[-3000:]}"
                )
            try:
                if c.health()["status"] == "ok":
                    return server
            except PdlabApiError:
                pass
            if time.monotonic() > deadline:
                server.stop(5)
                raise RuntimeError(
                    f"pdlab serve did not become healthy in {timeout_s:.0f} s:\n{server.log()[-3000:]}"
                )
            time.sleep(0.2)


def switchable(state: dict[str, Any]) -> list[tuple[int, str]]:
    """(node, target phase) pairs a manual switch may take now: the node is not switching or
    out of service, and another available node keeps serving its current phase."""
    nodes = state["nodes"]
    avail = [n for n in nodes if n["switching"] is None and not n["out_of_service"]]
    out = []
    for n in avail:
        peers = [m for m in avail if m["phase"] == n["phase"] and m["id"] != n["id"]]
        if peers:
            out.append((int(n["id"]), "decode" if n["phase"] == "prefill" else "prefill"))
    return out
