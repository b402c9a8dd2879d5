"""SGLang 0.5.23's HTTP subset over any engine that meets `SGLangEngine` (SPEC §6).

`sglang_app` serves /health, /health_generate, /metrics (SGLang's Prometheus names, when the
engine has `serving_metrics`), /server_info (/get_server_info),
/model_info (/get_model_info), /v1/tokenize (/tokenize), /generate (text or input_ids; SSE
with "stream"), /v1/completions and /v1/chat/completions with SGLang's request fields,
response shapes (meta_info with prompt_tokens, completion_tokens, cached_tokens; OpenAI
usage with `prompt_tokens_details.cached_tokens`), SSE framing (`data: ...` events ending
with `data: [DONE]`) and error bodies; the engine adds /flush_cache, /pd_role_switch
(answered with `role_switch_reply` after `role_switch_refusal`) and routes of its own.
Token ids are the toy byte tokenizer's (`cluster.wire.toy_tokenizer`).

Bodies are checked at the door (`http_input`): a malformed one gets 400 with a one-line
message, an oversized one 413 before it is read, a mutation without the engine's token 401
(`guard`). A client that disconnects aborts its request, streamed or not, queued or
running: the engine frees its KV and its seat (`EngineShell.updates`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from cluster.engines.shell.guard import guard_app
from cluster.engines.shell.http_input import (
    BadRequest,
    GenerateInput,
    chat_ids,
    encode_text,
    generate_input,
    openai_input,
    read_json,
    until_disconnected,
)
from cluster.engines.shell.lifecycle import Update
from cluster.engines.shell.serving_metrics import CONTENT_TYPE
from cluster.engines.shell.stamps import RECEIVED, Stamps
from cluster.wire import toy_tokenizer


class SGLangEngine(Protocol):
    """What the shared routes need of an engine."""

    @property
    def served_model(self) -> str: ...  # the model name answers carry by default

    @property
    def max_model_len(self) -> int: ...

    @property
    def serving_role(self) -> str: ...  # the PD role passes run in now

    def healthy(self) -> bool: ...

    def is_fully_idle(self) -> bool: ...

    def track(self, delta: int) -> None: ...

    def server_info(self) -> dict[str, Any]: ...

    def model_info(self) -> dict[str, Any]: ...

    def check_prompt(self, ids: list[int], max_new_tokens: int) -> str | None: ...

    def generate(
        self, ids: list[int], sampling: dict[str, Any], rid: str, body: dict[str, Any]
    ) -> AsyncGenerator[Update, None]: ...


def sglang_app(
    engine: SGLangEngine,
    *,
    title: str,
    token: str | None,
    max_body_bytes: int,
    completions_max_fields: Sequence[str] = ("max_completion_tokens", "max_tokens"),
) -> FastAPI:
    """The shared routes (module docstring) over `engine`, behind `guard.EngineGuard`
    (`token` for mutations, bodies of at most `max_body_bytes`). `completions_max_fields`:
    the /v1/completions fields that bound the output, first set wins (SGLang's own
    CompletionRequest has only max_tokens)."""
    app = guard_app(FastAPI(title=title), token=token, max_body_bytes=max_body_bytes)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.healthy() else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        # Like SGLang: skipped while busy; in PD mode the engine checks its scheduler
        # thread instead of faking a bootstrap room (and a stopped one would never answer).
        if not engine.healthy():
            return Response(status_code=503)
        if engine.serving_role != "null" or not engine.is_fully_idle():
            return Response(status_code=200)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        async for _ids, fin, _c, _s in engine.generate([0], {"max_new_tokens": 1}, rid, {}):
            if fin is not None and fin.get("type") == "abort":
                return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return metrics_response(engine)

    async def server_info() -> dict[str, Any]:
        return engine.server_info()

    async def model_info() -> dict[str, Any]:
        return engine.model_info()

    async def tokenize(request: Request) -> Response:
        # SGLang's /v1/tokenize (TokenizeRequest -> TokenizeResponse): a prompt string,
        # a list of them, or chat messages rendered with the chat template.
        try:
            body = await read_json(request)
            prompt, messages = body.get("prompt"), body.get("messages")
            if messages is not None:
                tokens: Any = chat_ids(messages)
                count: Any = len(tokens)
            elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
                tokens = [encode_text(p, "prompt") for p in prompt]
                count = [len(t) for t in tokens]
            elif isinstance(prompt, str):
                tokens = encode_text(prompt, "prompt")
                count = len(tokens)
            else:
                raise BadRequest("prompt must be a non-empty string or a list of them")
        except BadRequest as e:
            return openai_error(str(e))
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse(
            {"tokens": tokens, "count": count, "max_model_len": engine.max_model_len}
        )

    for path in ("/server_info", "/get_server_info"):
        app.get(path)(server_info)
    for path in ("/model_info", "/get_model_info"):
        app.get(path)(model_info)
    for path in ("/v1/tokenize", "/tokenize"):
        app.post(path)(tokenize)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            body = await read_json(request)
            req = _checked(engine, generate_input(body))
        except BadRequest as e:
            return native_error(str(e))
        except ClientDisconnect:
            return Response(status_code=499)
        return await respond_native(engine, request, req, body)

    async def openai_route(request: Request, chat: bool) -> Response:
        try:
            body = await read_json(request)
            fields = ("max_completion_tokens", "max_tokens") if chat else completions_max_fields
            req = openai_input(body, chat=chat, max_fields=fields, default_max=128 if chat else 16)
            req = _checked(engine, req)
        except BadRequest as e:
            return openai_error(str(e))
        except ClientDisconnect:
            return Response(status_code=499)
        body["_route"] = "/v1/chat/completions" if chat else "/v1/completions"
        return await respond_openai(engine, request, req, body, chat=chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await openai_route(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await openai_route(request, chat=True)

    return app


def _checked(engine: SGLangEngine, req: GenerateInput) -> GenerateInput:
    problem = engine.check_prompt(req.ids, req.sampling["max_new_tokens"])
    if problem is not None:
        raise BadRequest(problem)
    return req


def metrics_response(engine: Any) -> Response:
    """GET /metrics: the engine's Prometheus exposition (404 when it keeps none)."""
    m = getattr(engine, "serving_metrics", None)
    if m is None:
        return Response(status_code=404)
    return Response(m.render(), media_type=CONTENT_TYPE)


async def observed(
    engine: Any, n_in: int, it: AsyncGenerator[Update, None]
) -> AsyncGenerator[Update, None]:
    """Pass `it`'s updates on; when the answer finishes (not aborted) count it in the
    engine's `serving_metrics` (prompt, cached, output tokens, TTFT, E2E). Closed early (the
    client went away), it closes `it`, which aborts the request in the engine."""
    t0 = time.monotonic()
    first: float | None = None
    last: Update | None = None
    async with contextlib.aclosing(it):
        async for item in it:
            if first is None and item[0]:
                first = time.monotonic()
            last = item
            yield item
    m = getattr(engine, "serving_metrics", None)
    fin = None if last is None else last[1]
    if m is not None and last is not None and fin is not None and fin.get("type") != "abort":
        now = time.monotonic()
        reason = str(fin.get("type"))
        m.observe(n_in, last[2], len(last[0]), (first or now) - t0, now - t0, reason)


def native_error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's error body of its native routes."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def openai_error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequestError", "param": None,
         "code": status},
        status_code=status,
    )  # fmt: skip


def role_switch_refusal(
    enabled: bool, old_role: str, new_role: str
) -> tuple[bool, str, bool] | None:
    """SGLang's /pd_role_switch answers before it looks at the instance: (success, message,
    safe_to_restore), or None to go on."""
    if not enabled:
        return False, "--enable-pd-role-switch is not set on this server", True
    if new_role not in ("prefill", "decode"):
        return False, f"invalid new_role={new_role!r}", True
    if old_role == "null":
        return False, "instance is not running in PD disaggregation mode", True
    if new_role == old_role:
        return True, "already in target role", False
    return None


def role_switch_reply(
    old_role: str,
    new_role: str,
    success: bool,
    message: str,
    safe: bool = False,
    **extra: Any,
) -> JSONResponse:
    """SGLang's /pd_role_switch reply (200 on success, else 400), plus `extra` fields."""
    out = {"rid": None, "http_worker_ipc": None, "success": success, "message": message,
           "old_role": old_role, "new_role": new_role, "safe_to_restore": safe, **extra}  # fmt: skip
    return JSONResponse(out, status_code=200 if success else 400)


async def _collect(engine: SGLangEngine, it: AsyncGenerator[Update, None]) -> Update:
    engine.track(+1)
    try:
        last: Update = ([], None, 0, {})
        async with contextlib.aclosing(it):
            async for item in it:
                last = item
        return last
    finally:
        engine.track(-1)


def _stream(
    engine: SGLangEngine,
    gen: AsyncGenerator[Update, None],
    events: Callable[[Update], list[bytes]],
) -> StreamingResponse:
    """An SSE answer: `events` of each update, then `data: [DONE]`. A client that goes
    away cancels it, which closes `gen` (the request is aborted in the engine)."""

    async def body() -> AsyncIterator[bytes]:
        engine.track(+1)
        try:
            async with contextlib.aclosing(gen):
                async for item in gen:
                    for ev in events(item):
                        yield ev
                    if _is_abort(item[1]):
                        break
            yield b"data: [DONE]\n\n"
        finally:
            engine.track(-1)

    return StreamingResponse(body(), media_type="text/event-stream")


def _is_abort(fin: dict[str, Any] | None) -> bool:
    return fin is not None and fin.get("type") == "abort"


def _sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def respond_native(
    engine: SGLangEngine, request: Request, req: GenerateInput, body: dict[str, Any]
) -> Response:
    """SGLang's native /generate answer: one JSON object, or SSE events of the same shape;
    meta_info carries the request's stage stamps (`cluster.engines.shell.stamps`)."""
    t0 = time.monotonic()
    received = time.time()
    ids, rid = req.ids, req.rid or uuid.uuid4().hex

    def out(
        out_ids: list[int], fin: dict[str, Any] | None, cached: int, stamps: Stamps
    ) -> dict[str, Any]:
        meta = {"id": rid, "finish_reason": fin, "prompt_tokens": len(ids),
                "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
                "completion_tokens": len(out_ids), "cached_tokens": cached,
                "e2e_latency": time.monotonic() - t0, RECEIVED: received, **stamps}  # fmt: skip
        return {"text": toy_tokenizer.decode(out_ids), "output_ids": out_ids, "meta_info": meta}

    gen = observed(engine, len(ids), engine.generate(ids, req.sampling, rid, body))
    if req.stream:
        return _stream(engine, gen, lambda item: [_sse(out(*item))])
    answered, last = await until_disconnected(request, _collect(engine, gen))
    if not answered or last is None:
        return Response(status_code=499)  # the client is gone: nobody reads this
    fin = last[1] or {}
    if fin.get("type") == "abort":
        return native_error(fin["message"], fin.get("status_code", 400))
    return JSONResponse(out(*last))


async def respond_openai(
    engine: SGLangEngine, request: Request, req: GenerateInput, body: dict[str, Any], chat: bool
) -> Response:
    """/v1/completions and /v1/chat/completions answers (and their SSE chunks)."""
    ids, created = req.ids, int(time.time())
    rid = str(body.get("rid") or uuid.uuid4().hex)  # SGLang's rid
    model = str(body.get("model") or engine.served_model)
    kind = "chat.completion" if chat else "text_completion"

    def usage(n_out: int, cached: int) -> dict[str, Any]:
        return {"prompt_tokens": len(ids), "completion_tokens": n_out,
                "total_tokens": len(ids) + n_out,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip

    def choice(text: str, fin: dict[str, Any] | None, delta: bool) -> dict[str, Any]:
        reason = None if fin is None else str(fin.get("type"))
        c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason,
                             "matched_stop": None if fin is None else fin.get("matched")}  # fmt: skip
        if not chat:
            c["text"] = text
        elif delta:
            c["delta"] = {"content": text}
        else:
            c["message"] = {"role": "assistant", "content": text}
        return c

    gen = observed(engine, len(ids), engine.generate(ids, req.sampling, rid, body))
    if req.stream:
        sent = 0

        def chunk(item: Update) -> list[bytes]:
            nonlocal sent
            out_ids, fin, cached = item[0], item[1], item[2]
            if _is_abort(fin):
                assert fin is not None
                code = fin.get("status_code", 400)
                return [_sse({"error": {"message": fin["message"], "type": "BadRequestError",
                                        "code": code}})]  # fmt: skip
            text = toy_tokenizer.decode(out_ids[sent:])
            sent = len(out_ids)
            doc = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": created,
                   "model": model, "choices": [choice(text, fin, True)]}  # fmt: skip
            if fin is not None:
                doc["usage"] = usage(len(out_ids), cached)
            return [_sse(doc)]

        return _stream(engine, gen, chunk)
    answered, last = await until_disconnected(request, _collect(engine, gen))
    if not answered or last is None:
        return Response(status_code=499)
    out_ids, fin, cached = last[0], last[1], last[2]
    if fin is not None and fin.get("type") == "abort":
        return openai_error(fin["message"], fin.get("status_code", 400))
    doc = {"id": rid, "object": kind, "created": created, "model": model,
           "choices": [choice(toy_tokenizer.decode(out_ids), fin, False)],
           "usage": usage(len(out_ids), cached)}  # fmt: skip
    return JSONResponse(doc)
