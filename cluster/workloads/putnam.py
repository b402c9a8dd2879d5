"""`putnam`: a decode-heavy math agent with one branch (paper 000 §2.1, §6.1).

mini-SWE-agent proving PutnamBench theorems in Lean: a single branch per problem and no
context management (paper 000 §6.1); every step appends a short tool observation (Lean
compiler output, a `bash` look-up) and generates a long reasoning trace, so each request's
output far exceeds its uncached input. The agent stops when it finishes its step budget or when
its context would exceed the model's window (no compaction: it simply gives up).

Calibration targets (paper 000): best static split ~2P7D on 9 nodes (App. D.1); Evolving
Infra's KV hit rate 98.5% with 0.5% lost reuse, i.e. an ideal hit rate h* ~ 99% (Table C.1);
8.81 req/s at 224 agents (App. D.1), i.e. (E2E + pause) per request ~ 25 s, most of it decode
of ~3K output tokens plus a few seconds of Lean checking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cluster.core import ConfigError
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment
from cluster.workloads.source import PUTNAM_SYSTEM, GeneratorSource, check_positive
from cluster.workloads.tools import TokenDist, ToolMix, ToolProfile, program_scale


def _default_tools() -> ToolMix:
    return ToolMix(
        (
            # Lean check of a proof attempt: seconds, occasionally a slow elaboration/build.
            ToolProfile(
                "lean", 0.7, 4.0, 0.6, TokenDist(350, 1.0, 20, 8_000),
                long_share=0.03, long_median_s=45.0, long_sigma_s=0.6,
            ),
            # Look-ups in Mathlib (grep, cat): fast, medium-sized results.
            ToolProfile("bash", 0.3, 0.5, 0.8, TokenDist(450, 1.2, 10, 12_000)),
        )
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PutnamParams:
    """Parameters of `putnam`; defaults calibrated as in the module docstring."""

    system_tokens: int = 1_800  # shared mini-SWE-agent system prompt + Lean instructions
    # theorem statement + instance template
    task: TokenDist = field(default=TokenDist(600, 0.4, 150, 3_000))
    # LLM turns per problem (step budget)
    steps: TokenDist = field(default=TokenDist(24, 0.6, 2, 120))
    # Reasoning traces (decode-heavy): median 700, mean ~0.9K tokens per request, sized so
    # that 224 agents on 9 GB300 nodes (profile gb300) run at ~9 req/s as in paper 000
    # App. D.1 (8.81 req/s): E2E + pause ~ 25 s per request.
    output: TokenDist = field(default=TokenDist(700, 0.7, 64, 32_768))
    tools: ToolMix = field(default_factory=_default_tools)
    program_sigma: float = 0.3  # per-program lognormal scale of output and result sizes
    max_context_tokens: int = 131_072  # stop (no context management) beyond the window

    def __post_init__(self) -> None:
        check_positive("system_tokens", self.system_tokens)
        check_positive("max_context_tokens", self.max_context_tokens)
        if self.program_sigma < 0:
            raise ConfigError(f"parameter 'program_sigma' must be >= 0, got {self.program_sigma}")


class PutnamSource(GeneratorSource):
    name = "putnam"
    stream = 1
    params: PutnamParams

    def generate(self, rng: np.random.Generator, program_id: str) -> Program:
        p = self.params
        scale = program_scale(rng, p.program_sigma)
        b = ProgramBuilder(program_id, self.name, self.ids)
        system = Segment(PUTNAM_SYSTEM, p.system_tokens)
        b.start("root", (system, b.seg(p.task.draw(rng))), p.output.draw(rng, scale))
        for _ in range(1, p.steps.draw(rng)):
            tool, gap_s, result = p.tools.draw(rng, scale)
            if b.next_tokens("root", result) > p.max_context_tokens:
                break
            b.step("root", (b.seg(result),), p.output.draw(rng, scale), gap_s=gap_s, tool=tool)
        b.finish("root")
        return b.build()
