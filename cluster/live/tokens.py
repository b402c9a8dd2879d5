"""Token ids of proxied requests, for the block hashes of their paths (paper 000 Alg. E.1; SPEC §4).

The router keys a request by the chained hashes of its full pages (`cluster.kv.hashing`), and
the KV directory re-keys the engines' BlockStored events onto the same chain from the token
ids they carry, so a request's path matches the blocks an engine stored only if the proxy
sees the very token ids the engine prefilled. Sources, in order of fidelity:

- ids in the request itself (/generate `input_ids`, /v1/completions with a token list);
- `engine`: the engine's own tokenizer through SGLang's POST /v1/tokenize ({"prompt"} or
  {"messages", ...} rendered with the server's chat template; SGLang 0.5.23,
  `serving_tokenize.py`), the same code path the engine uses for /generate `text` and the
  OpenAI routes, so the ids agree by construction (one extra loopback round trip);
- `hf:<model>`: a Hugging Face tokenizer in this process (`transformers`, an optional
  dependency that pdlab does not install), with its chat template;
- `toy`: the SGLang stand-in's byte tokenizer (tests and demos against the stand-in);
- `none`: no ids; paths are empty (routing by load only) and t_in is estimated at 4
  characters per token.

Batch inputs (lists of prompts) are refused: one branch identity per request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import httpx

from cluster.wire import toy_tokenizer

ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
# Chat fields SGLang's TokenizeRequest accepts besides messages (they change the rendering).
_CHAT_FIELDS = (
    "tools",
    "tool_choice",
    "reasoning_effort",
    "continue_final_message",
    "chat_template_kwargs",
    "add_generation_prompt",
)


class TokenizeError(ValueError):
    """The request's prompt cannot be turned into token ids; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Prompt(NamedTuple):
    """What a request asks the model to read: ids when given, else text or chat messages."""

    ids: list[int] | None
    text: str | None
    messages: list[Any] | None
    chat_options: dict[str, Any]


def prompt_of(route: str, body: dict[str, Any]) -> Prompt:
    """The prompt of one request body of `route`; raises TokenizeError naming the problem."""
    if route == "/generate":
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise TokenizeError("Either text or input_ids should be provided.")
        if ids is not None:
            if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
                return Prompt(list(ids), None, None, {})
            raise TokenizeError(
                "input_ids must be one non-empty list of token ids: the pdlab router routes "
                "one prompt (one branch) per request; send batches as separate requests"
            )
        if not isinstance(text, str):
            raise TokenizeError(
                "text must be a string: the pdlab router routes one prompt (one branch) per "
                "request; send batches as separate requests"
            )
        return Prompt(None, text, None, {})
    if route == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return Prompt(None, prompt, None, {})
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return Prompt(list(prompt), None, None, {})
        raise TokenizeError(
            "prompt must be a string or one list of token ids (one prompt per request)"
        )
    if route == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise TokenizeError("messages must be a non-empty list")
        options = {k: body[k] for k in _CHAT_FIELDS if body.get(k) is not None}
        return Prompt(None, None, messages, options)
    raise TokenizeError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}", status=404)


class RequestTokenizer(Protocol):
    """Turns a prompt into the token ids the engine will prefill."""

    name: str

    async def encode(self, prompt: Prompt, engine_url: str | None) -> list[int] | None:
        """Token ids, or None when this tokenizer gives none (`none`)."""
        ...


class EngineTokenizer:
    """The engine's tokenizer over SGLang's POST /v1/tokenize."""

    name = "engine"

    def __init__(self, client: Callable[[], httpx.AsyncClient], headers: dict[str, str]) -> None:
        self._client = client
        self._headers = headers

    async def encode(self, prompt: Prompt, engine_url: str | None) -> list[int] | None:
        if prompt.ids is not None:
            return prompt.ids
        if engine_url is None:
            raise TokenizeError("no healthy engine to tokenize with", status=503)
        body: dict[str, Any]
        if prompt.messages is not None:
            body = {"messages": prompt.messages, **prompt.chat_options}
        else:
            body = {"prompt": prompt.text}
        try:
            r = await self._client().post(
                f"{engine_url}/v1/tokenize", json=body, headers=self._headers, timeout=30.0
            )
        except httpx.HTTPError as e:
            raise TokenizeError(
                f"tokenizing through {engine_url}/v1/tokenize failed: {type(e).__name__}: {e}",
                status=502,
            ) from None
        if r.status_code != 200:
            raise TokenizeError(
                f"{engine_url}/v1/tokenize answered {r.status_code}: {r.text[:300]}",
                status=400 if r.status_code < 500 else 502,
            )
        tokens = r.json().get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise TokenizeError(f"{engine_url}/v1/tokenize gave no token list", status=502)
        return tokens


class ToyTokenizer:
    """The SGLang stand-in's byte tokenizer and chat template."""

    name = "toy"

    async def encode(self, prompt: Prompt, engine_url: str | None) -> list[int] | None:
        if prompt.ids is not None:
            return prompt.ids
        if prompt.messages is not None:
            return toy_tokenizer.encode(toy_tokenizer.chat_template(prompt.messages))
        return toy_tokenizer.encode(prompt.text or "")


class HFTokenizer:
    """A Hugging Face tokenizer loaded in this process (needs `transformers`)."""

    def __init__(self, model: str) -> None:
        self.name = f"hf:{model}"
        try:
            from transformers import AutoTokenizer  # optional dependency
        except ImportError:
            raise TokenizeError(
                f"tokenizer {self.name!r} needs the transformers package "
                "(pip install transformers), or use tokenizer = 'engine'",
                status=500,
            ) from None
        self._tok = AutoTokenizer.from_pretrained(model)

    def _encode(self, prompt: Prompt) -> list[int]:
        if prompt.messages is not None:
            opts = prompt.chat_options
            return list(
                self._tok.apply_chat_template(
                    prompt.messages,
                    tools=opts.get("tools"),
                    add_generation_prompt=opts.get("add_generation_prompt", True),
                    tokenize=True,
                    **(opts.get("chat_template_kwargs") or {}),
                )
            )
        return list(self._tok.encode(prompt.text or ""))

    async def encode(self, prompt: Prompt, engine_url: str | None) -> list[int] | None:
        if prompt.ids is not None:
            return prompt.ids
        return await asyncio.to_thread(self._encode, prompt)


class NoTokenizer:
    """No token ids: empty paths; t_in estimated from the characters."""

    name = "none"

    async def encode(self, prompt: Prompt, engine_url: str | None) -> list[int] | None:
        return prompt.ids


def estimate_tokens(prompt: Prompt) -> int:
    """Input length without a tokenizer: 4 characters per token (English text average)."""
    if prompt.ids is not None:
        return len(prompt.ids)
    chars = len(prompt.text) if prompt.text is not None else len(json.dumps(prompt.messages))
    return max(1, chars // 4)


def make_tokenizer(
    spec: str, client: Callable[[], httpx.AsyncClient], headers: dict[str, str]
) -> RequestTokenizer:
    """The tokenizer named by the cluster file's `tokenizer` setting."""
    if spec == "engine":
        return EngineTokenizer(client, headers)
    if spec == "toy":
        return ToyTokenizer()
    if spec == "none":
        return NoTokenizer()
    if spec.startswith("hf:"):
        return HFTokenizer(spec[3:])
    raise TokenizeError(
        f"unknown tokenizer {spec!r}; use engine, toy, none or hf:<model>", status=500
    )


def max_new_tokens(route: str, body: dict[str, Any], default: int = 128) -> int:
    """The output budget a request asks for (KV room the decode node must have)."""
    if route == "/generate":
        v = (body.get("sampling_params") or {}).get("max_new_tokens")
    else:
        v = body.get("max_completion_tokens") or body.get("max_tokens")
    return int(v) if isinstance(v, int) and v > 0 else default
