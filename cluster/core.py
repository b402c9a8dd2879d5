"""Core types shared by the control plane, the simulated engines and live backends.

Phases, KV tiers, the KV event model (SGLang's and vLLM's BlockStored / BlockRemoved /
AllBlocksCleared, SPEC §6, mapped onto one NamedTuple), the telemetry sink the control
plane hands records to, and a string-keyed registry for policy families.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")
Tier = Literal["gpu", "host"]
TIERS: tuple[Tier, ...] = ("gpu", "host")
BlockHash = int  # signed 64-bit chained hash of a block's tokens and its parent


class ConfigError(ValueError):
    """A configuration value is invalid; the message says what is allowed."""


class KVEventKind(StrEnum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


class KVEvent(NamedTuple):
    """One KV cache event of one node.

    STORED: `block_hashes` were stored in `tier`, the first one's parent is `parent_hash`
    (None for a root block), each block holds `block_tokens` tokens; `token_ids` may carry
    the tokens (SGLang/vLLM send them). REMOVED: `block_hashes` left `tier`. CLEARED: the
    node dropped every block of `tier` (None = all tiers).
    """

    t: float
    node_id: int
    kind: KVEventKind
    tier: Tier | None
    block_hashes: tuple[BlockHash, ...] = ()
    parent_hash: BlockHash | None = None
    block_tokens: int = 0
    token_ids: tuple[int, ...] | None = None


class TelemetrySink(Protocol):
    """Where the control plane and engines hand telemetry rows (telemetry writer in practice).

    `emit` takes one table name (SPEC §3, without run_id) and column arrays of equal length.
    A sink that keeps nothing may say so with a class attribute `discards_rows = True`
    (`NullSink`): the simulator then builds no rows for it; one that reads only some tables
    may name them in an attribute `reads_tables` (a frozenset): others need not reach it.
    """

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None: ...


class NullSink:
    """A sink that drops everything (benchmarks, unit tests of pure logic). It says so
    (`discards_rows`), so buffers in front of it need not build rows for it."""

    discards_rows = True

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        return None


class MemorySink:
    """A sink that keeps rows in memory as lists per table and column (tests, notebooks)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, list[Any]]] = {}

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        dst = self.tables.setdefault(table, {})
        for name, values in columns.items():
            dst.setdefault(name, []).extend(values)

    def rows(self, table: str) -> list[dict[str, Any]]:
        cols = self.tables.get(table, {})
        if not cols:
            return []
        names = list(cols)
        return [dict(zip(names, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


class TeeSink:
    """Hands every batch to each of `sinks` in order (the database, then a live server's
    metrics): one set of rows feeds both, so they cannot disagree. Its `reads_tables` are those
    any of them reads (None: every table), as a sink may declare (BufferedSink skips the
    rest)."""

    def __init__(self, *sinks: TelemetrySink) -> None:
        self.sinks = sinks
        self.reads_tables: frozenset[str] | None = frozenset()
        for s in sinks:
            kept = getattr(s, "reads_tables", None)
            if kept is None or self.reads_tables is None:
                self.reads_tables = None
            else:
                self.reads_tables |= kept

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        for sink in self.sinks:
            sink.emit(table, columns)


def tee(*sinks: TelemetrySink | None) -> TelemetrySink | None:
    """The sinks given (None ones left out) as one: None for none, the sink itself for one."""
    kept = [s for s in sinks if s is not None]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else TeeSink(*kept)


T = TypeVar("T")


class Registry(Generic[T]):
    """Named factories of one policy family; refuses duplicates, lists valid names on a miss."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._items:
                raise ConfigError(f"{self.family} {name!r} is already registered")
            self._items[name] = factory
            return factory

        return deco

    def create(self, name: str, **kwargs: Any) -> T:
        try:
            factory = self._items[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.family} {name!r}; choose one of: {', '.join(sorted(self._items))}"
            ) from None
        return factory(**kwargs)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def leave_garbage_to_os() -> None:
    """Let the process exit without freeing a finished run object by object.

    After a long simulation its object graph is cyclic garbage of millions of objects; the
    interpreter's last collection at exit would free them one by one (0.9 s after the Azure
    hour). Frozen at exit (atexit runs before that collection), they go back to the OS with
    the process. Call it from a command once its results are written and its files and
    databases closed: frozen garbage is not finalized.
    """
    import atexit
    import gc

    atexit.register(gc.freeze)


def tune_gc() -> None:
    """Raise the cyclic GC's thresholds for long simulations and servers.

    The directory, caches and event queue hold millions of small objects without cycles;
    the default thresholds rescan them every few hundred allocations, which costs a third
    of a simulation's time. Call it from process entry points (CLI, workers), not libraries.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
