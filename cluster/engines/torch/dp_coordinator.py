"""The DP coordinator and load balancer of a torch engine group (vLLM V1's internal DP LB).

As vLLM's `DPCoordinator` (`vllm/v1/engine/coordinator.py`) and its front-end client
`DPLBAsyncMPClient` (`vllm/v1/engine/core_client.py`) do:

- every rank pushes its (waiting, running) request counts when they change; the
  coordinator hands the balancer a fresh snapshot of all ranks' counts at most every
  `stats_interval_s` (vLLM: 100 ms) once any arrived;
- the balancer sends a request to the rank of least `4·waiting + running`, scanning from
  rank 0 and keeping the first of equal scores, then counts it as waiting there at once
  (between snapshots, vLLM's optimistic increment); a request may name its rank
  (`X-data-parallel-rank` header or `data_parallel_rank` in the body);
- a rank that starts a wave on its own (a request reached it while the group was paused)
  pushes `start_wave`; the coordinator relays START_DP_WAVE to every other rank. Rank 0
  reports `wave_complete` when a wave ends.

The coordinator runs on its own thread with a ZMQ PULL socket the ranks push to and one
PUSH socket per rank (its control endpoint); `Balancer` is shared with the HTTP front end
under a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

WAITING_WEIGHT = 4  # vLLM: score = waiting * 4 + running


class Balancer:
    """Which rank serves the next request (module docstring); thread-safe."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._counts = [[0, 0] for _ in range(num_ranks)]
        self._lock = threading.Lock()

    def choose(self, rank: int | None = None) -> int:
        with self._lock:
            if rank is None:
                scores = [WAITING_WEIGHT * w + r for w, r in self._counts]
                rank = scores.index(min(scores))  # the first of the least loaded
                self._counts[rank][0] += 1  # optimistic, until the next snapshot
            return rank

    def update(self, snapshot: list[tuple[int, int]]) -> None:
        with self._lock:
            self._counts = [[w, r] for w, r in snapshot]

    def counts(self) -> list[list[int]]:
        with self._lock:
            return [list(c) for c in self._counts]


class Coordinator:
    """Counts, snapshots and wave relays of one group (module docstring)."""

    def __init__(self, balancer: Balancer, host: str = "127.0.0.1", stats_interval_s: float = 0.1):
        self.balancer = balancer
        self.stats_interval_s = stats_interval_s
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self.endpoint = f"tcp://{host}:{self._pull.bind_to_random_port(f'tcp://{host}')}"
        self._push: list[zmq.Socket[bytes]] = []
        self.engine_counts = [(0, 0)] * balancer.num_ranks
        self.current_wave = 0
        self.engines_running = False
        self.num_relayed = 0
        self._changed = False  # counts arrived since the last snapshot
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dp-coordinator", daemon=True)

    def start(self, controls: list[str]) -> None:
        """Connect to the ranks' control endpoints (in rank order) and start relaying."""
        for endpoint in controls:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self._push.append(sock)
        self._thread.start()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"engine_counts": [list(c) for c in self.engine_counts],
                    "balancer_counts": self.balancer.counts(), "current_wave": self.current_wave,
                    "engines_running": self.engines_running,
                    "start_waves_relayed": self.num_relayed}  # fmt: skip

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            if self._pull.poll(int(self.stats_interval_s * 1000)):
                self._handle(self._pull.recv_json())
                while self._pull.poll(0):
                    self._handle(self._pull.recv_json())
            now = time.monotonic()
            with self._lock:
                changed, counts = self._changed, list(self.engine_counts)
            if changed and now - last >= self.stats_interval_s:
                self.balancer.update(counts)  # replaces the optimistic counts (vLLM)
                last = now
                with self._lock:
                    self._changed = False

    def _handle(self, msg: Any) -> None:
        kind = msg.get("type") if isinstance(msg, dict) else None
        with self._lock:
            if kind == "counts":
                self.engine_counts[int(msg["rank"])] = (int(msg["waiting"]), int(msg["running"]))
                self._changed = True
            elif kind == "wave_complete":
                self.current_wave = int(msg["wave"]) + 1
                self.engines_running = False
            elif kind == "start_wave":
                wave, sender = int(msg["wave"]), int(msg["rank"])
                self.current_wave = max(self.current_wave, wave)
                self.engines_running = True
                self.num_relayed += 1
                for rank, sock in enumerate(self._push):
                    if rank != sender:
                        sock.send_json({"type": "start_wave", "wave": wave})

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        for sock in (self._pull, *self._push):
            sock.close(0)
        self._ctx.term()
