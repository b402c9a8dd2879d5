"""`cc`: Claude-Code-like coding agents with sub-agents, forks, compaction and long pauses.

Paper 000 §2.1, §6.1 and Fig. 2(c). The root branch runs a tool loop: each turn appends the
result of the tool its predecessor called (`bash`, `read`, `edit`, `search`, `web`, `todo`) or
the user's next message (`user`). The pause before a turn is drawn per tool from a heavy-tailed
mixture, so a few long gaps (test suites, builds, user think time) hold most of the pause time.

- Sub-agent bursts: at a root turn the harness spawns several sub-agents at once (a prefill
  burst, paper 000 §3.2). Each is a "subagent" branch starting from the shared sub-agent system
  prompt plus its task, runs its own tool loop and finishes. The root's next turn depends on the
  last turn of every sub-agent of the burst and appends their short reports, so almost all of
  its prompt (prev context + prev output) is reusable after a long wait.
- Forks: occasionally a side request (a "fork" branch of 1-3 turns) reuses the root's current
  context and output; the root does not wait for it.
- Compaction: when the root's next context would exceed `compact_threshold_tokens`, the root
  first sends a summarization request (history + instruction; its output is the summary), then
  a "compact" turn whose context keeps only the shared system prompt and tool schemas
  (compact_keep=2) followed by the summary and the files/todos the harness restores. Only the
  shared prefix is reusable then.

Calibration (paper 000 Fig. 2(c), §2.1; paper 003 §1 citing TraceLab): ~98% of the prompt after
a (359 s) sub-agent call matches earlier KV, ~14% after a (12 s) compaction; tool calls over one
minute are ~4% of calls and ~85% of tool time; global prefix hit rate 95.7% (TraceLab) and
h* ~ 97.4% for CC in paper 000 Table C.1 (97.08% hit, 0.32% lost), so we aim at h* ~ 95-97%;
GitHub Copilot's median gap between user turns is 172 s (the `user` tool). Best static split
3P6D-4P5D on 9 nodes; 5.40 req/s at 90 agents (App. D.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cluster.core import ConfigError
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds
from cluster.workloads.source import (
    CC_SUBAGENT_SYSTEM,
    CC_SYSTEM,
    CC_TOOLS,
    GeneratorSource,
    check_fraction,
    check_positive,
)
from cluster.workloads.tools import Categorical, TokenDist, ToolMix, ToolProfile, program_scale


def _root_tools() -> ToolMix:
    return ToolMix(
        (
            # Shell commands; 8% are test suites or builds of a minute or more.
            ToolProfile(
                "bash", 0.30, 1.5, 1.0, TokenDist(600, 1.2, 5, 30_000),
                long_share=0.08, long_median_s=100.0, long_sigma_s=0.8,
            ),
            ToolProfile("read", 0.24, 0.15, 0.6, TokenDist(3_000, 1.1, 20, 40_000)),
            ToolProfile("edit", 0.16, 0.3, 0.6, TokenDist(150, 0.6, 10, 3_000)),
            ToolProfile("search", 0.16, 0.4, 0.7, TokenDist(800, 1.0, 10, 15_000)),
            ToolProfile(
                "web", 0.03, 4.0, 0.8, TokenDist(2_500, 0.7, 100, 20_000),
                long_share=0.1, long_median_s=40.0, long_sigma_s=0.6,
            ),
            ToolProfile("todo", 0.07, 0.02, 0.5, TokenDist(120, 0.5, 10, 1_000)),
            # The user reads the answer and types the next message (Copilot median 172 s).
            ToolProfile("user", 0.05, 172.0, 1.0, TokenDist(80, 1.0, 3, 5_000)),
        )
    )  # fmt: skip


def _subagent_tools() -> ToolMix:
    # Sub-agents mostly explore (read, search) and run a few commands; no user in the loop.
    return ToolMix(
        (
            ToolProfile("read", 0.45, 0.15, 0.6, TokenDist(1_000, 1.0, 20, 20_000)),
            ToolProfile("search", 0.35, 0.4, 0.7, TokenDist(400, 1.0, 10, 10_000)),
            ToolProfile(
                "bash", 0.20, 1.0, 0.9, TokenDist(300, 1.2, 5, 15_000),
                long_share=0.02, long_median_s=60.0, long_sigma_s=0.7,
            ),
        )
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class CCParams:
    """Parameters of `cc`; defaults calibrated as in the module docstring."""

    # Shared prefix of every root context (the only part that survives compaction; sized so
    # that ~14% of the first post-compaction prompt is reusable).
    system_tokens: int = 2_500
    tool_schema_tokens: int = 1_500
    task: TokenDist = field(default=TokenDist(300, 1.0, 10, 20_000))  # the user's first message
    # Root tool-loop steps per session (~190 requests per program with sub-agents and forks).
    root_turns: TokenDist = field(default=TokenDist(80, 0.7, 8, 600))
    # Tool calls and answers, occasionally a whole file (sized with the tool results so that
    # 126 agents load 9 GB300 nodes as in paper 000: E2E + pause ~ 20-30 s per request).
    output: TokenDist = field(default=TokenDist(360, 1.1, 8, 8_000))
    tools: ToolMix = field(default_factory=_root_tools)
    # Sub-agent bursts (Task tool): probability per root step and burst sizes; several
    # sub-agents start together, a short burst of prefill work (paper 000 §3.2).
    burst_prob: float = 0.02
    burst_sizes: tuple[int, ...] = (1, 2, 3, 4, 5)
    burst_weights: tuple[float, ...] = (0.25, 0.30, 0.25, 0.12, 0.08)
    subagent_system_tokens: int = 1_800
    subagent_task: TokenDist = field(default=TokenDist(350, 0.6, 30, 4_000))
    subagent_turns: TokenDist = field(default=TokenDist(14, 0.6, 2, 80))
    subagent_output: TokenDist = field(default=TokenDist(200, 1.0, 8, 6_000))
    subagent_tools: ToolMix = field(default_factory=_subagent_tools)
    # Each sub-agent's report, appended to the root at the join: small, so ~98% of the joining
    # prompt is reusable (paper 000 Fig. 2(c)).
    subagent_report: TokenDist = field(default=TokenDist(300, 0.7, 30, 4_000))
    spawn_gap_s: float = 0.05  # harness delay before a sub-agent's first request
    join_gap_s: float = 0.05  # ... and before the root resumes after the last one finishes
    # Forks (side requests on the current context).
    fork_prob: float = 0.01
    fork_turns: TokenDist = field(default=TokenDist(1.5, 0.5, 1, 4))
    fork_append: TokenDist = field(default=TokenDist(200, 0.6, 20, 2_000))
    fork_output: TokenDist = field(default=TokenDist(120, 0.8, 8, 2_000))
    fork_gap_s: float = 0.05
    # Compaction when the root's next context would exceed the threshold (with the token
    # distributions above this gives h* ~ 96.5%, between TraceLab's 95.7% and paper 000's 97.4%).
    compact_threshold_tokens: int = 150_000
    compact_instruction_tokens: int = 400
    # Output of the summarization request (~1.2K tokens, i.e. a ~12 s compaction call).
    summary: TokenDist = field(default=TokenDist(1_200, 0.4, 200, 8_000))
    # Files and todos the harness re-attaches after the summary; with the 4K shared prefix this
    # leaves ~14% of the post-compaction prompt reusable (paper 000 Fig. 2(c)).
    restored: TokenDist = field(default=TokenDist(24_000, 0.4, 2_000, 60_000))
    compact_gap_s: float = 0.2
    program_sigma: float = 0.3  # per-program lognormal scale of outputs and results

    def __post_init__(self) -> None:
        for name in ("system_tokens", "tool_schema_tokens", "subagent_system_tokens",
                     "compact_threshold_tokens", "compact_instruction_tokens"):  # fmt: skip
            check_positive(name, getattr(self, name))
        check_fraction("burst_prob", self.burst_prob)
        check_fraction("fork_prob", self.fork_prob)
        if len(self.burst_sizes) != len(self.burst_weights) or not self.burst_sizes:
            raise ConfigError(
                "parameters 'burst_sizes' and 'burst_weights' need equal, non-zero length"
            )
        if min(self.burst_sizes) < 1 or min(self.burst_weights) < 0 or sum(self.burst_weights) <= 0:
            raise ConfigError(
                "parameter 'burst_sizes' must be >= 1 and 'burst_weights' >= 0, sum > 0"
            )
        for name in ("spawn_gap_s", "join_gap_s", "fork_gap_s", "compact_gap_s", "program_sigma"):
            if getattr(self, name) < 0:
                raise ConfigError(f"parameter {name!r} must be >= 0, got {getattr(self, name)}")


class CCSource(GeneratorSource):
    name = "cc"
    stream = 2
    params: CCParams

    def __init__(
        self,
        params: CCParams,
        *,
        seed: int = 0,
        ids: SegmentIds | None = None,
        duration_s: float | None = None,
    ) -> None:
        super().__init__(params, seed=seed, ids=ids, duration_s=duration_s)
        self._burst_size = Categorical(params.burst_weights)

    def generate(self, rng: np.random.Generator, program_id: str) -> Program:
        p = self.params
        scale = program_scale(rng, p.program_sigma)
        b = ProgramBuilder(program_id, self.name, self.ids)
        shared = (Segment(CC_SYSTEM, p.system_tokens), Segment(CC_TOOLS, p.tool_schema_tokens))
        t = b.start("root", (*shared, b.seg(p.task.draw(rng))), p.output.draw(rng, scale))
        num_bursts = num_forks = 0
        num_steps = p.root_turns.draw(rng)
        for k in range(1, num_steps):
            last = k == num_steps - 1
            if not last and rng.random() < p.burst_prob:
                size = int(p.burst_sizes[self._burst_size.draw(rng)])
                t = self._burst(b, rng, scale, t, f"sub{num_bursts}", size)
                num_bursts += 1
            else:
                tool, gap_s, result = p.tools.draw(rng, scale)
                if b.next_tokens("root", result) > p.compact_threshold_tokens:
                    t = self._compact(b, rng, scale, result, gap_s, tool, len(shared))
                else:
                    t = b.step(
                        "root", (b.seg(result),), p.output.draw(rng, scale), gap_s=gap_s, tool=tool
                    )
            if not last and rng.random() < p.fork_prob:
                self._fork(b, rng, scale, t, f"fork{num_forks}")
                num_forks += 1
        b.finish("root")
        return b.build()

    def _burst(
        self,
        b: ProgramBuilder,
        rng: np.random.Generator,
        scale: float,
        spawn: int,
        prefix: str,
        size: int,
    ) -> int:
        """Spawn `size` sub-agents at root turn `spawn`; return the root's joining turn."""
        p = self.params
        system = Segment(CC_SUBAGENT_SYSTEM, p.subagent_system_tokens)
        lasts: list[int] = []
        reports: list[Segment] = []
        for j in range(size):
            branch = f"{prefix}.{j}"
            task = b.seg(p.subagent_task.draw(rng))
            s = b.subagent(
                branch,
                spawn,
                (system, task),
                p.subagent_output.draw(rng, scale),
                gap_s=p.spawn_gap_s,
            )
            for _ in range(1, p.subagent_turns.draw(rng)):
                tool, gap_s, result = p.subagent_tools.draw(rng, scale)
                s = b.step(
                    branch,
                    (b.seg(result),),
                    p.subagent_output.draw(rng, scale),
                    gap_s=gap_s,
                    tool=tool,
                )
            b.finish(branch)
            lasts.append(s)
            reports.append(b.seg(p.subagent_report.draw(rng, scale)))
        return b.step(
            "root",
            reports,
            p.output.draw(rng, scale),
            gap_s=p.join_gap_s,
            tool="subagent",
            extra_deps=lasts,
        )

    def _compact(
        self,
        b: ProgramBuilder,
        rng: np.random.Generator,
        scale: float,
        result: int,
        gap_s: float,
        tool: str,
        keep: int,
    ) -> int:
        """Summarization request on the full history, then the compacted context."""
        p = self.params
        instruction = b.seg(p.compact_instruction_tokens)
        summary_tokens = p.summary.draw(rng)
        b.step("root", (b.seg(result), instruction), summary_tokens, gap_s=gap_s, tool=tool)
        # The summary re-enters as a new user message after the shared prefix; its KV sits at a
        # new position, so only the `keep` shared segments are reusable.
        summary = b.seg(summary_tokens + 100)
        restored = b.seg(p.restored.draw(rng))
        return b.compact(
            "root",
            keep,
            (summary, restored),
            p.output.draw(rng, scale),
            gap_s=p.compact_gap_s,
            tool="compact",
        )

    def _fork(
        self,
        b: ProgramBuilder,
        rng: np.random.Generator,
        scale: float,
        parent_turn: int,
        branch: str,
    ) -> None:
        p = self.params
        b.fork(
            branch,
            parent_turn,
            (b.seg(p.fork_append.draw(rng)),),
            p.fork_output.draw(rng, scale),
            gap_s=p.fork_gap_s,
        )
        for _ in range(1, p.fork_turns.draw(rng)):
            tool, gap_s, result = p.subagent_tools.draw(rng, scale)
            b.step(branch, (b.seg(result),), p.fork_output.draw(rng, scale), gap_s=gap_s, tool=tool)
        b.finish(branch)
