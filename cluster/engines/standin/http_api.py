"""The stand-in's HTTP API: SGLang 0.5.23's routes over a `StandinEngine` (SPEC §6).

The routes both engines share (`cluster.engines.shell.sglang_http`: /health,
/health_generate, /server_info, /model_info, /v1/tokenize, /generate, /v1/completions,
/v1/chat/completions), plus /flush_cache, /pd_role_switch (`role_switch`) and the
stand-in-only GET /standin/requests listing the generation requests received (rid, route,
role, bootstrap fields) so tests can check what a router sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from cluster.engines.shell.guard import mutation_route
from cluster.engines.shell.http_input import BadRequest, read_json
from cluster.engines.shell.sglang_http import openai_error, sglang_app
from cluster.engines.standin.role_switch import role_switch

if TYPE_CHECKING:
    from cluster.engines.standin.server import StandinEngine


def standin_app(engine: StandinEngine) -> FastAPI:
    """The stand-in's SGLang HTTP API over `engine` (module docstring lists the routes)."""
    # SGLang's CompletionRequest bounds the output by max_tokens alone.
    app = sglang_app(
        engine, title="SGLang stand-in", token=engine.token,
        max_body_bytes=engine.max_body_bytes, completions_max_fields=("max_tokens",),
    )  # fmt: skip

    @app.get("/standin/requests")
    async def standin_requests(limit: int = 1000) -> dict[str, Any]:
        items = list(engine.received)
        return {"requests": items[-limit:] if limit > 0 else []}

    @mutation_route(app, "/flush_cache")
    async def flush_cache() -> Response:
        sched = engine.sched

        def flush() -> bool:
            if engine.inflight or sched.waiting or sched.running:
                return False
            sched.cache.reset()
            return True

        if sched.run_exclusive(flush):
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there "
                "are running or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse("Flush cache failed.\n", status_code=400)

    @mutation_route(app, "/pd_role_switch")
    async def pd_role_switch(request: Request) -> Response:
        try:
            body = await read_json(request)
        except BadRequest as e:
            return openai_error(str(e))
        except ClientDisconnect:
            return Response(status_code=499)
        return role_switch(engine, body)

    return app
