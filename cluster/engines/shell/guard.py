"""The engine's door: body size, and who may change the engine (SPEC §6).

`EngineGuard` is an ASGI middleware in front of an engine's HTTP app (and its PD bootstrap
server). It answers before any byte of a body is read:

- 413 when `Content-Length` exceeds `max_body_bytes`, or, for a body sent without a length
  (chunked), as soon as the bytes received pass it (the limit is in the message);
- for a mutation (a route registered with `mutation_route`: /flush_cache, /kv_eviction,
  /pd_role_switch, ...): 401 without `Authorization: Bearer <token>` when the engine has a
  token, then 415 unless the body is sent as `application/json`. A browser sends JSON only
  after a CORS preflight this server never grants, so no web page open on the machine can
  drive an engine (binding to loopback does not stop a browser); mutations are POST only.

`pdlab engine` always has a token (`--token`, $PDLAB_ENGINE_TOKEN, else one it generates);
`pdlab serve --engines torch` passes its engines one and sends it with every call. Reads
and generation need none, like SGLang without --api-key. Answers are JSON `{"detail": ...}`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.http_door import answer, counting_receive, length_refusal, request_headers

H = TypeVar("H", bound=Callable[..., Any])
TOKEN_ENV = "PDLAB_ENGINE_TOKEN"
MISSING_TOKEN = (
    "missing bearer token: this engine's mutating calls need 'Authorization: Bearer <token>' "
    f"(pdlab engine --token, ${TOKEN_ENV}, or the token file it printed at start)"
)
INVALID_TOKEN = "invalid bearer token"
NOT_JSON = "mutating calls take a JSON body: send it with Content-Type: application/json"
READS = frozenset({"GET", "HEAD"})


def too_large(max_body_bytes: int) -> str:
    return f"request body too large: this engine accepts at most {max_body_bytes} bytes"


def token_problem(authorization: str | None, token: str) -> str | None:
    """None when `authorization` (the header's value) carries `token`; else why not."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return MISSING_TOKEN
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        return INVALID_TOKEN
    return None


def engine_token(given: str | None) -> tuple[str, bool]:
    """(the token, whether it was generated): `given` (--token or $PDLAB_ENGINE_TOKEN),
    else a new random one."""
    if given is not None:
        if not given.strip():
            raise ValueError(f"the engine token is empty: pass --token or set ${TOKEN_ENV}")
        return given.strip(), False
    return secrets.token_urlsafe(18), True


def token_dir() -> Path:
    """Where generated engine tokens are written: $XDG_RUNTIME_DIR/pdlab, else
    ~/.cache/pdlab (created private to the user)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "pdlab"


def write_token_file(token: str, name: str) -> Path:
    """Write `token` to `token_dir()/name`, readable by the user alone; its path."""
    d = token_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = d / name
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale file (or a planted link) is not reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def mutation_route(app: FastAPI, path: str) -> Callable[[H], H]:
    """Register the decorated handler as POST `path`, a mutation the app's guard checks."""

    def register(handler: H) -> H:
        app.state.mutations.add(path)
        app.add_api_route(path, handler, methods=["POST"])
        return handler

    return register


def guard_app(app: FastAPI, *, token: str | None, max_body_bytes: int) -> FastAPI:
    """Put `EngineGuard` in front of `app`; routes added with `mutation_route` are checked."""
    app.state.mutations = set()
    app.add_middleware(
        EngineGuard, mutations=app.state.mutations, token=token, max_body_bytes=max_body_bytes
    )
    return app


class EngineGuard:
    """See module docstring. `mutations` may gain paths after the app is built."""

    def __init__(
        self, app: ASGIApp, *, mutations: Collection[str], token: str | None, max_body_bytes: int
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        if token is not None and not token:
            raise ValueError("an engine token must not be empty")
        self.app = app
        self.mutations = mutations
        self.token = token
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = request_headers(scope)
        if scope["path"] in self.mutations and scope["method"] not in READS:
            problem = None if self.token is None else token_problem(
                headers.get("authorization"), self.token
            )  # fmt: skip
            if problem is not None:
                await answer(send, 401, problem, [(b"www-authenticate", b"Bearer")])
                return
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                await answer(send, 415, NOT_JSON)
                return
        limit, refused = self.max_body_bytes, too_large(self.max_body_bytes)
        refusal = length_refusal(headers, limit, refused)
        if refusal is not None:
            await answer(send, *refusal)
            return
        await self.app(scope, counting_receive(receive, limit, refused), send)
