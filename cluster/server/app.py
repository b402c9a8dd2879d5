"""The REST API of the control server (SPEC §6) over a `ControlService`, with FastAPI.

Reads are open; every mutating call (phase switch, planner and router settings, planner
apply) needs `Authorization: Bearer <token>`. `RequestGuard` (guard.py) checks the token and
the body's size before a body is read: 401 first, 413 beyond `MAX_BODY_BYTES` (4 KiB). Every
parameter is bounded (`REST_BOUNDS`: the control plane's own ranges of cluster/control/bounds.py
plus node ids, `since`, `limit` and string lengths). Every error is JSON
`{"detail": "<message>"}`: 401 without a valid token, 404 for an unknown node or branch, 409
when the control plane refuses (node already switching, last node of a phase, collocated
warmup, run ended), 413 for a body over the limit, 422 for a malformed body or value, naming
what is allowed (input echoed at most `ECHO_CHARS` characters), 503 before the cluster
started or after a failure stopped its run. No page served loads anything from the network:
the interactive docs (/docs, Swagger UI) load their scripts from this server
(`fastapi_offline` ships them; FastAPI's own page would fetch them from a CDN), beside
/openapi.json; Swagger UI's online validator is off. /redoc stays off (ReDoc draws its logo
from a CDN).

Handlers are plain `def`s: FastAPI runs them in its thread pool and each takes the
control-plane lock, so concurrent calls are serialized against each other and the pacing
thread (paper 000 §4.2: switches of one node are decided one at a time).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field
from starlette.routing import BaseRoute

from cluster.control.bounds import COPY_PRICE_S_PER_TOKEN, SLICES, WINDOW_S, Range
from cluster.server.errors import ApiError, clip
from cluster.server.guard import MAX_BODY_BYTES, RequestGuard, token_problem
from cluster.server.metrics import CONTENT_TYPE, make_registry, render
from cluster.server.service import ControlService

ECHO_CHARS = 80  # input quoted back in a 422 message, at most
NAME_CHARS = 64  # router policy names
BRANCH_ID_CHARS = 256
REST_BOUNDS: dict[str, Range] = {
    "window_s": WINDOW_S,
    "slices": SLICES,
    "copy_price": COPY_PRICE_S_PER_TOKEN,
    "node_id": Range(0, 2**31 - 1),
    "since": Range(0.0, 1e9, "s"),
    "limit": Range(0, 10_000, "branch ids"),
}


def _within(name: str) -> dict[str, Any]:
    r = REST_BOUNDS[name]
    return {"ge": r.lo, "le": r.hi, "description": f"in {r.describe()}"}


# Path and query parameters (module level: the handlers' annotations are resolved by name).
NodeId = Annotated[int, Path(**_within("node_id"))]
BranchId = Annotated[str, Path(min_length=1, max_length=BRANCH_ID_CHARS)]
Since = Annotated[float, Query(allow_inf_nan=False, **_within("since"))]
Limit = Annotated[int, Query(**_within("limit"))]


class PhaseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phase: Literal["prefill", "decode"]


class PlannerBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    mode: Literal["auto", "advise", "off"] | None = None
    window_s: float | None = Field(
        default=None, ge=WINDOW_S.lo, le=WINDOW_S.hi, description=f"in {WINDOW_S.describe()}"
    )
    slices: int | None = Field(
        default=None, ge=SLICES.lo, le=SLICES.hi, description=f"in {SLICES.describe()}"
    )


class RouterBody(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    policy: str | None = Field(default=None, min_length=1, max_length=NAME_CHARS)
    copy_price: float | None = Field(
        default=None,
        ge=COPY_PRICE_S_PER_TOKEN.lo,
        le=COPY_PRICE_S_PER_TOKEN.hi,
        description=f"kappa, in {COPY_PRICE_S_PER_TOKEN.describe()}",
    )


class Unauthorized(ApiError):
    status = 401


def _validation_message(exc: RequestValidationError, max_errors: int = 5) -> str:
    """One line per error: where, what pydantic says, the allowed range, the input (clipped)."""
    errors = exc.errors()
    parts = []
    for e in errors[:max_errors]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        where = clip(".".join(loc) or "body", ECHO_CHARS)
        msg = clip(str(e.get("msg", "invalid")), 2 * ECHO_CHARS)
        bound = REST_BOUNDS.get(loc[-1]) if loc else None
        allowed = f"; allowed: {bound.describe()}" if bound is not None else ""
        got = e.get("input")
        shown = (
            "" if got is None or isinstance(got, dict) else f" (got {clip(repr(got), ECHO_CHARS)})"
        )
        parts.append(f"{where}: {msg}{allowed}{shown}")
    if len(errors) > max_errors:
        parts.append(f"... and {len(errors) - max_errors} more")
    return "invalid request: " + "; ".join(parts)


def create_app(
    service: ControlService,
    token: str,
    manage: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The API over `service`. With `manage`, the app starts and stops it (lifespan).

    A composition root may add routes of its own (an engine's data plane) to the app; the
    guard leaves them alone (no token, their own body sizes).
    """
    if not token:
        raise ValueError("the server needs a non-empty bearer token")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage:
            service.start()
        try:
            yield
        finally:
            if manage:
                service.stop()

    app = FastAPIOffline(
        title="pdlab control server",
        version="1",
        description=(
            "Control plane of a PD-disaggregated cluster (pdlab SPEC §6). Mutating calls need "
            f"'Authorization: Bearer <token>'; bodies are at most {max_body_bytes} bytes."
        ),
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # it would send the schema off-host
        redoc_url=None,
    )
    app.state.service = service
    registry = make_registry(service)
    bearer = HTTPBearer(auto_error=False)
    control_routes: list[tuple[BaseRoute, bool]] = []  # (route, mutates), for the guard

    def require_token(
        request: Request,
        cred: HTTPAuthorizationCredentials | None = Depends(bearer),  # in the OpenAPI schema
    ) -> None:
        # The guard checked it before the body was read; checked again where it is declared.
        problem = token_problem(request.headers.get("authorization"), token)
        if problem is not None:
            raise Unauthorized(problem)

    def route(method: str, path: str, mutates: bool = False) -> Callable[[Any], Any]:
        def register(handler: Any) -> Any:
            deps = [Depends(require_token)] if mutates else None
            app.add_api_route(path, handler, methods=[method], dependencies=deps)
            control_routes.append((app.router.routes[-1], mutates))
            return handler

        return register

    app.add_middleware(
        RequestGuard,
        token=token,
        routes=lambda: control_routes,
        max_body_bytes=max_body_bytes,
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @route("GET", "/v1/health")
    def health() -> dict[str, Any]:
        return service.health()

    @route("GET", "/v1/cluster")
    def cluster() -> dict[str, Any]:
        return service.cluster()

    @route("GET", "/v1/timeline")
    def timeline(since: Since = 0.0) -> dict[str, Any]:
        return service.timeline_json(since)

    @route("POST", "/v1/nodes/{node_id}/phase", mutates=True)
    def switch(node_id: NodeId, body: PhaseBody) -> dict[str, Any]:
        return service.switch(node_id, body.phase)

    @route("GET", "/v1/planner")
    def planner() -> dict[str, Any]:
        return service.planner()

    @route("PUT", "/v1/planner", mutates=True)
    def set_planner(body: PlannerBody) -> dict[str, Any]:
        return service.set_planner(body.mode, body.window_s, body.slices)

    @route("POST", "/v1/planner/apply", mutates=True)
    def apply_planner() -> dict[str, Any]:
        return service.apply_planner()

    @route("GET", "/v1/router")
    def router() -> dict[str, Any]:
        return service.router()

    @route("PUT", "/v1/router", mutates=True)
    def set_router(body: RouterBody) -> dict[str, Any]:
        return service.set_router(body.policy, body.copy_price)

    @route("GET", "/v1/branches")
    def branches(limit: Limit = 100) -> dict[str, Any]:
        return service.branches(limit)

    @route("GET", "/v1/branches/{branch_id:path}")
    def branch(branch_id: BranchId) -> dict[str, Any]:
        return service.branch(branch_id)

    @route("GET", "/v1/directory/stats")
    def directory_stats() -> dict[str, Any]:
        return service.directory_stats()

    @route("GET", "/metrics")
    def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    return app
