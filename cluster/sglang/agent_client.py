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
a small model), outputs are capped at `max_output_tokens`, and a turn's output tokens are
the ids the engine actually generated (`output_ids`), as an agent harness would append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import numpy as np

from cluster.workloads.program import Program, Segment, Turn


@dataclass(frozen=True, slots=True)
class TokenMap:
    """Deterministic token ids for segments (see module docstring)."""

    vocab_lo: int = 1000
    vocab_hi: int = 30_000
    token_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.vocab_lo < self.vocab_hi:
            raise ValueError(f"need 0 <= vocab_lo < vocab_hi, got {self.vocab_lo}, {self.vocab_hi}")
        if not self.token_scale > 0:
            raise ValueError(f"token_scale must be > 0, got {self.token_scale}")

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
) -> list[TurnResult]:
    """Play one program's turns through the proxy at `url`; returns one result per turn."""
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
        budget = max(1, min(turn.output_tokens, max_output_tokens))
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": budget, "ignore_eos": True},
        }
        t0 = time.monotonic()
        error = None
        try:
            r = await client.post(f"{url}/generate", json=body, headers=headers, timeout=timeout_s)
            status = r.status_code
            doc = r.json() if status == 200 else {}
            if status != 200:
                error = r.text[:300]
        except httpx.HTTPError as e:
            status, doc, error = 599, {}, f"{type(e).__name__}: {e}"
            r = None
        out = doc.get("output_ids")
        if not isinstance(out, list):  # no ids (an error): the synthetic output stands in
            out = tokens.segment(Segment(turn.output_seg, max(budget, 1)))
        run.inputs[i] = pieces
        run.outputs[i] = list(out)
        run.last_of_branch[turn.branch_id] = i
        h = r.headers if r is not None else {}
        results.append(
            TurnResult(
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
        )
        if turn.finishes_branch:
            await client.post(
                f"{url}/v1/branches/{branch_key(program, turn.branch_id)}/finish", timeout=30.0
            )
        run.done[i].set()

    await asyncio.gather(*(one(i, t) for i, t in enumerate(program.turns)))
    return sorted(results, key=lambda r: r.turn)


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
