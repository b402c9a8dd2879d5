"""pdlab's vLLM stat-logger plugin: each engine step as iteration rows (paper 000 §5.1).

vLLM V1 (`vllm/v1/metrics/loggers.py`) hands every stat logger the scheduler and iteration
stats of each engine step. `PdlabStatLogger` copies them into a `VLLMStep`
(`cluster.wire.vllm_steps`) and either publishes it over ZMQ ([topic, seq (8-byte
big-endian), msgpack]; collect with `pdlab collect vllm-steps`) or writes the rows itself
(`prefill_iterations`, `decode_iterations`, `requests` of a DuckDB run, source 'vllm').

Two ways in:

- the entry point `vllm.stat_logger_plugins: pdlab` (pyproject.toml): vLLM loads it in the
  API server process of `vllm serve` and of `AsyncLLM`. It does nothing unless
  `PDLAB_VLLM_STEPS` (a ZMQ endpoint to bind, e.g. tcp://127.0.0.1:5590; optional
  `PDLAB_VLLM_STEPS_REPLAY` for a replay ROUTER) or `PDLAB_VLLM_DB` (a DuckDB file) is set.
  vLLM turns its per-step stats on when any custom logger is registered (even with
  --disable-log-stats); `VLLM_PLUGINS` without "pdlab" leaves it out.
- `AsyncLLM(..., stat_loggers=[pdlab_stat_logger(steps=..., db=...)])`.

vLLM accepts a plugin only if it is a subclass of its `StatLoggerBase` (`TypeError`
otherwise), yet pdlab must import without vLLM: `PdlabStatLogger` is built on first access
(module `__getattr__`), over vLLM's base class when vLLM imports and over `object` when it
does not. Its `record` takes the signature of every V1 release (`mm_cache_stats` since
0.11; engine_idx positional before). In vLLM's environment install pdlab without its
dependencies (`pip install --no-deps pdlab`): the ZMQ mode needs only msgspec and pyzmq,
which vLLM has; the DuckDB mode also needs duckdb and pyarrow.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

from cluster.wire.vllm_step_collector import StepEmitter
from cluster.wire.vllm_steps import STEPS_TOPIC, encode_step, step_from_stats

logger = logging.getLogger(__name__)

STEPS_ENV = "PDLAB_VLLM_STEPS"
REPLAY_ENV = "PDLAB_VLLM_STEPS_REPLAY"
DB_ENV = "PDLAB_VLLM_DB"


class _Outputs:
    """Where this process's steps go: a ZMQ publisher and/or a telemetry run (one each per
    process: vLLM makes one logger per engine index, all in the API server process)."""

    def __init__(self, steps: str | None, replay: str | None, db: str | None, sink: Any) -> None:
        self.publisher = None
        self.writer = None
        self.lock = threading.Lock()
        self._nodes: set[int] = set()
        if steps:
            from cluster.wire.publisher import ZmqBatchPublisher

            self.publisher = ZmqBatchPublisher(
                steps, replay_endpoint=replay, topic=STEPS_TOPIC, replay_style="vllm"
            )
        if db and sink is None:
            from telemetry import TelemetryWriter

            self.writer = TelemetryWriter(db, source="vllm", config={"vllm_plugin": True})
            sink = self.writer
        self.sink = sink
        self.emitter = None if sink is None else StepEmitter(time.time(), sink)
        self.start_wall = time.time()

    def add_node(self, engine: int, name: str) -> None:
        if self.writer is None or engine in self._nodes:
            return
        self._nodes.add(engine)
        self.writer.add_nodes(
            {
                "node_id": [engine],
                "name": [f"engine-{engine}"],
                "hardware": [name],
                "moe_top_k": [0],
                "moe_experts": [0],
            }
        )

    def send(self, step: Any) -> None:
        with self.lock:
            if self.publisher is not None:
                self.publisher.publish(encode_step(step))
            if self.emitter is not None:
                self.emitter.on_step(step)

    def flush(self) -> None:
        with self.lock:
            if self.writer is not None:
                self.writer.flush()

    def close(self) -> None:
        with self.lock:
            if self.publisher is not None:
                self.publisher.close()
                self.publisher = None
            if self.writer is not None and not self.writer.closed:
                self.writer.close()


_SHARED: dict[tuple[str | None, str | None, str | None], _Outputs] = {}
_SHARED_LOCK = threading.Lock()


def _outputs(steps: str | None, replay: str | None, db: str | None) -> _Outputs | None:
    if not steps and not db:
        return None
    key = (steps, replay, db)
    with _SHARED_LOCK:
        out = _SHARED.get(key)
        if out is None:
            out = _SHARED[key] = _Outputs(steps, replay, db, None)
            atexit.register(out.close)
        return out


def _config_ints(vllm_config: Any) -> tuple[int | None, int, str]:
    """(token budget, speculative tokens, model name) from a VllmConfig (None-safe)."""
    sched = getattr(vllm_config, "scheduler_config", None)
    budget = getattr(sched, "max_num_batched_tokens", None)
    spec = getattr(vllm_config, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None) or 0
    model = getattr(getattr(vllm_config, "model_config", None), "model", None) or "vllm"
    return (int(budget) if budget else None), int(k), str(model)


class _PdlabStatLoggerCore:
    """The logic of `PdlabStatLogger` (module docstring), independent of vLLM's base."""

    def __init__(self, vllm_config: Any = None, engine_index: int = 0, **kw: Any) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.budget_tokens, self.spec_tokens, self.model = _config_ints(vllm_config)
        self.kv_capacity_tokens: int | None = None
        out = kw.get("outputs")
        if out is None:
            out = _outputs(
                kw.get("steps", os.environ.get(STEPS_ENV)),
                kw.get("replay", os.environ.get(REPLAY_ENV)),
                kw.get("db", os.environ.get(DB_ENV)),
            )
        self.outputs: _Outputs | None = out
        self.num_steps = 0
        if out is not None:
            out.add_node(engine_index, f"vllm {self.model}")
        self._read_capacity()

    def _read_capacity(self) -> None:
        cache = getattr(self.vllm_config, "cache_config", None)
        blocks = getattr(cache, "num_gpu_blocks", None)
        size = getattr(cache, "block_size", None)
        if blocks and size:
            self.kv_capacity_tokens = int(blocks) * int(size)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int | None = None,
        **_: Any,
    ) -> None:
        if self.outputs is None or (scheduler_stats is None and iteration_stats is None):
            return
        if isinstance(mm_cache_stats, int) and engine_idx is None:
            engine_idx = mm_cache_stats  # releases before 0.11: record(s, it, engine_idx)
        if self.kv_capacity_tokens is None:
            self._read_capacity()
        step = step_from_stats(
            scheduler_stats,
            iteration_stats,
            self.engine_index if engine_idx is None else engine_idx,
            budget_tokens=self.budget_tokens,
            kv_capacity_tokens=self.kv_capacity_tokens,
            spec_tokens=self.spec_tokens,
        )
        try:
            self.outputs.send(step)
        except Exception:  # telemetry must never take vLLM's output loop down
            logger.exception("pdlab stat logger could not publish a step")
        self.num_steps += 1

    def log_engine_initialized(self) -> None:
        self._read_capacity()  # num_gpu_blocks is known once the engine profiled memory

    def log(self) -> None:
        if self.outputs is not None:
            self.outputs.flush()

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        return None


def _build_logger_class() -> type:
    try:
        from vllm.v1.metrics.loggers import StatLoggerBase
    except ImportError:
        return type("PdlabStatLogger", (_PdlabStatLoggerCore,), {"__module__": __name__})
    return type("PdlabStatLogger", (_PdlabStatLoggerCore, StatLoggerBase), {"__module__": __name__})


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "PdlabStatLogger":
        if _CLASS is None:
            _CLASS = _build_logger_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pdlab_stat_logger(
    *,
    steps: str | None = None,
    replay: str | None = None,
    db: str | None = None,
    sink: Any = None,
) -> Any:
    """A factory for `AsyncLLM(stat_loggers=[...])`: `factory(vllm_config, engine_index)`.

    `steps`: ZMQ endpoint to publish on; `db`: DuckDB file to write; `sink`: any telemetry
    sink (tests; nodes must be registered on it). One output set is shared by every engine.
    """
    if not (steps or db or sink is not None):
        raise ValueError("give steps=ZMQ endpoint, db=DuckDB path or sink=telemetry sink")
    out = _Outputs(steps, replay, db, sink)
    atexit.register(out.close)
    cls = __getattr__("PdlabStatLogger")

    def factory(vllm_config: Any, engine_index: int = 0) -> Any:
        return cls(vllm_config, engine_index, outputs=out)

    factory.outputs = out  # type: ignore[attr-defined]
    return factory
