"""Workload sources: where the simulator's closed and open loops get agent programs.

Paper 003 §3.2 (programs arrive exogenously; successor turns are released causally from
simulated completions) and paper 000 §6.1 (closed loop: a fixed number of agents, each finished
agent replaced by a new one; App. D.3: open loop, Poisson agent arrivals with an admission
limit). A source hands out whole programs; the simulator alone decides when turns run and
reveals `output_tokens` and `gap_s` to policies only as they occur (non-anticipatory state).

Shared content ids (below `SHARED_SEGMENT_LIMIT`): generators use the fixed ids below for the
system prompts, tool schemas and sub-agent prompts of their workload, so every program of a
workload shares them (and only them) with every other. One simulation should use one source
(`shift` composes `putnam` and `osworld` on one allocator), since the ids name the content of
the default-sized prompts of that source. Mooncake hash blocks use ids from
`TRACE_BLOCK_BASE` upward.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.random import PCG64, SeedSequence

from cluster.core import ConfigError
from cluster.workloads.program import SHARED_SEGMENT_LIMIT, Program, SegmentIds

# Fixed ids of content shared across the programs of one workload.
PUTNAM_SYSTEM = 1  # mini-SWE-agent system prompt + Lean instructions
CC_SYSTEM = 10  # Claude Code system prompt
CC_TOOLS = 11  # its tool schemas
CC_SUBAGENT_SYSTEM = 12  # the sub-agent (Task) system prompt
OSWORLD_SYSTEM = 20  # computer-use system prompt + tool schema (orchestrator)
OSWORLD_WORKER_SYSTEM = 21  # worker sub-agent prompt
TRACE_BLOCK_BASE = 1 << 16  # Mooncake hash_id h -> segment id TRACE_BLOCK_BASE + h
assert TRACE_BLOCK_BASE < SHARED_SEGMENT_LIMIT


@runtime_checkable
class WorkloadSource(Protocol):
    """What the simulator codes against (see `make_workload`)."""

    name: str
    params: Any  # a frozen dataclass of the documented parameters
    recorded_concurrency: int | None
    recorded_turn_times: dict[tuple[str, int], tuple[float, float]] | None

    def next_program(self, now: float) -> Program:
        """A new agent; deterministic given the seed and the sequence of calls."""
        ...

    def trace_programs(self) -> list[Program] | None:
        """The finite program list of a trace replay (with `arrival_s` for open-loop
        traces), or None for generators."""
        ...

    def target_concurrency(self, now: float) -> int | None:
        """The closed-loop concurrency the workload prescribes at `now` (shift: paper 000
        §6.1's 288 -> 216 -> 144 agents; a recorded trace: its concurrency), else None."""
        ...


P = TypeVar("P")


def params_from(cls: type[P], workload: str, overrides: dict[str, Any]) -> P:
    """Build a frozen params dataclass from keyword overrides, with errors naming the param."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown parameter(s) {', '.join(map(repr, unknown))} for workload {workload!r}; "
            f"allowed: {', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {}
    defaults = cls()
    for name, value in overrides.items():
        values[name] = _coerce(workload, name, value, getattr(defaults, name))
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"workload {workload!r}: bad parameters {overrides}: {exc}") from exc


def _coerce(workload: str, name: str, value: Any, default: Any) -> Any:
    """Accept numbers given as strings (CLI) for numeric params; reject other type mismatches."""
    want = type(default)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
    elif isinstance(default, int | float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            if want is int and float(value) != int(value):
                raise ConfigError(
                    f"workload {workload!r}: parameter {name!r} must be an integer, got {value!r}"
                )
            return want(value)
        if isinstance(value, str):
            try:
                return want(float(value)) if want is float else int(value)
            except ValueError:
                pass
    elif default is None or isinstance(value, want):
        return value
    elif isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    raise ConfigError(
        f"workload {workload!r}: parameter {name!r} must be of type {want.__name__}, got {value!r}"
    )


def check_fraction(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ConfigError(f"parameter {name!r} must lie in [0, 1], got {value}")


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"parameter {name!r} must be > 0, got {value}")


class GeneratorSource:
    """Base of the synthetic generators: seeded per-program streams, program ids, one
    segment-id allocator (shared with siblings when composed, as in `shift`)."""

    name: str  # set by each subclass
    stream: ClassVar[int]  # separates the random streams of different generators

    def __init__(
        self,
        params: Any,
        *,
        seed: int = 0,
        ids: SegmentIds | None = None,
        duration_s: float | None = None,
    ) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
        self.params = params
        self.seed = seed
        self.ids = ids if ids is not None else SegmentIds()
        self.duration_s = duration_s
        self.recorded_concurrency: int | None = None
        self.recorded_turn_times: dict[tuple[str, int], tuple[float, float]] | None = None
        self._count = 0

    def next_program(self, now: float) -> Program:
        # Each program draws from its own stream (seed, generator, index), so its shape does not
        # depend on when the loop asks for it; only segment ids follow the call sequence.
        index = self._count
        self._count += 1
        # = np.random.default_rng([...]) (the same PCG64 from the same SeedSequence), ~8 us less
        rng = np.random.Generator(PCG64(SeedSequence([self.seed, self.stream, index])))
        return self.generate(rng, f"{self.name}-{index:06d}")

    def generate(self, rng: np.random.Generator, program_id: str) -> Program:
        raise NotImplementedError

    def trace_programs(self) -> list[Program] | None:
        return None

    def target_concurrency(self, now: float) -> int | None:
        return None
