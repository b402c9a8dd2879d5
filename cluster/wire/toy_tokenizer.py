"""The SGLang stand-in's deterministic toy tokenizer and token generator (SPEC §6).

Tokens are UTF-8 bytes (id = byte value, vocabulary 256), so any text round-trips and
token counts are predictable in tests. Chat messages are rendered with a fixed toy template
("<|role|>content\\n" per message, then "<|assistant|>"). Generated tokens are lowercase
letters chosen by a deterministic function of the sequence so far, so the same prompt
always yields the same completion, and decode can continue a sequence that prefill began.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

VOCAB_SIZE = 256


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int]) -> str:
    return bytes(i & 0xFF for i in ids).decode("utf-8", errors="replace")


def chat_template(messages: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        parts.append(f"<|{m.get('role', 'user')}|>{content}\n")
    parts.append("<|assistant|>")
    return "".join(parts)


def next_token(seq: Sequence[int]) -> int:
    """A letter a..z determined by the sequence's length and last two tokens."""
    a = seq[-1] if seq else 0
    b = seq[-2] if len(seq) > 1 else 0
    return 97 + (a * 31 + b * 7 + len(seq)) % 26
