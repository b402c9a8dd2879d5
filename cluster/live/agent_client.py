"""Agent programs played against a live PD cluster through its proxy (paper 003 §3; SPEC §6).

The simulator's workloads (`cluster.workloads`: putnam, cc, osworld, shift) describe agents
as DAGs of turns over segment contexts. `play_programs` turns them into token-id requests
and sends them to the proxy's /generate with the branch headers, so a live cluster sees the
same structure the simulator does: appends, forks, sub-agents, compaction and branch
finishes (`POST /v1/branches/{id}/finish`). Successor turns are released causally
(after their dependencies complete, plus the turn's gap times `gap_scale`).

Segments become token ids through `TokenMap`: a segment's ids are drawn from a generator
seeded by its id, so equal segments (a shared system prompt) give equal tokens and the
engines' prefix caches see real sharing. `token_scale` shrinks contexts (a short check on
a small model), `output_scale` (if set) the turns' output lengths, outputs are capped at
`max_output_tokens`, and a turn's output tokens are the ids the engine actually generated
(`output_ids`), as an agent harness would append. Answers are streamed (SSE), as a harness
reads them, so the proxy's first-token time is when the first token is out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx
import numpy as np

from cluster.sglang.payloads import event_error, sse_events
from cluster.workloads.program import Program, Segment, Turn


@dataclass(frozen=True, slots=True)
class TokenMap:
    """Deterministic token ids for segments (see module docstring)."""

    vocab_lo: int = 1000
    vocab_hi: int = 30_000
    token_scale: float = 1.0
    seed: int = 0
    output_scale: float | None = None  # None: output lengths as the workload says

    def __post_init__(self) -> None:
        if not 0 <= self.vocab_lo < self.vocab_hi:
            raise ValueError(f"need 0 <= vocab_lo < vocab_hi, got {self.vocab_lo}, {self.vocab_hi}")
        if not self.token_scale > 0:
            raise ValueError(f"token_scale must be > 0, got {self.token_scale}")
        if self.output_scale is not None and not self.output_scale > 0:
            raise ValueError(f"output_scale must be > 0, got {self.output_scale}")

    def output_budget(self, output_tokens: int, cap: int) -> int:
        """max_new_tokens of a turn that outputs `output_tokens` in the workload (>= 1)."""
        n = output_tokens if self.output_scale is None else output_tokens * self.output_scale
        return max(1, min(round(n), cap))

    def segment(self, seg: Segment) -> list[int]:
        n = max(1, round(seg.tokens * self.token_scale))
        rng = np.random.default_rng((self.seed, seg.seg_id))
        return rng.integers(self.vocab_lo, self.vocab_hi, n).tolist()


class TurnResult(NamedTuple):
    program_id: str
    turn: int
    branch_id: str
    kind: str
    status: int
    input_tokens: int
    output_tokens: int
    prefill_node: int | None
    decode_node: int | None
    attempts: int
    e2e_s: float
    error: str | None


def branch_key(program: Program, branch: str) -> str:
    """The X-Branch-Id of a program's branch (unique across programs)."""
    return f"{program.program_id}/{branch}"


class _ProgramRun:
    """Context bookkeeping of one program: per turn its input pieces and its output ids."""

    def __init__(self, program: Program, tokens: TokenMap) -> None:
        self.program = program
        self.tokens = tokens
        self.inputs: dict[int, list[list[int]]] = {}  # turn -> pieces (one per segment)
        self.outputs: dict[int, list[int]] = {}
        self.last_of_branch: dict[str, int] = {}
        self.done = {i: asyncio.Event() for i in range(len(program.turns))}

    def _extended(self, j: int) -> list[list[int]]:
        """Turn j's context plus its output (a segment only if the turn has output tokens,
        as in `ProgramBuilder.extended`, so compact_keep counts the same pieces)."""
        out = [self.outputs[j]] if self.program.turns[j].output_tokens > 0 else []
        return [*self.inputs[j], *out]

    def context(self, i: int, turn: Turn) -> list[list[int]]:
        append = [self.tokens.segment(s) for s in turn.append]
        if turn.kind in ("start", "subagent"):
            return append
        if turn.kind == "fork":
            assert turn.parent_turn is not None
            return [*self._extended(turn.parent_turn), *append]
        prev = self.last_of_branch[turn.branch_id]
        if turn.kind == "compact":
            return [*self.inputs[prev][: turn.compact_keep], *append]
        return [*self._extended(prev), *append]


async def play_program(
    client: httpx.AsyncClient,
    url: str,
    program: Program,
    tokens: TokenMap,
    *,
    max_output_tokens: int = 64,
    gap_scale: float = 0.0,
    timeout_s: float = 300.0,
    on_result: Callable[[TurnResult], None] | None = None,
) -> list[TurnResult]:
    """Play one program's turns through the proxy at `url`; returns one result per turn
    (also handed to `on_result` as each turn ends)."""
    run = _ProgramRun(program, tokens)
    results: list[TurnResult] = []

    async def one(i: int, turn: Turn) -> None:
        for d in turn.deps:
            await run.done[d].wait()
        if turn.gap_s and gap_scale > 0:
            await asyncio.sleep(turn.gap_s * gap_scale)
        pieces = run.context(i, turn)
        ids = [t for piece in pieces for t in piece]
        headers = {
            "X-Program-Id": program.program_id,
            "X-Branch-Id": branch_key(program, turn.branch_id),
        }
        if turn.kind in ("start", "fork", "subagent"):
            headers["X-Branch-Kind"] = turn.kind
            if turn.parent_branch is not None:
                headers["X-Parent-Branch-Id"] = branch_key(program, turn.parent_branch)
        budget = tokens.output_budget(turn.output_tokens, max_output_tokens)
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": budget, "ignore_eos": True},
            "stream": True,
        }
        t0 = time.monotonic()
        try:
            status, doc, error, h = await _generate(
                client, f"{url}/generate", body, headers, timeout_s
            )
        except httpx.HTTPError as e:
            status, doc, error, h = 599, {}, f"{type(e).__name__}: {e}", {}
        out = doc.get("output_ids")
        if not isinstance(out, list):  # no ids (an error): the synthetic output stands in
            out = tokens.segment(Segment(turn.output_seg, max(budget, 1)))
        run.inputs[i] = pieces
        run.outputs[i] = list(out)
        run.last_of_branch[turn.branch_id] = i
        result = TurnResult(
            program.program_id,
            i,
            turn.branch_id,
            turn.kind,
            status,
            len(ids),
            len(out) if status == 200 else 0,
            int(h["x-pd-prefill-node"]) if "x-pd-prefill-node" in h else None,
            int(h["x-pd-decode-node"]) if "x-pd-decode-node" in h else None,
            int(h.get("x-pd-attempts", 0)),
            time.monotonic() - t0,
            error,
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
        if turn.finishes_branch:
            await client.post(
                f"{url}/v1/branches/{branch_key(program, turn.branch_id)}/finish", timeout=30.0
            )
        run.done[i].set()

    await asyncio.gather(*(one(i, t) for i, t in enumerate(program.turns)))
    return sorted(results, key=lambda r: r.turn)


async def _generate(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float,
) -> tuple[int, dict[str, Any], str | None, Mapping[str, str]]:
    """One streamed /generate: (status, the last event, error or None, response headers).
    The answer streams as an agent harness reads it, so the proxy records the first token
    when it is out (a whole answer at once would make TTFT the time to the last token)."""
    async with client.stream("POST", url, json=body, headers=headers, timeout=timeout_s) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode("utf-8", "replace")
            return r.status_code, {}, text[:300], r.headers
        last: dict[str, Any] = {}
        pending = b""
        async for data in r.aiter_bytes():
            events, pending = sse_events(pending + data)
            last = next((e for e in reversed(events) if isinstance(e, dict)), last)
    problem = event_error(last)
    if problem is not None:
        return problem[1], {}, problem[0][:300], r.headers
    return 200, last, None, r.headers


async def play_programs(
    url: str,
    programs: Sequence[Program],
    tokens: TokenMap,
    *,
    max_output_tokens: int = 64,
    gap_scale: float = 0.0,
    timeout_s: float = 300.0,
) -> list[TurnResult]:
    """Play programs concurrently (one agent each) through the proxy at `url`."""
    async with httpx.AsyncClient() as client:
        per = await asyncio.gather(
            *(
                play_program(
                    client,
                    url,
                    p,
                    tokens,
                    max_output_tokens=max_output_tokens,
                    gap_scale=gap_scale,
                    timeout_s=timeout_s,
                )
                for p in programs
            )
        )
    return [r for rs in per for r in rs]
