"""The torch engine's HTTP API: the SGLang 0.5.23 subset pdlab drives (SPEC §6).

The routes both engines share (`cluster.engines.shell.sglang_http`: /health,
/health_generate, /server_info, /model_info, /v1/tokenize, /generate, /v1/completions,
/v1/chat/completions), plus POST /flush_cache and POST /pd_role_switch with SGLang's
messages. Differences from the SGLang stand-in: /pd_role_switch keeps the prefix cache (no
AllBlocksCleared) and needs no decode CUDA-graph budget; generation stops at EOS unless
sampling_params.ignore_eos; /v1/completions also takes max_completion_tokens. One
engine-only route sets the eviction order:

    GET  /kv_eviction -> {"policy", "policies", "counted_blocks", "max_counted_blocks"}
    POST /kv_eviction {"policy": "lru" | "branch", "branch_counts": {"<block hash>": R_b}}

(counts merge into those already sent, a count of 0 forgets a block, an empty map clears
them all; an engine holds at most `max_counted_blocks`), and one inspects the KV bytes:
POST /pdlab/kv_digest {"input_ids"} -> per full page its block hash and the SHA-256 of its
K/V in each tier (tests compare engines with it). The mutations (/flush_cache,
/pd_role_switch, POST /kv_eviction) take JSON only and the engine's token when it has one
(`cluster.engines.shell.guard`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from cluster.core import ConfigError
from cluster.engines.shell.guard import mutation_route
from cluster.engines.shell.http_input import BadRequest, opt_bool, read_json, token_ids
from cluster.engines.shell.sglang_http import (
    openai_error,
    role_switch_refusal,
    role_switch_reply,
    sglang_app,
)
from cluster.kv.eviction import EVICTION_POLICIES

if TYPE_CHECKING:
    from cluster.engines.torch.engine import TorchEngine

MIN_COUNTED_BLOCKS = 4096


def max_counted_blocks(engine: TorchEngine) -> int:
    """Branch counts an engine holds at most: 4x the blocks its two tiers can cache (the
    control plane counts only blocks an engine holds), and at least 4,096."""
    cfg = engine.config
    return max(MIN_COUNTED_BLOCKS, 4 * (cfg.gpu_pages + cfg.host_pages))


def create_app(engine: TorchEngine) -> FastAPI:
    app = sglang_app(
        engine, title="pdlab torch engine", token=engine.token,
        max_body_bytes=engine.max_body_bytes,
    )  # fmt: skip

    async def body_of(request: Request) -> dict[str, Any] | Response:
        try:
            return await read_json(request)
        except BadRequest as e:
            return openai_error(str(e))
        except ClientDisconnect:
            return Response(status_code=499)

    @mutation_route(app, "/flush_cache")
    async def flush_cache() -> Response:
        ok = engine.inflight == 0 and await engine.call(engine.sched.flush)
        if ok:
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Flush cache failed.\n", status_code=400)

    @mutation_route(app, "/pd_role_switch")
    async def pd_role_switch(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        return await _role_switch(engine, body)

    @app.get("/kv_eviction")
    async def get_eviction() -> dict[str, Any]:
        cache = engine.sched.cache
        return {"policy": cache.policy.name, "policies": EVICTION_POLICIES.names(),
                "counted_blocks": len(cache.counts),
                "max_counted_blocks": max_counted_blocks(engine)}  # fmt: skip

    @mutation_route(app, "/kv_eviction")
    async def set_eviction(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        cache = engine.sched.cache
        try:
            name, counts = _eviction_body(body, cache.policy.name, max_counted_blocks(engine))
        except BadRequest as e:
            return openai_error(str(e))
        replace = counts is not None and not counts  # an empty map clears the counts

        def apply() -> str | None:
            merged = {**cache.counts, **(counts or {})}
            held = 0 if replace else sum(1 for c in merged.values() if c > 0)
            limit = max_counted_blocks(engine)
            if held > limit:
                return f"{held} counted blocks would exceed this engine's {limit}"
            cache.set_policy(name, counts, replace=replace)
            return None

        try:
            problem = await engine.call(apply)
        except ConfigError as e:
            return openai_error(str(e))
        if problem is not None:
            return openai_error(problem)
        return JSONResponse({"policy": cache.policy.name, "counted_blocks": len(cache.counts)})

    @app.post("/pdlab/kv_digest")
    async def kv_digest(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        try:
            ids = token_ids(body.get("input_ids"), "input_ids")
        except BadRequest as e:
            return openai_error(str(e))
        return JSONResponse({"blocks": await engine.call(lambda: engine.kv_digests(ids))})

    return app


def _eviction_body(
    body: dict[str, Any], current: str, max_blocks: int
) -> tuple[str, dict[int, int] | None]:
    """(policy, counts or None) of a POST /kv_eviction body (raises BadRequest)."""
    name = body.get("policy")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"policy must be one of: {', '.join(EVICTION_POLICIES.names())}")
    raw = body.get("branch_counts")
    if raw is None:
        return name or current, None
    if not isinstance(raw, dict):
        raise BadRequest("branch_counts must map block hashes to integer counts")
    if len(raw) > max_blocks:
        raise BadRequest(
            f"branch_counts has {len(raw)} blocks; this engine holds counts of at most "
            f"{max_blocks} (send the changes, or {{}} to clear them)"
        )
    counts: dict[int, int] = {}
    for h, c in raw.items():
        try:
            key = int(h)
        except ValueError:
            raise BadRequest(
                f"branch_counts keys must be block hashes (integers), got {h[:40]!r}"
            ) from None
        if not (-(1 << 63) <= key < 1 << 63) or not isinstance(c, int) or isinstance(c, bool):
            raise BadRequest("branch_counts must map int64 block hashes to integer counts")
        counts[key] = c
    return name or current, counts


async def _role_switch(engine: TorchEngine, body: dict[str, Any]) -> JSONResponse:
    """SGLang's /pd_role_switch preconditions and reply fields; the cache stays in place."""
    sched = engine.sched
    raw_role = body.get("new_role")
    new_role = raw_role.lower() if isinstance(raw_role, str) else ""
    old_role = sched.role

    def reply(success: bool, message: str, safe: bool = False) -> JSONResponse:
        return role_switch_reply(
            old_role, new_role, success, message, safe, kept_prefix_cache=success
        )

    refused = role_switch_refusal(engine.enable_pd_role_switch, old_role, new_role)
    if refused is not None:
        return reply(*refused)
    try:
        prepare_only = opt_bool(body, "prepare_only")
    except BadRequest as e:
        return reply(False, str(e), True)
    if prepare_only:
        return reply(True, "ready", True)
    if engine.inflight:
        return reply(False, "instance is not idle; drain all requests before switching", True)
    problem = await engine.call(lambda: sched.switch_role(new_role))  # type: ignore[arg-type]
    if problem is not None:
        return reply(False, problem, True)
    engine.role = new_role  # type: ignore[assignment]
    return reply(True, "ok")
