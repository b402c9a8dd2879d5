"""An engine's record of when each request passed each stage (`cluster.sglang.stamps`).

A request object holds `stamps` (stage name -> `time.time()` seconds on the engine's
clock); the scheduler thread and the generation plumbing `stamp` them as the request goes,
and every answer event carries them in `meta_info` (`sglang_http`), with `emitted_ts`: when
the scheduler produced the event's tokens (`lifecycle.EngineShell.updates`).
"""

from __future__ import annotations

import time

from cluster.sglang.stamps import (
    DECODE_JOIN,
    EMITTED,
    FORWARD,
    KV_RECEIVED,
    PREFILL_DONE,
    QUEUED,
    RECEIVED,
)

__all__ = [
    "DECODE_JOIN",
    "EMITTED",
    "FORWARD",
    "KV_RECEIVED",
    "PREFILL_DONE",
    "QUEUED",
    "RECEIVED",
    "Stamps",
    "stamp",
]

Stamps = dict[str, float]


def stamp(stamps: Stamps, key: str, t: float | None = None) -> None:
    """Record `key` at `t` (default: now) unless it was recorded before."""
    if key not in stamps:
        stamps[key] = time.time() if t is None else t
