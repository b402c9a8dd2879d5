"""What the engines' HTTP routes accept (SPEC §6): JSON bodies, checked fields, and answers
dropped when their client goes away.

- `read_json`: the body as a JSON object, or a `BadRequest` saying what is wrong with it
  (not JSON, not UTF-8, NaN/Infinity, nested past the parser's depth, an integer over 4,300
  digits, not an object). Its size was bounded before it was read (`guard.EngineGuard`).
- `generate_input` and `openai_input`: SGLang's fields of /generate and of the OpenAI
  routes, checked at the door: one prompt (text or input_ids, not both, not empty),
  max_new_tokens an integer >= 1, temperature a finite number >= 0, flags booleans, the PD
  bootstrap fields in range. The engine then checks the prompt against its vocabulary and
  context (`SGLangEngine.check_prompt`).
- `until_disconnected`: a non-streaming answer, cancelled when its client disconnects (as
  SGLang's tokenizer manager aborts the request of a client that went away); a streaming
  answer is cancelled by Starlette itself.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from fastapi import Request
from starlette.types import Receive

from cluster.wire import toy_tokenizer

T = TypeVar("T")
MAX_RID_CHARS = 256  # a rid is echoed in every streamed event
MAX_ROOM = (1 << 63) - 1  # SGLang's bootstrap rooms are 63-bit


class BadRequest(ValueError):
    """A request refused with 400; the message says what was wrong and what is allowed."""


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _no_constant(name: str) -> Any:
    raise BadRequest(f"the body holds {name}, which is not JSON: numbers must be finite")


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object (raises BadRequest; ClientDisconnect when the client left)."""
    raw = await request.body()
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except BadRequest:
        raise
    except RecursionError:
        raise BadRequest("the body's JSON is nested too deeply") from None
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text: send JSON") from None
    except ValueError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadRequest(f"the body is not valid JSON: {_clip(first, 160)}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"the body must be a JSON object, got {_json_type(doc)}")
    return doc


def _json_type(v: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if v is None:
        return "null"
    if isinstance(v, bool | int | float):
        return names.get(type(v), "a number")
    return names.get(type(v), type(v).__name__)


# ---- fields -------------------------------------------------------------------------------
def opt_int(doc: Mapping[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    """`doc[key]` as an int in [lo, hi] (booleans are not integers), or None when absent."""
    v = doc.get(key)
    if v is None:
        return None
    span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        raise BadRequest(f"{key} must be an integer {span}, got {_clip(repr(v))}")
    return v


def opt_number(doc: Mapping[str, Any], key: str, lo: float) -> float | None:
    """`doc[key]` as a finite float >= lo, or None when absent."""
    v = doc.get(key)
    if v is None:
        return None
    ok = isinstance(v, int | float) and not isinstance(v, bool)
    try:
        f = float(v) if ok else math.nan
    except OverflowError:  # an integer past a float's range
        f = math.inf
    if not (math.isfinite(f) and f >= lo):
        raise BadRequest(f"{key} must be a finite number >= {lo:g}, got {_clip(repr(v))}")
    return f


def opt_bool(doc: Mapping[str, Any], key: str) -> bool | None:
    v = doc.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise BadRequest(f"{key} must be true or false, got {_clip(repr(v))}")


def opt_str(doc: Mapping[str, Any], key: str, max_chars: int) -> str | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > max_chars:
        raise BadRequest(f"{key} must be a string of at most {max_chars} characters")
    return v


def token_ids(v: Any, key: str) -> list[int]:
    """A non-empty list of integer token ids (>= 0)."""
    if not isinstance(v, list) or not v:
        raise BadRequest(f"{key} must be a non-empty list of token ids (one prompt per request)")
    for t in v:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise BadRequest(f"{key} must hold integer token ids >= 0, got {_clip(repr(t))}")
    return v


def encode_text(text: Any, key: str) -> list[int]:
    """A non-empty prompt string's toy-tokenizer ids."""
    if not isinstance(text, str) or not text:
        raise BadRequest(f"{key} must be a non-empty string (one prompt per request)")
    try:
        return toy_tokenizer.encode(text)
    except UnicodeEncodeError:
        raise BadRequest(f"{key} is not valid Unicode (it holds a lone surrogate)") from None


def chat_ids(messages: Any) -> list[int]:
    """Chat messages rendered with the toy template, as token ids."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict):
            raise BadRequest(f"each message must be an object, got {_json_type(m)}")
        opt_str(m, "role", 64)
        content = m.get("content")
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
        )
        if not (content is None or isinstance(content, str) or parts_ok):
            raise BadRequest("a message's content must be a string or a list of text parts")
    return encode_text(toy_tokenizer.chat_template(messages), "messages")


# ---- requests -------------------------------------------------------------------------------
class GenerateInput(NamedTuple):
    """A checked generation request, whatever route it came by."""

    ids: list[int]
    sampling: dict[str, Any]  # max_new_tokens: int, temperature: float, ignore_eos: bool
    rid: str | None
    stream: bool


def _sampling(
    max_new: int | None, default_max: int, temp: float | None, eos: bool | None
) -> dict[str, Any]:
    return {"max_new_tokens": default_max if max_new is None else max_new,
            "temperature": temp or 0.0, "ignore_eos": bool(eos)}  # fmt: skip


def _bootstrap(body: Mapping[str, Any]) -> None:
    opt_str(body, "bootstrap_host", 255)
    opt_int(body, "bootstrap_port", 1, 65535)
    opt_int(body, "bootstrap_room", 0, MAX_ROOM)


def generate_input(body: Mapping[str, Any]) -> GenerateInput:
    """SGLang's native /generate body, checked (raises BadRequest)."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("Either text or input_ids should be provided (exactly one).")
    prompt = encode_text(text, "text") if ids is None else token_ids(ids, "input_ids")
    sp = body.get("sampling_params")
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest(f"sampling_params must be an object, got {_json_type(sp)}")
    _bootstrap(body)
    sampling = _sampling(
        opt_int(sp, "max_new_tokens", 1), 128, opt_number(sp, "temperature", 0.0),
        opt_bool(sp, "ignore_eos"),
    )  # fmt: skip
    rid = opt_str(body, "rid", MAX_RID_CHARS)
    return GenerateInput(prompt, sampling, rid, bool(opt_bool(body, "stream")))


def openai_input(
    body: Mapping[str, Any], *, chat: bool, max_fields: Sequence[str], default_max: int
) -> GenerateInput:
    """/v1/completions (`chat` False: prompt) or /v1/chat/completions (messages), checked;
    the output bound is the first of `max_fields` set."""
    prompt = body.get("prompt")
    if chat:
        ids = chat_ids(body.get("messages"))
    elif isinstance(prompt, str):
        ids = encode_text(prompt, "prompt")
    elif isinstance(prompt, list):
        ids = token_ids(prompt, "prompt")
    else:
        raise BadRequest("prompt must be a non-empty string or a list of token ids")
    bounds = [opt_int(body, f, 1) for f in max_fields]
    max_new = next((b for b in bounds if b is not None), None)
    opt_str(body, "model", 256)
    _bootstrap(body)
    sampling = _sampling(
        max_new, default_max, opt_number(body, "temperature", 0.0), opt_bool(body, "ignore_eos")
    )
    return GenerateInput(ids, sampling, None, bool(opt_bool(body, "stream")))


# ---- the client going away ----------------------------------------------------------------
async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, `work`'s result), or (False, None) when the client disconnected first: `work`
    is then cancelled (an engine's generation aborts and frees its KV)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            t.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        return False, None
    return True, task.result()
