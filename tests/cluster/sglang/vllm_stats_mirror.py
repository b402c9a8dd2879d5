"""vLLM's V1 stats objects, re-declared for tests (vLLM needs CUDA torch: not installable here).

Mirrors `vllm/v1/metrics/stats.py` of vllm-project/vllm main as of 2026 (the version with
`KVCacheEvictionEvent`, `PromptTokenStats.recomputed_tokens`, `FinishedRequestStats.timing`
and `SchedulerStats.cudagraph_stats`/`perf_stats`): the same dataclasses, field names,
order and defaults, and `PromptTokenStats.update_from_output` /
`PrefixCacheStats.record` as vLLM computes them. `CUDAGraphStat` mirrors
`vllm/compilation/cuda_graph.py`; `StatLoggerBase` mirrors `vllm/v1/metrics/loggers.py`
(the abstract interface and the `load_stat_logger_plugin_factories` subclass check).
`IterationStats.__init__` stamps `iteration_timestamp = time.time()`; tests set it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BaseCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class PrefixCacheStats(BaseCacheStats):
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


@dataclass(frozen=True)
class CUDAGraphStat:
    num_unpadded_tokens: int
    num_padded_tokens: int
    num_paddings: int
    runtime_mode: str


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    encoder_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: PrefixCacheStats | None = None
    kv_cache_eviction_events: list[Any] = field(default_factory=list)
    spec_decoding_stats: Any = None
    kv_connector_stats: dict[str, Any] | None = None
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    cudagraph_stats: CUDAGraphStat | None = None
    perf_stats: Any = None


@dataclass
class CompletedTiming:
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float
    mean_time_per_output_token: float | None = None


@dataclass
class FinishedRequestStats:
    finish_reason: Any
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int | None = None
    timing: Any = None
    is_corrupted: bool = False
    num_cached_tokens: int = 0


@dataclass
class PromptTokenStats:
    computed: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    total: int = 0

    def update_from_output(
        self, num_cached_tokens: int, num_external_computed_tokens: int, prompt_len: int
    ) -> None:
        recomputed = 1 if (num_cached_tokens + 1 == prompt_len) else 0
        self.computed += prompt_len - num_cached_tokens
        self.external_kv_transfer += num_external_computed_tokens
        self.local_cache_hit += num_cached_tokens + recomputed - num_external_computed_tokens
        self.cached_tokens += num_cached_tokens
        self.recomputed_tokens += recomputed
        self.total += prompt_len


class IterationStats:
    def __init__(self) -> None:
        self.iteration_timestamp = time.time()
        self.num_generation_tokens = 0
        self.prompt_token_stats = PromptTokenStats()
        self.num_preempted_reqs = 0
        self.finished_requests: list[FinishedRequestStats] = []
        self.max_num_generation_tokens_iter: list[int] = []
        self.n_params_iter: list[int] = []
        self.time_to_first_tokens_iter: list[float] = []
        self.inter_token_latencies_iter: list[float] = []
        self.num_corrupted_reqs: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_token_stats.total


class StatLoggerBase(ABC):
    @abstractmethod
    def __init__(self, vllm_config: Any, engine_index: int = 0): ...

    @abstractmethod
    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ): ...

    @abstractmethod
    def log_engine_initialized(self): ...

    def log(self):  # noqa: B027
        pass

    def record_sleep_state(self, is_awake: int, level: int):  # noqa: B027
        pass


def check_plugin_class(name: str, plugin_class: Any) -> None:
    """`load_stat_logger_plugin_factories`' check of an entry point's class."""
    if not isinstance(plugin_class, type) or not issubclass(plugin_class, StatLoggerBase):
        raise TypeError(
            f"Stat logger plugin {name!r} must be a subclass of "
            f"StatLoggerBase (got {plugin_class!r})."
        )


@dataclass
class _SchedulerConfig:
    max_num_batched_tokens: int


@dataclass
class _CacheConfig:
    block_size: int
    num_gpu_blocks: int | None


@dataclass
class _ModelConfig:
    model: str


@dataclass
class VllmConfig:
    """The parts of vLLM's `VllmConfig` the plugin reads."""

    scheduler_config: _SchedulerConfig
    cache_config: _CacheConfig
    model_config: _ModelConfig
    speculative_config: Any = None


def vllm_config(budget: int, block_size: int, num_gpu_blocks: int | None) -> VllmConfig:
    return VllmConfig(
        _SchedulerConfig(budget),
        _CacheConfig(block_size, num_gpu_blocks),
        _ModelConfig("meta-llama/Llama-3.1-8B-Instruct"),
    )


class PerEngineStatLoggerAdapter:
    """`StatLoggerManager`'s wrapping of a per-engine factory (not a type, or a type that is
    not an AggregateStatLoggerBase): one logger per engine index, records dispatched by
    `engine_idx` with `mm_cache_stats` by keyword."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int], factory: Any) -> None:
        self.per_engine_stat_loggers = {i: factory(vllm_config, i) for i in engine_indexes}

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:  # fmt: skip
        if engine_idx in self.per_engine_stat_loggers:
            self.per_engine_stat_loggers[engine_idx].record(
                scheduler_stats, iteration_stats, mm_cache_stats=mm_cache_stats,
                engine_idx=engine_idx,
            )  # fmt: skip

    def log(self) -> None:
        for lg in self.per_engine_stat_loggers.values():
            lg.log()

    def log_engine_initialized(self) -> None:
        for lg in self.per_engine_stat_loggers.values():
            lg.log_engine_initialized()
