"""The engines' KV state and the control plane's branch counts, kept in step (SPEC §4, §6).

Paper 000 §4.2–4.3 and §5.3: the node status shows what each engine holds in device memory
and in the host tier, and branch-aware eviction ranks an engine's cached blocks by the
branch counts R_{b,n} the control plane keeps. SGLang has neither on its wire, so
`KVSync` does both over HTTP from the cluster's health loop (outside the control-plane lock
for the calls, under it for the state):

- read: each engine's `/server_info` `internal_states[0]`: `kv_gpu_used_tokens` and
  `kv_host_used_tokens` (the torch engine reports both; an engine that reports neither is
  not asked again), and `host_kv_capacity_tokens`; the node status uses them;
- write: every `branch_counts_every_s`, for each engine serving `/kv_eviction`, the counts
  that changed since its last push go to `POST /kv_eviction {"branch_counts": {hash: R_b}}`:
  R_b of the node's blocks with a nonzero count, and 0 for a block whose count fell to zero
  or that left the node (the engine merges them; 0 forgets a block). A failed push is
  retried whole at the next period. Engines hash blocks with `cluster.kv.hashing`, the
  directory's own chain, so the keys need no translation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from cluster.control import ContendedRLock
from cluster.core import BlockHash
from cluster.live.engine_state import EngineState

log = logging.getLogger(__name__)


class KVSync:
    """See module docstring. `counts_of(node)` is the control plane's R_{b,n} > 0 of `node`."""

    def __init__(
        self,
        states: dict[int, EngineState],
        lock: ContendedRLock,
        counts_of: Callable[[int], dict[BlockHash, int]],
        headers: dict[str, str],
        counts_every_s: float,
    ) -> None:
        self.states = states
        self.lock = lock
        self.counts_of = counts_of
        self.headers = headers
        self.counts_every_s = counts_every_s
        self._silent: set[int] = set()  # engines that report no KV usage
        self._next_push = 0.0
        self.pushes = 0
        self.push_errors = 0

    def _live(self) -> list[tuple[int, EngineState]]:
        with self.lock:
            return [(n, st) for n, st in self.states.items() if st.up and not st.relaunching]

    def read_states(self, client: httpx.Client) -> None:
        """Refresh every engine's KV usage from its /server_info."""
        for n, st in self._live():
            if n in self._silent:
                continue
            try:
                info = client.get(f"{st.spec.http_url}/server_info", headers=self.headers).json()
            except (httpx.HTTPError, ValueError):
                continue  # the health check reports a dead engine
            internal = (info.get("internal_states") or [{}])[0]
            internal = internal if isinstance(internal, dict) else {}
            gpu, host = internal.get("kv_gpu_used_tokens"), internal.get("kv_host_used_tokens")
            if gpu is None and host is None and "kv_eviction_policy" not in info:
                self._silent.add(n)
                continue
            with self.lock:
                st.kv_gpu_used_tokens = _int(gpu)
                st.kv_host_used_tokens = _int(host)
                st.kv_host_capacity_tokens = _int(info.get("host_kv_capacity_tokens")) or 0
                st.takes_branch_counts = "kv_eviction_policy" in info

    def push_due(self) -> bool:
        return self.counts_every_s > 0 and time.monotonic() >= self._next_push

    def push_counts(self, client: httpx.Client) -> int:
        """Send every engine the counts that changed; returns the counts sent."""
        self._next_push = time.monotonic() + self.counts_every_s
        sent = 0
        for n, st in self._live():
            if not st.takes_branch_counts:
                continue
            with self.lock:
                now = self.counts_of(n)
                delta = {h: c for h, c in now.items() if st.pushed_counts.get(h) != c}
                delta |= {h: 0 for h in st.pushed_counts if h not in now}
            if not delta:
                continue
            body: dict[str, Any] = {"branch_counts": {str(h): c for h, c in delta.items()}}
            try:
                r = client.post(f"{st.spec.http_url}/kv_eviction", json=body, headers=self.headers)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                self.push_errors += 1
                log.warning("branch counts to engine %d (%s) not accepted", n, st.spec.http_url)
                continue
            with self.lock:
                st.pushed_counts = now
            self.pushes += 1
            sent += len(delta)
        return sent


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
