"""SGLang 0.5.23's HTTP subset over any engine that meets `SGLangEngine` (SPEC §6).

`sglang_app` serves /health, /health_generate, /server_info (/get_server_info),
/model_info (/get_model_info), /v1/tokenize (/tokenize), /generate (text or input_ids; SSE
with "stream"), /v1/completions and /v1/chat/completions with SGLang's request fields,
response shapes (meta_info with prompt_tokens, completion_tokens, cached_tokens; OpenAI
usage with `prompt_tokens_details.cached_tokens`), SSE framing (`data: ...` events ending
with `data: [DONE]`) and error bodies; the engine adds /flush_cache, /pd_role_switch
(answered with `role_switch_reply` after `role_switch_refusal`) and routes of its own.
Token ids are the toy byte tokenizer's (`cluster.sglang.wire.toy_tokenizer`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cluster.engines.shell.lifecycle import Update
from cluster.sglang.wire import toy_tokenizer


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

    def check_generate(self, body: dict[str, Any]) -> str | None: ...

    def generate(
        self, ids: list[int], sampling: dict[str, Any], rid: str, body: dict[str, Any]
    ) -> AsyncIterator[Update]: ...


def sglang_app(
    engine: SGLangEngine,
    *,
    title: str,
    completions_max_fields: Sequence[str] = ("max_completion_tokens", "max_tokens"),
) -> FastAPI:
    """The shared routes (module docstring) over `engine`. `completions_max_fields`: the
    /v1/completions fields that bound the output, first set wins (SGLang's own
    CompletionRequest has only max_tokens)."""
    app = FastAPI(title=title)

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
        async for _ids, fin, _c in engine.generate([0], {"max_new_tokens": 1}, rid, {}):
            if fin is not None and fin.get("type") == "abort":
                return Response(status_code=503)
        return Response(status_code=200)

    async def server_info() -> dict[str, Any]:
        return engine.server_info()

    async def model_info() -> dict[str, Any]:
        return engine.model_info()

    async def tokenize(request: Request) -> JSONResponse:
        # SGLang's /v1/tokenize (TokenizeRequest -> TokenizeResponse): a prompt string,
        # a list of them, or chat messages rendered with the chat template.
        body = await request.json()
        prompt, messages = body.get("prompt"), body.get("messages")
        if messages is not None:
            if not isinstance(messages, list) or not messages:
                return openai_error("messages must be a non-empty list")
            tokens: Any = toy_tokenizer.encode(toy_tokenizer.chat_template(messages))
            count: Any = len(tokens)
        elif isinstance(prompt, str):
            tokens = toy_tokenizer.encode(prompt)
            count = len(tokens)
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            tokens = [toy_tokenizer.encode(p) for p in prompt]
            count = [len(t) for t in tokens]
        else:
            return openai_error(f"Invalid prompt type: {type(prompt)}. Expected str or List[str].")
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
        body = await request.json()
        err = engine.check_generate(body)
        if err is not None:
            return JSONResponse({"error": {"message": err}}, status_code=400)
        ids = body["input_ids"] if body.get("input_ids") is not None else None
        ids = ids if ids is not None else toy_tokenizer.encode(body["text"])
        rid = str(body.get("rid") or uuid.uuid4().hex)
        sp = body.get("sampling_params") or {}
        return await respond_native(engine, ids, sp, rid, body, bool(body.get("stream")))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = toy_tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            return openai_error("prompt must be a non-empty string or a list of token ids")
        body["_route"] = "/v1/completions"
        sp = openai_sampling(body, completions_max_fields, 16)
        return await respond_openai(engine, ids, sp, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return openai_error("messages must be a non-empty list")
        ids = toy_tokenizer.encode(toy_tokenizer.chat_template(messages))
        body["_route"] = "/v1/chat/completions"
        sp = openai_sampling(body, ("max_completion_tokens", "max_tokens"), 128)
        return await respond_openai(engine, ids, sp, body, chat=True)

    return app


def check_generate(body: dict[str, Any], engine_name: str) -> str | None:
    """SGLang's checks of a native /generate body (one prompt per request); None if fine."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        return "Either text or input_ids should be provided."
    if text is not None and not isinstance(text, str):
        return f"{engine_name} accepts one prompt per request: text must be a string."
    if ids is not None and not (
        isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)
    ):
        return "input_ids must be a non-empty list of token ids (one prompt per request)."
    sp = body.get("sampling_params") or {}
    mnt = sp.get("max_new_tokens", 128)
    if not isinstance(mnt, int) or mnt < 1:
        return f"sampling_params.max_new_tokens must be an int >= 1, got {mnt!r}"
    return None


def openai_sampling(
    body: dict[str, Any], max_fields: Sequence[str], default_max: int
) -> dict[str, Any]:
    """An OpenAI request's sampling params in SGLang's native names."""
    n = next((body[f] for f in max_fields if body.get(f)), default_max)
    return {"max_new_tokens": int(n), "temperature": float(body.get("temperature") or 0.0),
            "ignore_eos": bool(body.get("ignore_eos", False))}  # fmt: skip


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


async def _collect(engine: SGLangEngine, it: AsyncIterator[Update]) -> Update:
    engine.track(+1)
    try:
        last: Update = ([], None, 0)
        async for item in it:
            last = item
        return last
    finally:
        engine.track(-1)


async def _tracked(engine: SGLangEngine, it: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    engine.track(+1)
    try:
        async for chunk in it:
            yield chunk
    finally:
        engine.track(-1)


def _sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


async def respond_native(
    engine: SGLangEngine, ids: list[int], sp: dict[str, Any], rid: str, body: dict[str, Any],
    stream: bool,
) -> Response:  # fmt: skip
    """SGLang's native /generate answer: one JSON object, or SSE events of the same shape."""
    t0 = time.monotonic()

    def out(out_ids: list[int], fin: dict[str, Any] | None, cached: int) -> dict[str, Any]:
        meta = {"id": rid, "finish_reason": fin, "prompt_tokens": len(ids),
                "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
                "completion_tokens": len(out_ids), "cached_tokens": cached,
                "e2e_latency": time.monotonic() - t0}  # fmt: skip
        return {"text": toy_tokenizer.decode(out_ids), "output_ids": out_ids, "meta_info": meta}

    gen = engine.generate(ids, sp, rid, body)
    if stream:

        async def sse() -> AsyncIterator[bytes]:
            async for item in gen:
                yield _sse(out(*item))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(_tracked(engine, sse()), media_type="text/event-stream")
    last = await _collect(engine, gen)
    fin = last[1] or {}
    if fin.get("type") == "abort":
        return JSONResponse({"error": {"message": fin["message"]}}, fin.get("status_code", 400))
    return JSONResponse(out(*last))


async def respond_openai(
    engine: SGLangEngine, ids: list[int], sp: dict[str, Any], body: dict[str, Any], chat: bool
) -> Response:
    """/v1/completions and /v1/chat/completions answers (and their SSE chunks)."""
    rid, created = str(body.get("rid") or uuid.uuid4().hex), int(time.time())  # SGLang's rid
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

    gen = engine.generate(ids, sp, rid, body)
    if body.get("stream"):

        async def sse() -> AsyncIterator[bytes]:
            sent = 0
            async for out_ids, fin, cached in gen:
                if fin is not None and fin.get("type") == "abort":
                    code = fin.get("status_code", 400)
                    err = {"message": fin["message"], "type": "BadRequestError", "code": code}
                    yield _sse({"error": err})
                    break
                text = toy_tokenizer.decode(out_ids[sent:])
                sent = len(out_ids)
                chunk = {"id": rid, "object": f"{kind}.chunk" if chat else kind,
                         "created": created, "model": model,
                         "choices": [choice(text, fin, True)]}  # fmt: skip
                if fin is not None:
                    chunk["usage"] = usage(len(out_ids), cached)
                yield _sse(chunk)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(_tracked(engine, sse()), media_type="text/event-stream")
    out_ids, fin, cached = await _collect(engine, gen)
    if fin is not None and fin.get("type") == "abort":
        return openai_error(fin["message"], fin.get("status_code", 400))
    doc = {"id": rid, "object": kind, "created": created, "model": model,
           "choices": [choice(toy_tokenizer.decode(out_ids), fin, False)],
           "usage": usage(len(out_ids), cached)}  # fmt: skip
    return JSONResponse(doc)
