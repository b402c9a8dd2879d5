"""Bodies and auth at the door (cluster/server/guard.py), against a real `pdlab serve`.

Raw sockets show what happens *before* a body is read: a client announces 300 MB and sends
1 KiB; the server must answer 401 (no token) or 413 (too large) at once instead of waiting
to buffer the rest. Also: chunked bodies are counted, 422 answers quote at most 80
characters of the input, and no page loads anything from the network (/docs loads its
scripts from the server, /redoc is off).
"""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from cluster.server.guard import MAX_BODY_BYTES
from toolkit.client import ServerProcess

HUGE = 300_000_000


def exchange(server: ServerProcess, head: bytes, chunks: list[bytes], timeout_s: float = 5.0) -> tuple[int, dict]:  # fmt: skip
    """Send `head` and `chunks` (ignoring a peer that closes early); the answer's status and
    JSON body. A server that waits for the rest of the body fails with a timeout."""
    url = urlsplit(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout_s) as s:
        s.sendall(head)
        for chunk in chunks:
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected(data):
            got = s.recv(65536)
            if not got:
                break
            data += got
    status_line, _, rest = data.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


def _expected(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(data) + 1


def request_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_an_unauthenticated_body_is_refused_before_it_is_read(server: ServerProcess) -> None:
    head = request_head("/v1/nodes/0/phase", {"Content-Type": "application/json",
                                              "Content-Length": str(HUGE)})  # fmt: skip
    status, body = exchange(server, head, [b"x" * 1024])
    assert status == 401 and body["detail"].startswith("missing bearer token")
    head = request_head("/v1/planner/apply", {"Authorization": "Bearer wrong",
                                              "Content-Length": str(HUGE)})  # fmt: skip
    status, body = exchange(server, head, [b"x" * 1024])
    assert status == 401 and body == {"detail": "invalid bearer token"}


def test_a_body_over_the_limit_is_413_before_it_is_read(
    server: ServerProcess, auth: dict[str, str]
) -> None:
    head = request_head("/v1/nodes/0/phase", {**auth, "Content-Length": str(HUGE)})
    status, body = exchange(server, head, [b"x" * 1024])
    assert status == 413 and body == {
        "detail": f"request body too large: the control API accepts at most {MAX_BODY_BYTES} bytes"
    }


def test_a_chunked_body_is_counted_and_cut_at_the_limit(
    server: ServerProcess, auth: dict[str, str]
) -> None:
    head = request_head("/v1/router", {**auth, "Transfer-Encoding": "chunked",
                                       "Content-Type": "application/json"})  # fmt: skip
    head = head.replace(b"POST", b"PUT", 1)
    chunk = b"%x\r\n%s\r\n" % (1024, b" " * 1024)
    status, body = exchange(server, head, [chunk] * 6 + [b"0\r\n\r\n"])
    assert status == 413 and "at most 4096 bytes" in body["detail"]
    # Under the limit, a chunked body is an ordinary request.
    payload = b'{"policy": "ttft"}'
    status, body = exchange(server, head, [b"%x\r\n%s\r\n" % (len(payload), payload), b"0\r\n\r\n"])
    assert status == 200 and body["policy"] == "ttft"


def test_reads_need_no_token_and_a_small_body_passes(
    http: httpx.Client, auth: dict[str, str]
) -> None:
    assert http.get("/v1/health").status_code == 200
    r = http.put("/v1/planner", json={"mode": "advise"}, headers=auth)
    assert r.status_code == 200
    r = http.put("/v1/planner", content=b" " * (MAX_BODY_BYTES + 1), headers=auth)
    assert r.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        {"policy": "p" * 3000},
        {"copy_price": "9" * 3000},
        {"k" * 3000: 1},
        {"mode": ["auto"] * 500},
    ],
)
def test_422_messages_quote_at_most_80_characters_of_input(
    http: httpx.Client, auth: dict[str, str], body: dict
) -> None:
    r = http.put("/v1/router" if "mode" not in body else "/v1/planner", json=body, headers=auth)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert len(detail) < 400, detail
    assert "…" in detail and "p" * 81 not in detail and "9" * 81 not in detail


def test_no_page_reaches_the_network_and_the_schema_stays(http: httpx.Client) -> None:
    # The interactive docs load every script and style from this server (no CDN).
    r = http.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "http://" not in r.text and "https://" not in r.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert assets and all(a.startswith("/") for a in assets), assets
    for a in assets:
        assert http.get(a).status_code == 200, a
    assert '"validatorUrl": null' in r.text  # Swagger UI sends no schema off-host
    assert http.get("/redoc").status_code == 404  # ReDoc would draw its logo from a CDN
    schema = http.get("/openapi.json")
    assert schema.status_code == 200
    assert "/v1/planner" in schema.json()["paths"]
    assert "cdn" not in schema.text and "https://" not in schema.text
    planner = schema.json()["components"]["schemas"]["PlannerBody"]["properties"]
    assert "in [2, 100] slices" in json.dumps(planner["slices"])
