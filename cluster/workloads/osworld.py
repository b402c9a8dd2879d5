"""`osworld`: prefill-heavy, multimodal, multi-agent computer use (paper 000 §2.1, §6.1).

Anthropic's computer-use agent on OSWorld 2.0 (long-horizon desktop tasks): every step executes
a GUI action and appends its short text result plus a new screenshot (~1.5-3K image tokens);
outputs are short actions. So each request prefills thousands of new tokens and decodes a few
hundred (prefill-heavy, paper 000 §2.1).

- Multi-agent: an orchestrator (root branch) works through the task and occasionally delegates
  a sub-task to one or two worker sub-agents ("subagent" branches starting from a shared worker
  prompt, the sub-task and a screenshot); it resumes when they finish, appending their short
  reports and a fresh screenshot.
- Screenshot dropping: like Anthropic's computer-use reference loop, a branch keeps only the
  newest `keep_images` screenshots and removes older ones in chunks of `image_removal_chunk`
  so that the prompt cache breaks rarely. A removal is a "compact" turn: the context up to the
  first removed screenshot survives (compact_keep), the rest is re-sent without the removed
  images (same segment ids, new positions, hence uncached).

Our `keep_images`/`image_removal_chunk` are calibrated to paper 000's OSWorld hit rate, not
copied from the reference loop. Calibration (paper 000): Evolving Infra's KV hit rate 93.8%
with 0.2% lost reuse, i.e. h* ~ 94% (Table C.1); best static split 7P2D-8P1D on 9 nodes;
4.30 req/s at 128 agents with a mean E2E of 24.2 s (App. D.1), so ~5 s of pause per request
(action execution, UI settling, screenshot capture).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cluster.core import ConfigError
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds
from cluster.workloads.source import (
    OSWORLD_SYSTEM,
    OSWORLD_WORKER_SYSTEM,
    GeneratorSource,
    check_fraction,
    check_positive,
)
from cluster.workloads.tools import Categorical, TokenDist, ToolMix, ToolProfile, program_scale


def _default_tools() -> ToolMix:
    # One GUI action + wait for the UI to settle + screenshot; 3% wait for an app or page load.
    return ToolMix(
        (
            ToolProfile(
                "screenshot", 1.0, 4.0, 0.5, TokenDist(60, 0.6, 5, 1_000),
                long_share=0.03, long_median_s=25.0, long_sigma_s=0.6,
            ),
        )
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class OSWorldParams:
    """Parameters of `osworld`; defaults calibrated as in the module docstring."""

    system_tokens: int = 2_500  # shared computer-use system prompt + tool schema
    worker_system_tokens: int = 1_800  # shared worker prompt
    task: TokenDist = field(default=TokenDist(250, 0.5, 30, 2_000))
    # image tokens per step
    screenshot: TokenDist = field(default=TokenDist(2_300, 0.15, 1_500, 3_000))
    # orchestrator steps (long-horizon tasks)
    steps: TokenDist = field(default=TokenDist(40, 0.5, 5, 150))
    output: TokenDist = field(default=TokenDist(180, 0.6, 16, 4_000))  # short actions
    tools: ToolMix = field(default_factory=_default_tools)  # gap and text result per step
    delegate_prob: float = 0.04  # per orchestrator step: delegate a sub-task to workers
    worker_sizes: tuple[int, ...] = (1, 2)
    worker_weights: tuple[float, ...] = (0.8, 0.2)
    worker_task: TokenDist = field(default=TokenDist(150, 0.5, 20, 1_500))
    worker_steps: TokenDist = field(default=TokenDist(10, 0.5, 2, 40))
    worker_report: TokenDist = field(default=TokenDist(120, 0.6, 10, 1_500))
    spawn_gap_s: float = 0.1
    join_gap_s: float = 0.1
    keep_images: int = 16  # newest screenshots a branch keeps
    image_removal_chunk: int = 24  # older ones are removed in multiples of this
    program_sigma: float = 0.2

    def __post_init__(self) -> None:
        for name in ("system_tokens", "worker_system_tokens", "keep_images", "image_removal_chunk"):
            check_positive(name, getattr(self, name))
        check_fraction("delegate_prob", self.delegate_prob)
        if len(self.worker_sizes) != len(self.worker_weights) or not self.worker_sizes:
            raise ConfigError(
                "parameters 'worker_sizes' and 'worker_weights' need equal, non-zero length"
            )
        if (
            min(self.worker_sizes) < 1
            or min(self.worker_weights) < 0
            or sum(self.worker_weights) <= 0
        ):
            raise ConfigError(
                "parameter 'worker_sizes' must be >= 1 and 'worker_weights' >= 0, sum > 0"
            )
        for name in ("spawn_gap_s", "join_gap_s", "program_sigma"):
            if getattr(self, name) < 0:
                raise ConfigError(f"parameter {name!r} must be >= 0, got {getattr(self, name)}")


class _Shots:
    """A program's screenshots: their segment ids, and for each branch the positions of the
    screenshots in its latest turn's context (kept as turns are added, not rescanned)."""

    __slots__ = ("held", "ids")

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.held: dict[str, list[int]] = {}

    def rescan(self, b: ProgramBuilder, branch: str) -> None:
        ctx = b.context(b.last_turn(branch))
        self.held[branch] = [i for i, s in enumerate(ctx) if s.seg_id in self.ids]


class OSWorldSource(GeneratorSource):
    name = "osworld"
    stream = 3
    params: OSWorldParams

    def __init__(
        self,
        params: OSWorldParams,
        *,
        seed: int = 0,
        ids: SegmentIds | None = None,
        duration_s: float | None = None,
    ) -> None:
        super().__init__(params, seed=seed, ids=ids, duration_s=duration_s)
        self._worker_size = Categorical(params.worker_weights)

    def generate(self, rng: np.random.Generator, program_id: str) -> Program:
        p = self.params
        scale = program_scale(rng, p.program_sigma)
        b = ProgramBuilder(program_id, self.name, self.ids)
        images = _Shots()
        system = Segment(OSWORLD_SYSTEM, p.system_tokens)
        b.start(
            "root",
            (system, b.seg(p.task.draw(rng)), self._shot(b, rng, images)),
            p.output.draw(rng, scale),
        )
        images.rescan(b, "root")
        num_steps = p.steps.draw(rng)
        delegations = 0
        for k in range(1, num_steps):
            if k < num_steps - 1 and rng.random() < p.delegate_prob:
                size = int(p.worker_sizes[self._worker_size.draw(rng)])
                spawn = b.last_turn("root")
                lasts = [
                    self._worker(b, rng, scale, images, spawn, f"worker{delegations}.{j}")
                    for j in range(size)
                ]
                delegations += 1
                reports = [b.seg(p.worker_report.draw(rng, scale)) for _ in lasts]
                self._gui_step(
                    b,
                    rng,
                    scale,
                    images,
                    "root",
                    "subagent",
                    p.join_gap_s,
                    reports,
                    extra_deps=lasts,
                )
            else:
                tool, gap_s, text = p.tools.draw(rng, scale)
                self._gui_step(b, rng, scale, images, "root", tool, gap_s, (b.seg(text),))
        b.finish("root")
        return b.build()

    def _shot(self, b: ProgramBuilder, rng: np.random.Generator, images: _Shots) -> Segment:
        shot = b.seg(self.params.screenshot.draw(rng))
        images.ids.add(shot.seg_id)
        return shot

    def _worker(
        self,
        b: ProgramBuilder,
        rng: np.random.Generator,
        scale: float,
        images: _Shots,
        spawn: int,
        branch: str,
    ) -> int:
        p = self.params
        system = Segment(OSWORLD_WORKER_SYSTEM, p.worker_system_tokens)
        append = (system, b.seg(p.worker_task.draw(rng)), self._shot(b, rng, images))
        last = b.subagent(branch, spawn, append, p.output.draw(rng, scale), gap_s=p.spawn_gap_s)
        images.rescan(b, branch)
        for _ in range(1, p.worker_steps.draw(rng)):
            tool, gap_s, text = p.tools.draw(rng, scale)
            last = self._gui_step(b, rng, scale, images, branch, tool, gap_s, (b.seg(text),))
        b.finish(branch)
        return last

    def _gui_step(
        self,
        b: ProgramBuilder,
        rng: np.random.Generator,
        scale: float,
        images: _Shots,
        branch: str,
        tool: str,
        gap_s: float,
        text: Sequence[Segment],
        extra_deps: Iterable[int] = (),
    ) -> int:
        """Append text + a new screenshot; drop old screenshots in chunks when over the limit."""
        p = self.params
        new = (*text, self._shot(b, rng, images))
        output = p.output.draw(rng, scale)
        held = images.held[branch]  # screenshot positions in the branch's latest context
        excess = len(held) + 1 - p.keep_images
        remove = excess - excess % p.image_removal_chunk if excess >= p.image_removal_chunk else 0
        if remove <= 0:
            t = b.step(branch, new, output, gap_s=gap_s, tool=tool, extra_deps=extra_deps)
            held.append(b.context_len(t) - 1)  # the new screenshot (text and outputs are not)
            return t
        prev = b.last_turn(branch)
        ctx = b.context(prev)
        dropped = set(held[:remove])
        first = held[0]
        out = b.output(prev)
        tail = [s for i, s in enumerate(ctx) if i >= first and i not in dropped]
        tail += [out] if out is not None else []
        t = b.compact(
            branch, first, (*tail, *new), output, gap_s=gap_s, tool=tool, extra_deps=extra_deps
        )
        images.rescan(b, branch)
        return t
