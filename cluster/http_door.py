"""What the two HTTP doors share (the engine's `cluster/engines/shell/guard.py` and the
control server's `cluster/server/guard.py`, SPEC §6): reading the headers of an ASGI scope,
refusing a Content-Length over the limit before any byte of the body is read, counting a
body sent without a length, and answering in JSON `{"detail": ...}`.

Beside `core.py`: both doors sit in layers that must not import each other.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

BAD_LENGTH = "Content-Length must be a non-negative integer"


def request_headers(scope: Scope) -> dict[str, str]:
    """The scope's headers, names lower-cased, the first of repeated ones kept."""
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        out.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def length_refusal(headers: dict[str, str], limit: int, too_large: str) -> tuple[int, str] | None:
    """(status, detail) when the declared Content-Length is malformed (400) or over `limit`
    (413, `too_large`); None when there is none or it fits."""
    length = headers.get("content-length")
    if length is None:
        return None
    if not length.isdigit():
        return 400, BAD_LENGTH
    if int(length) > limit:
        return 413, too_large
    return None


def counting_receive(receive: Receive, limit: int, too_large: str) -> Receive:
    """`receive` that refuses a body sent without a length once its bytes pass `limit`."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise HTTPException(413, too_large)
        return message

    return counted


async def answer(
    send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A JSON `{"detail": detail}` response with `status` (and `extra` headers)."""
    body = json.dumps({"detail": detail}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
