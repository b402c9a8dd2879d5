"""Engine settings that shape latency, and KV capacity from GPU memory (SPEC §9).

`EngineSettings` is what a real vLLM or SGLang engine was configured with (or what flags
ask for): the batch limit `max_num_seqs`, the per-iteration token budget
`max_num_batched_tokens` shared by chunked prefills and decodes, TP/DP/EP degrees, the KV
block size, and what sets KV capacity (recorded KV blocks, or GPU memory and the memory
utilization). Importers store it in `runs.config["engine"]` (`to_json`); the simulator's
engine model and `pdlab twin` read it back (`from_json`). One engine per DP rank; TP
ranks are one engine.

KV capacity (`kv_capacity`): the recorded number of GPU KV blocks when the run has it (vLLM
logs it; it is the only place the engine's activation peak and CUDA-graph memory show),
else vLLM's budget: gpu_memory_bytes * gpu_memory_utilization - weights per rank - a
non-KV reserve, divided by KV bytes per token per rank and rounded down to whole blocks.
The reserve (`non_kv_reserve_bytes`) estimates what vLLM's profiling run finds: activations
of one max_num_batched_tokens forward, the sampler's float32 logits for max_num_seqs
sequences (twice: logits and probabilities), plus a fixed 0.75 GiB for CUDA graphs and
non-torch allocations (NCCL, cuBLAS workspaces). It is an estimate: pass the reserve, or the
blocks, when known. `kv_blocks_range` states its spread: the reserve from half to twice the
estimate, and, for a nominal memory size (a flag, a cluster description), up to 3% less
memory than that size (a "24 GB" RTX 4090 shows 23.5 GiB, 2.1% less; its run recorded 2,588
blocks where 24 GiB and the estimated reserve give 2,791); a size the device reported is
exact. Under
expert parallelism a rank holds 1/EP of the expert weights and every attention and dense
weight (`ModelShape.weight_bytes`), so the experts it does not hold are KV room.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, NamedTuple

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.hardware.model_shape import ModelShape

GIB = 1024**3
FIXED_RESERVE_BYTES = int(0.75 * GIB)
VLLM_DEFAULT_UTILIZATION = 0.9
RESERVE_SPREAD = (0.5, 2.0)  # the non-KV reserve: from half to twice the estimate
MEMORY_SLACK = 0.03  # usable GPU memory below a nominal size, at most


# Ceilings of the settings that size a replay (one engine per DP rank, KV blocks, seats).
_CEILINGS = (
    ("tensor_parallel_size", limits.TENSOR_PARALLEL),
    ("data_parallel_size", limits.DATA_PARALLEL),
    ("expert_parallel_size", limits.EXPERT_PARALLEL),
    ("block_size", limits.BLOCK_SIZE),
    ("max_num_seqs", limits.MAX_NUM_SEQS),
    ("max_num_batched_tokens", limits.BATCHED_TOKENS),
    ("num_gpu_blocks", limits.KV_BLOCKS),
    ("gpu_memory_bytes", limits.GPU_MEMORY_BYTES),
    ("max_model_len", limits.MODEL_LEN),
    ("cuda_graph_max_batch", limits.CUDA_GRAPH_BATCH),
    ("max_num_partial_prefills", limits.MAX_NUM_SEQS),
    ("long_prefill_token_threshold", limits.Limit(0, limits.MODEL_LEN.hi, "tokens")),
)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Configuration of one serving engine (a DP rank); None = not recorded / engine default."""

    engine: str = ""  # 'vllm', 'sglang', ...
    model: str | None = None
    max_num_seqs: int | None = None  # most running requests per iteration
    max_num_batched_tokens: int | None = None  # token budget per iteration
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel_size: int = 1  # 1 = experts split by TP; vLLM's EP spans TP x DP ranks
    block_size: int = 16
    num_gpu_blocks: int | None = None  # recorded KV blocks per engine
    gpu_memory_utilization: float | None = None
    gpu_memory_bytes: int | None = None  # per GPU
    enable_chunked_prefill: bool = True
    # Prefill chunks ride in decode iterations (vLLM V1); SGLang runs them apart unless
    # --enable-mixed-chunk.
    mixed_prefill_decode: bool = True
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    cuda_graph_max_batch: int | None = None  # largest captured decode batch (None: eager)
    # Batch sizes with a captured CUDA graph: vLLM pads a decode batch up to the next one.
    cuda_graph_sizes: tuple[int, ...] | None = None
    async_scheduling: bool | None = None
    # Scheduler details that shape admission (vLLM's names): requests mid-prefill at once,
    # chunk cap for long prompts (0: none), KV reserved for the whole prompt on admission,
    # queue order.
    max_num_partial_prefills: int | None = None
    long_prefill_token_threshold: int | None = None
    reserve_full_prompt: bool | None = None
    scheduling_policy: str | None = None
    hardware: str | None = None
    engine_version: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "tensor_parallel_size",
            "data_parallel_size",
            "expert_parallel_size",
            "block_size",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"engine settings: {name} must be an integer >= 1, got {v!r}")
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_gpu_blocks",
            "gpu_memory_bytes",
        ):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(
                    f"engine settings: {name} must be an integer >= 1 or unset, got {v!r}"
                )
        for name, limit in _CEILINGS:
            limits.check(f"engine settings: {name}", getattr(self, name), limit)
        if self.expert_parallel_size > self.tensor_parallel_size * self.data_parallel_size:
            raise ConfigError(
                "engine settings: expert_parallel_size must be at most tensor_parallel_size x "
                f"data_parallel_size = {self.tensor_parallel_size * self.data_parallel_size}, "
                f"got {self.expert_parallel_size}"
            )
        u = self.gpu_memory_utilization
        if u is not None and not (isinstance(u, int | float) and 0.0 < u <= 1.0):
            raise ConfigError(f"engine settings: gpu_memory_utilization must be in (0, 1], got {u}")

    @property
    def gpus_per_engine(self) -> int:
        return self.tensor_parallel_size

    def with_overrides(self, **changes: Any) -> EngineSettings:
        """A copy with the given fields changed (None values are ignored: keep recorded)."""
        valid = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise ConfigError(
                f"engine settings: unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(valid))}"
            )
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EngineSettings:
        valid = {f.name for f in fields(cls)}
        kw = {k: v for k, v in doc.items() if k in valid}
        if kw.get("cuda_graph_sizes") is not None:
            kw["cuda_graph_sizes"] = tuple(int(x) for x in kw["cuda_graph_sizes"])
        return cls(**kw)

    def kv_bytes_per_token(self, shape: ModelShape) -> int:
        kv = 1 if self.kv_cache_dtype.startswith("fp8") else None
        return shape.kv_bytes_per_token(self.tensor_parallel_size, kv)

    def weight_bytes(self, shape: ModelShape) -> int:
        ep = self.expert_parallel_size if shape.is_moe else 1
        return shape.weight_bytes(self.tensor_parallel_size, ep)

    def non_kv_reserve_bytes(self, shape: ModelShape) -> int:
        """Estimated activation peak + sampler logits + CUDA graphs / non-torch, per GPU."""
        tokens = self.max_num_batched_tokens or 2048
        seqs = self.max_num_seqs or 256
        tp = self.tensor_parallel_size
        width = (
            4 * shape.hidden_size
            + (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim / tp
            + 2 * max(shape.intermediate_size, shape.moe_intermediate_size * shape.top_k) / tp
        )
        activations = tokens * width * shape.dtype_bytes
        logits = 2 * seqs * shape.vocab_size / tp * 4
        return int(activations + logits + FIXED_RESERVE_BYTES)

    def kv_capacity(self, shape: ModelShape, reserve_bytes: int | None = None) -> KvCapacity:
        """KV tokens one engine holds: recorded blocks, else from GPU memory (module doc)."""
        per_token = self.kv_bytes_per_token(shape)
        if self.num_gpu_blocks is not None and reserve_bytes is None:
            tokens = self.num_gpu_blocks * self.block_size
            return KvCapacity(tokens, self.num_gpu_blocks, per_token, "recorded KV blocks")
        if self.gpu_memory_bytes is None:
            raise ConfigError(
                "KV capacity needs the recorded KV blocks or the GPU memory: pass "
                "--gpu-memory-gib (and --gpu-memory-utilization), or --kv-tokens"
            )
        util = self.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION
        reserve = self.non_kv_reserve_bytes(shape) if reserve_bytes is None else reserve_bytes
        weights = self.weight_bytes(shape)
        free = self.gpu_memory_bytes * util - weights - reserve
        blocks = math.floor(free / (per_token * self.block_size))
        if blocks < 1:
            raise ConfigError(
                f"no room for KV: {self.gpu_memory_bytes / GIB:.1f} GiB x {util} leaves "
                f"{free / GIB:.2f} GiB after {weights / GIB:.1f} GiB of weights per GPU and a "
                f"{reserve / GIB:.2f} GiB reserve"
            )
        return KvCapacity(blocks * self.block_size, blocks, per_token, "GPU memory")

    def kv_blocks_range(self, shape: ModelShape, *, nominal_memory: bool = True) -> tuple[int, int]:
        """Plausible (low, high) KV blocks per engine of the estimate from GPU memory (module
        docstring); 0 at the low end when that end leaves no room for KV."""
        if self.gpu_memory_bytes is None:
            raise ConfigError("a KV range from memory needs the GPU memory")
        reserve = self.non_kv_reserve_bytes(shape)
        util = self.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION
        slack = MEMORY_SLACK * self.gpu_memory_bytes * util if nominal_memory else 0.0
        try:
            low = self.kv_capacity(shape, int(RESERVE_SPREAD[1] * reserve + slack)).blocks
        except ConfigError:
            low = 0
        high = self.kv_capacity(shape, int(RESERVE_SPREAD[0] * reserve)).blocks
        return low, high


def vllm_server_defaults(gpu_memory_bytes: int, device_name: str = "") -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM V1's OpenAI server takes when not given
    (vllm/engine/arg_utils.py EngineArgs, v0.9-v0.13): 1024 and 8192 on GPUs of >= 70 GiB
    that are not A100s, else 256 and 2048."""
    if gpu_memory_bytes >= 70 * GIB and "a100" not in device_name.lower():
        return 1024, 8192
    return 256, 2048


class KvCapacity(NamedTuple):
    """KV tokens and blocks of one engine, bytes per token per rank, and where it came from."""

    tokens: int
    blocks: int
    bytes_per_token: int
    source: str
