"""The torch engine's HTTP API: the SGLang 0.5.23 subset pdlab drives (SPEC §6).

The routes both engines share (`cluster.engines.shell.sglang_http`: /health,
/health_generate, /server_info, /model_info, /v1/tokenize, /generate, /v1/completions,
/v1/chat/completions), plus /flush_cache and /pd_role_switch with SGLang's messages.
Differences from the SGLang stand-in: /pd_role_switch keeps the prefix cache (no
AllBlocksCleared) and needs no decode CUDA-graph budget; generation stops at EOS unless
sampling_params.ignore_eos; /v1/completions also takes max_completion_tokens. One
engine-only route sets the eviction order:

    GET  /kv_eviction -> {"policy", "policies", "counted_blocks"}
    POST /kv_eviction {"policy": "lru" | "branch", "branch_counts": {"<block hash>": R_b}}

(counts merge into those already sent; a count of 0 forgets a block), and one inspects the
KV bytes: POST /pdlab/kv_digest {"input_ids"} -> per full page its block hash and the
SHA-256 of its K/V in each tier (tests compare engines with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from cluster.core import ConfigError
from cluster.engines.shell.sglang_http import (
    openai_error,
    role_switch_refusal,
    role_switch_reply,
    sglang_app,
)
from cluster.kv.eviction import EVICTION_POLICIES

if TYPE_CHECKING:
    from cluster.engines.torch.engine import TorchEngine


def create_app(engine: TorchEngine) -> FastAPI:
    app = sglang_app(engine, title="pdlab torch engine")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = engine.inflight == 0 and await engine.call(engine.sched.flush)
        if ok:
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Flush cache failed.\n", status_code=400)

    @app.post("/pd_role_switch")
    async def pd_role_switch(request: Request) -> JSONResponse:
        return await _role_switch(engine, await request.json())

    @app.get("/kv_eviction")
    async def get_eviction() -> dict[str, Any]:
        cache = engine.sched.cache
        return {"policy": cache.policy.name, "policies": EVICTION_POLICIES.names(),
                "counted_blocks": len(cache.counts)}  # fmt: skip

    @app.post("/kv_eviction")
    async def set_eviction(request: Request) -> JSONResponse:
        body = await request.json()
        cache = engine.sched.cache
        name = str(body.get("policy") or cache.policy.name)
        raw = body.get("branch_counts") or {}
        try:
            counts = {int(h): int(c) for h, c in raw.items()}
        except (AttributeError, TypeError, ValueError):
            return openai_error("branch_counts must map block hashes to integer counts")
        try:
            await engine.call(lambda: cache.set_policy(name, counts))
        except ConfigError as e:
            return openai_error(str(e))
        return JSONResponse({"policy": cache.policy.name, "counted_blocks": len(cache.counts)})

    @app.post("/pdlab/kv_digest")
    async def kv_digest(request: Request) -> JSONResponse:
        ids = (await request.json()).get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return openai_error("input_ids must be a list of token ids")
        return JSONResponse({"blocks": await engine.call(lambda: engine.kv_digests(ids))})

    return app


async def _role_switch(engine: TorchEngine, body: dict[str, Any]) -> JSONResponse:
    """SGLang's /pd_role_switch preconditions and reply fields; the cache stays in place."""
    sched = engine.sched
    new_role = str(body.get("new_role") or "").lower()
    old_role = sched.role

    def reply(success: bool, message: str, safe: bool = False) -> JSONResponse:
        return role_switch_reply(
            old_role, new_role, success, message, safe, kept_prefix_cache=success
        )

    refused = role_switch_refusal(engine.enable_pd_role_switch, old_role, new_role)
    if refused is not None:
        return reply(*refused)
    if body.get("prepare_only"):
        return reply(True, "ready", True)
    if engine.inflight:
        return reply(False, "instance is not idle; drain all requests before switching", True)
    problem = await engine.call(lambda: sched.switch_role(new_role))  # type: ignore[arg-type]
    if problem is not None:
        return reply(False, problem, True)
    engine.role = new_role  # type: ignore[assignment]
    return reply(True, "ok")
