"""The control server's door: the bearer token and the body size, before a body is read (SPEC §6).

`RequestGuard` is an ASGI middleware in front of the FastAPI app. For a request to one of the
control API's routes it answers before any byte of the body is read (so an unauthenticated or
oversized body is never buffered):

- 401 when the route mutates (it needs `Authorization: Bearer <token>`) and the token is
  missing or wrong;
- 413 when `Content-Length` exceeds `max_body_bytes` (`MAX_BODY_BYTES`, 4 KiB: the largest
  control body is a few dozen bytes), or, for a body sent without a length (chunked), as
  soon as the bytes received pass it.

Requests to other routes (an engine's data plane mounted on the same app, with bodies of its
own size and no token) pass through untouched. Answers are JSON `{"detail": ...}` like every
other error of the API.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.http_door import answer, counting_receive, length_refusal, request_headers

MAX_BODY_BYTES = 4096
MISSING_TOKEN = (
    "missing bearer token: mutating calls need 'Authorization: Bearer <token>' "
    "(the token pdlab serve printed at start, or $PDLAB_TOKEN)"
)
INVALID_TOKEN = "invalid bearer token"


def token_problem(authorization: str | None, token: str) -> str | None:
    """None when `authorization` (the header's value) carries `token`; else why not."""
    if not authorization:
        return MISSING_TOKEN
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return MISSING_TOKEN
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        return INVALID_TOKEN
    return None


def too_large(max_body_bytes: int) -> str:
    return f"request body too large: the control API accepts at most {max_body_bytes} bytes"


class RequestGuard:
    """See module docstring. `routes()` lists the control API's routes and whether each
    mutates; it is read per request, so routes added after the app was built count too."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        routes: Callable[[], Sequence[tuple[BaseRoute, bool]]],
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.token = token
        self.routes = routes
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mutates = self._mutates(scope)
        if mutates is None:  # not a control route
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        if mutates:
            problem = token_problem(headers.get("authorization"), self.token)
            if problem is not None:
                await answer(send, 401, problem, [(b"www-authenticate", b"Bearer")])
                return
        limit, refused = self.max_body_bytes, too_large(self.max_body_bytes)
        refusal = length_refusal(headers, limit, refused)
        if refusal is not None:
            await answer(send, *refusal)
            return
        await self.app(scope, counting_receive(receive, limit, refused), send)

    def _mutates(self, scope: Scope) -> bool | None:
        """Whether the control route `scope` asks for mutates; None: no control route."""
        for route, mutates in self.routes():
            if route.matches(scope)[0] is Match.FULL:
                return mutates
        return None
