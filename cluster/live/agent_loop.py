"""A workload's agents played against a live cluster, from a background thread (SPEC §6).

Paper 000 §6.1 drives its clusters with a closed loop of agents (each finished agent
replaced by a new one) and App. D.3 with Poisson agent arrivals; paper 003 §3.2 releases a
program's turns causally. `AgentLoop` does the same against a live proxy, through
`agent_client.play_program` (appends, forks, sub-agents, compaction and branch finishes
keep their prefix structure; `TokenMap` scales the token counts):

- a generator (`cc`, `putnam`, `osworld`, `shift`): `agents` concurrent agents, each
  starting a new program when its last one finished, or, with `arrival_rate_per_min`, new
  agents at Poisson arrivals; no new agent starts after `duration_s`;
- a trace: its programs once — at their recorded arrival times when the trace has them
  (`agents` and the rate do not apply), else `agents` at a time in trace order; with
  `cycle`, the agents (or arrivals) of a generator, drawing the trace's programs over and
  over and ignoring their times (`pdlab simulate --cycle` does the same).

Workload times (tool gaps, trace arrivals) are multiplied by `time_scale`. `stop()` (or
`stop_when()` turning true, polled every 0.1 s) cancels every turn in flight: the proxy
sees the connections close and the engines abort the requests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from cluster.live.agent_client import TokenMap, TurnResult, play_program
from cluster.workloads import Program, WorkloadSource

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoopStats:
    """What the loop did so far (read from any thread; ints only grow)."""

    programs_started: int = 0
    programs_done: int = 0
    turns_ok: int = 0
    turns_failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few failures

    def add(self, r: TurnResult) -> None:
        if r.status == 200:
            self.turns_ok += 1
        else:
            self.turns_failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{r.program_id} turn {r.turn}: {r.status} {r.error}")


class AgentLoop:
    """See module docstring. `start()` returns at once; `stop()` waits for the thread."""

    def __init__(
        self,
        url: str,
        source: WorkloadSource,
        tokens: TokenMap,
        *,
        agents: int | None = 8,
        arrival_rate_per_min: float | None = None,
        duration_s: float | None = None,
        time_scale: float = 0.1,
        max_output_tokens: int = 32,
        seed: int = 0,
        stop_when: Callable[[], bool] | None = None,
        cycle: bool = False,
    ) -> None:
        if (agents is None) == (arrival_rate_per_min is None):
            raise ValueError("give either agents (closed loop) or arrival_rate_per_min")
        if agents is not None and agents < 1:
            raise ValueError(f"agents must be >= 1, got {agents}")
        if arrival_rate_per_min is not None and not arrival_rate_per_min > 0:
            raise ValueError(f"arrival_rate_per_min must be > 0, got {arrival_rate_per_min}")
        if not time_scale >= 0:
            raise ValueError(f"time_scale must be >= 0, got {time_scale}")
        self.url = url.rstrip("/")
        self.source = source
        self.tokens = tokens
        self.agents = agents
        self.rate = arrival_rate_per_min
        self.duration_s = duration_s
        self.time_scale = time_scale
        self.max_output_tokens = max_output_tokens
        self.rng = np.random.default_rng(seed)
        self.stop_when = stop_when
        self.cycle = cycle
        self.stats = LoopStats()
        self.finished = False  # every program the workload has was played
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdlab-agents", daemon=True)
        self._t0 = 0.0

    def start(self) -> AgentLoop:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> LoopStats:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return self.stats

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _stopping(self) -> bool:
        return self._stop.is_set() or (self.stop_when is not None and self.stop_when())

    def _open(self) -> bool:
        """New programs may start."""
        return self.duration_s is None or self.elapsed() < self.duration_s

    # ---- the event loop (its own thread) ------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the agent loop failed")

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits) as client:
            work = asyncio.create_task(self._drive(client))
            while not work.done() and not self._stopping():
                await asyncio.sleep(0.1)
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)

    async def _play(self, client: httpx.AsyncClient, program: Program) -> None:
        self.stats.programs_started += 1
        await play_program(
            client,
            self.url,
            program,
            self.tokens,
            max_output_tokens=self.max_output_tokens,
            gap_scale=self.time_scale,
            on_result=self.stats.add,
        )
        self.stats.programs_done += 1

    async def _drive(self, client: httpx.AsyncClient) -> None:
        trace = None if self.cycle else self.source.trace_programs()
        if trace is not None:
            await self._trace(client, trace)
            self.finished = True
        elif self.rate is not None:
            await self._open_loop(client)
        else:
            await asyncio.gather(*(self._agent(client) for _ in range(self.agents or 0)))

    async def _agent(self, client: httpx.AsyncClient) -> None:
        while self._open():
            await self._play(client, self.source.next_program(self.elapsed()))

    async def _open_loop(self, client: httpx.AsyncClient) -> None:
        assert self.rate is not None
        running: set[asyncio.Task[None]] = set()
        try:
            while self._open():
                await asyncio.sleep(float(self.rng.exponential(60.0 / self.rate)))
                task = asyncio.create_task(self._play(client, self.source.next_program(0.0)))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()

    async def _trace(self, client: httpx.AsyncClient, programs: list[Program]) -> None:
        if any(p.arrival_s is not None for p in programs):
            t0 = min(p.arrival_s or 0.0 for p in programs)

            async def at_arrival(p: Program) -> None:
                await asyncio.sleep(max(0.0, ((p.arrival_s or t0) - t0) * self.time_scale))
                if self._open():
                    await self._play(client, p)

            await asyncio.gather(*(at_arrival(p) for p in programs))
            return
        queue = list(reversed(programs))

        async def agent() -> None:
            while queue:
                await self._play(client, queue.pop())

        await asyncio.gather(*(agent() for _ in range(self.agents or 1)))
