"""When a request passed each stage inside an engine: the `*_ts` stamps of its answers.

SGLang puts wall-clock timestamps of a request's life into `meta_info`
(`request_received_ts`, `prefill_finished_ts`, ... from `observability/req_time_stats.py`,
with metrics enabled). pdlab's engines send the stages the PD proxy needs to split a
request's time between proxy, queue, passes, KV hand-off, decode join and streaming (paper
000 §4.1; the `request_stages` table), as `time.time()` seconds on the engine's clock, each
the first time the stage is reached:

- `request_received_ts`: the engine's HTTP server took the request (SGLang's name)
- `wait_queue_entry_ts`: its scheduler queued it (a decode engine: once its KV arrived)
- `forward_entry_ts`: the first forward pass computing its prompt started
- `prefill_finished_ts`: the pass that sampled its first token ended (SGLang's name)
- `kv_received_ts`: decode role: the prefill's KV was in the process
- `decode_join_ts`: decode role: it joined the running batch (its first token goes out)
- `emitted_ts`: per answer event, when the scheduler produced that event's tokens
"""

from __future__ import annotations

import math
from typing import Any

RECEIVED = "request_received_ts"
QUEUED = "wait_queue_entry_ts"
FORWARD = "forward_entry_ts"
PREFILL_DONE = "prefill_finished_ts"
KV_RECEIVED = "kv_received_ts"
DECODE_JOIN = "decode_join_ts"
EMITTED = "emitted_ts"


def stamps(ev: Any) -> dict[str, float]:
    """An answer event's `meta_info` stamps (its `*_ts` keys holding finite numbers)."""
    meta = ev.get("meta_info") if isinstance(ev, dict) else None
    if not isinstance(meta, dict):
        return {}
    return {
        k: float(v)
        for k, v in meta.items()
        if k.endswith("_ts") and isinstance(v, int | float) and math.isfinite(v)
    }


def emitted(ev: Any) -> float | None:
    """The event's `emitted_ts` (None when absent): cheaper than `stamps` per token."""
    meta = ev.get("meta_info") if isinstance(ev, dict) else None
    ts = meta.get(EMITTED) if isinstance(meta, dict) else None
    return float(ts) if isinstance(ts, int | float) and math.isfinite(ts) else None
