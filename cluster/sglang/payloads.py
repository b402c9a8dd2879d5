"""SGLang response payloads as the PD proxy reads them (SPEC §6 data plane).

SSE framing (`data: {...}` events separated by a blank line, `data: [DONE]` last), errors
and aborts inside a 200 answer (native `meta_info.finish_reason.type == "abort"`, OpenAI
`{"error": ...}` events or `{"object": "error"}` bodies), output token counts (native
`meta_info.completion_tokens` / `output_ids`, OpenAI `usage`, else one per chunk) and the
engine's cached prefix (`meta_info.cached_tokens`, OpenAI
`usage.prompt_tokens_details.cached_tokens` with --enable-cache-report). Stage stamps in
`meta_info` are read by `cluster.sglang.stamps`.
"""

from __future__ import annotations

import json
from typing import Any


def error_json(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "EngineError", "code": status}}


def sse_events(buf: bytes) -> tuple[list[Any], bytes]:
    """Complete SSE `data:` payloads in `buf` (JSON-decoded, or the raw string) and the rest."""
    out: list[Any] = []
    while True:
        cut = buf.find(b"\n\n")
        if cut < 0:
            return out, buf
        event, buf = buf[:cut], buf[cut + 2 :]
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                try:
                    out.append(json.loads(data))
                except ValueError:
                    out.append(data.decode("utf-8", "replace"))


def event_error(ev: Any) -> tuple[str, int] | None:
    """An engine's error or abort inside a response payload: (message, status)."""
    if not isinstance(ev, dict):
        return None
    err = ev.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err)), int(err.get("code") or 500)
    if ev.get("object") == "error":
        return str(ev.get("message")), int(ev.get("code") or 500)
    fin = (ev.get("meta_info") or {}).get("finish_reason")
    if isinstance(fin, dict) and fin.get("type") == "abort":
        return str(fin.get("message")), int(fin.get("status_code") or 500)
    return None


def output_tokens(ev: Any, so_far: int) -> int:
    if not isinstance(ev, dict):
        return so_far
    meta = ev.get("meta_info")
    if isinstance(meta, dict):
        if isinstance(meta.get("completion_tokens"), int):
            return int(meta["completion_tokens"])
        if isinstance(ev.get("output_ids"), list):
            return len(ev["output_ids"])
    usage = ev.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    if ev.get("choices"):
        return so_far + 1  # one chunk per token without usage (stream_options off)
    return so_far


def cached_tokens(ev: Any) -> int | None:
    if not isinstance(ev, dict):
        return None
    meta = ev.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("cached_tokens"), int):
        return int(meta["cached_tokens"])
    usage = ev.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
    return None
