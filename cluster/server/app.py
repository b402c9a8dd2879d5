"""The REST API of the control server (SPEC §6) over a `LiveCluster`, with FastAPI.

Reads are open; every mutating call (phase switch, planner and router settings, planner
apply) needs `Authorization: Bearer <token>` and is checked before its body. Every error is
JSON `{"detail": "<message>"}`: 401 without a valid token, 404 for an unknown node or
branch, 409 when the control plane refuses (node already switching, last node of a phase,
collocated warmup, run ended), 422 for a malformed body or value, naming what is allowed.
Handlers are plain `def`s: FastAPI runs them in its thread pool and each takes the
control-plane lock, so concurrent calls are serialized against each other and the pacing
thread (paper 000 §4.2: switches of one node are decided one at a time).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from cluster.server.errors import ApiError
from cluster.server.live import LiveCluster
from cluster.server.metrics import CONTENT_TYPE, make_registry, render


class PhaseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phase: Literal["prefill", "decode"]


class PlannerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "advise", "off"] | None = None
    window_s: float | None = Field(default=None, gt=0)
    slices: int | None = Field(default=None, ge=2)


class RouterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str | None = None
    copy_price: float | None = Field(default=None, ge=0, description="seconds per token")


class Unauthorized(ApiError):
    status = 401


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body",)) or "body"
        msg = str(e.get("msg", "invalid"))
        got = e.get("input")
        shown = "" if got is None or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{loc}: {msg}{shown}")
    return "invalid request: " + "; ".join(parts)


def create_app(live: LiveCluster, token: str, manage: bool = True) -> FastAPI:
    """The API over `live`. With `manage`, the app starts and stops the cluster (lifespan)."""
    if not token:
        raise ValueError("the server needs a non-empty bearer token")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage:
            live.start()
        try:
            yield
        finally:
            if manage:
                live.stop()

    app = FastAPI(
        title="pdlab control server",
        version="1",
        description="Control plane of a PD-disaggregated cluster (pdlab SPEC §6).",
        lifespan=lifespan,
    )
    app.state.live = live
    registry = make_registry(live)
    bearer = HTTPBearer(auto_error=False)

    def require_token(
        cred: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> None:
        if cred is None or cred.scheme.lower() != "bearer":
            raise Unauthorized(
                "missing bearer token: mutating calls need 'Authorization: Bearer <token>' "
                "(the token pdlab serve printed at start, or $PDLAB_TOKEN)"
            )
        if not secrets.compare_digest(cred.credentials.encode(), token.encode()):
            raise Unauthorized("invalid bearer token")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    auth = [Depends(require_token)]

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return live.health()

    @app.get("/v1/cluster")
    def cluster() -> dict[str, Any]:
        return live.cluster()

    @app.get("/v1/timeline")
    def timeline(since: float = 0.0) -> dict[str, Any]:
        return live.timeline_json(since)

    @app.post("/v1/nodes/{node_id}/phase", dependencies=auth)
    def switch(node_id: int, body: PhaseBody) -> dict[str, Any]:
        return live.switch(node_id, body.phase)

    @app.get("/v1/planner")
    def planner() -> dict[str, Any]:
        return live.planner()

    @app.put("/v1/planner", dependencies=auth)
    def set_planner(body: PlannerBody) -> dict[str, Any]:
        return live.set_planner(body.mode, body.window_s, body.slices)

    @app.post("/v1/planner/apply", dependencies=auth)
    def apply_planner() -> dict[str, Any]:
        return live.apply_planner()

    @app.get("/v1/router")
    def router() -> dict[str, Any]:
        return live.router()

    @app.put("/v1/router", dependencies=auth)
    def set_router(body: RouterBody) -> dict[str, Any]:
        return live.set_router(body.policy, body.copy_price)

    @app.get("/v1/branches")
    def branches(limit: int = 100) -> dict[str, Any]:
        return live.branches(limit)

    @app.get("/v1/branches/{branch_id:path}")
    def branch(branch_id: str) -> dict[str, Any]:
        return live.branch(branch_id)

    @app.get("/v1/directory/stats")
    def directory_stats() -> dict[str, Any]:
        return live.directory_stats()

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    return app
