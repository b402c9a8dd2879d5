"""A pdlab profile composed from AIConfigurator's kernel tables (`pdlab profile import --aiconfigurator`).

The same tables, pricer, grid and fitted forms as an imported operator profile
(cluster.hardware.operator_profile): `compose_tables` turns the measured kernels of one
(system, backend, version) into `OperatorTables` for a model at its parallelism, per rank,
in seconds:

- dense_layer(N): per decoder layer at N tokens, the GEMMs of the model's shapes at its TP
  (qkv, o_proj, and for dense layers gate_up and down; an MoE model's router and shared
  experts), each interpolated in the GEMM table (`aiconfigurator_db.GemmTable`); the
  memory-bound elementwise kernels (two add+RMSNorm, RoPE, QK-norm, activation, KV write)
  as bytes / the system's memory bandwidth, at least the smallest kernel the GEMM table
  timed; the TP all-reduces (after o_proj and after the MLP; under attention DP the MoE's
  own reduce is in the MoE rows) from the all-reduce table. An MoE model with leading dense
  layers adds their MLP averaged over the layers (the pricer charges dense_layer on every
  layer of an MoE model).
- dense_iteration(N): embedding (a gather) and the final norm; its vocab-parallel
  all-reduce under TP.
- per_sequence(S): lm_head (bf16 GEMM at m = S) and the sampler (float32 logits read
  twice), and the gather of the logits under TP (half an all-reduce's traffic).
- attention (prefill_chunk, kv_prefill, n_decode, kv_decode): context attention of the
  chunk (batch 1) scaled to the query-key pairs of a chunk over cached tokens, at least the
  chunk alone, plus generation attention of the decodes at their context; a mixed batch's
  attention is the two measured kernels' sum.
- moe: the MoE table at the model's expert shape, MoE TP/EP and routing distribution (by
  the tokens entering the layer: the EP group's), plus under attention DP the dispatch and
  combine (an all-gather and a reduce-scatter: one all-reduce's traffic over the group).
  AIConfigurator timed it on one rank of the deployment's MoE TP/EP, so the tables say so
  (`moe_kind` "per-ep-rank", keyed by the group's tokens, experts per rank) and the pricer
  prices it as it stands, not as a one-GPU moe.csv it would share out over the EP ranks.

The collectives are priced in the tables, so the pricer's own link model is off
(latency 0, bandwidth LINK_OFF_GBPS). Engine behaviour that no table measures is assumed and
noted in the profile: the kernels were timed under CUDA graphs (no launch gaps), no CPU
scheduling time between iterations, the backend's documented scheduler defaults
(`ENGINE_DEFAULTS`), KV cache in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cluster.core import ConfigError
from cluster.hardware.aiconfigurator_db import KernelDatabase
from cluster.hardware.engine import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables, Table1D
from cluster.hardware.pricer import Parallelism
from models.work import attn_pairs

LINK_OFF_GBPS = 1e9  # collectives are in the tables: the pricer's link model adds ~0
# GEMM/MoE dtype -> bytes per weight (nvfp4: 4-bit values + an fp8 scale per 16)
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5625}
QUANTS = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block",
          "fp4": "nvfp4", "nvfp4": "nvfp4"}  # fmt: skip
# 8-bit weights run the fastest measured 8-bit kernel of each operator, per-tensor or
# block-scaled FP8, as a tuned engine does (vLLM picks among its FP8 linear and fused-MoE
# backends, TensorRT-LLM autotunes tactics).
KERNEL_FAMILY = {"fp8": ("fp8", "fp8_block"), "fp8_block": ("fp8", "fp8_block")}


def kernels(dtype: str) -> tuple[str, ...]:
    return KERNEL_FAMILY.get(dtype, (dtype,))


DEFAULT_DISTRIBUTION = "power_law_1.01"  # AIConfigurator's default MoE routing workload
PC_GRID = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
KP_GRID = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768)
ND_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
KD_GRID = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True, slots=True)
class EngineDefaults:
    """A backend's documented scheduler defaults that shape latency."""

    max_num_seqs: int
    max_num_batched_tokens: int  # per-iteration token budget (chunk size)
    max_num_batched_tokens_large: int  # on GPUs of >= 160 GB (SGLang's tiering)
    block_size: int
    memory_fraction: float
    mixed_prefill_decode: bool
    enable_chunked_prefill: bool
    reserve_full_sequence: bool  # KV for prompt + output reserved at admission
    source: str


ENGINE_DEFAULTS = {
    "vllm": EngineDefaults(1024, 8192, 8192, 16, 0.9, True, True, False,
        "vLLM V1 EngineArgs defaults on >=70 GiB GPUs (not A100), OpenAI server: "
        "max_num_seqs 1024, max_num_batched_tokens 8192, gpu_memory_utilization 0.9, "
        "chunked prefill mixed with decodes"),
    "sglang": EngineDefaults(1024, 8192, 16384, 1, 0.88, False, True, False,
        "SGLang server_args defaults: chunked_prefill_size 8192 (<160 GB GPUs) or 16384, "
        "prefill batches run before decodes (no --enable-mixed-chunk), "
        "mem_fraction_static ~0.88, max_running_requests taken as 1024"),
    "trtllm": EngineDefaults(2048, 8192, 8192, 32, 0.9, True, False, True,
        "TensorRT-LLM (PyTorch backend) defaults: max_batch_size 2048, max_num_tokens 8192, "
        "no chunked context, context and generation in one iteration, "
        "kv free_gpu_memory_fraction 0.9, GUARANTEED_NO_EVICT capacity scheduling"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class AicTarget:
    """What to compose: the database coordinates, quantization and parallelism of one engine."""

    system: str
    backend: str
    version: str | None = None
    quant: str = "bf16"  # GEMM dtype (bf16, fp8, fp8_block, fp4/nvfp4)
    moe_quant: str | None = None  # MoE dtype (default: quant)
    tp: int = 1  # attention TP per engine
    dp: int = 1  # attention DP ranks sharing the MoE (one engine each)
    moe_tp: int | None = None  # default tp*dp when moe_ep is 1
    moe_ep: int = 1
    distribution: str = DEFAULT_DISTRIBUTION
    kv_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.backend not in ENGINE_DEFAULTS:
            raise ConfigError(
                f"backend {self.backend!r} is not one of {', '.join(ENGINE_DEFAULTS)}"
            )
        for q in (self.quant, self.moe_quant or self.quant):
            if q not in QUANTS:
                raise ConfigError(f"quantization {q!r} is not one of {', '.join(QUANTS)}")
        width = self.tp * self.dp
        if self.moe_tp_size * self.moe_ep != width:
            raise ConfigError(
                f"MoE TP {self.moe_tp_size} x EP {self.moe_ep} must equal TP {self.tp} x DP {self.dp}"
            )

    @property
    def moe_tp_size(self) -> int:
        return self.moe_tp if self.moe_tp is not None else self.tp * self.dp // self.moe_ep

    @property
    def gemm_dtype(self) -> str:
        return QUANTS[self.quant]

    @property
    def moe_dtype(self) -> str:
        return QUANTS[self.moe_quant or self.quant]

    @property
    def pricer_ep(self) -> int:
        """The EP degree the pricer keys MoE rows by: the MoE group's width under DP."""
        return self.tp * self.dp if self.dp > 1 else self.moe_ep

    def key(self) -> tuple[Any, ...]:
        return (self.system, self.backend, self.version, self.quant, self.moe_quant, self.tp,
                self.dp, self.moe_tp_size, self.moe_ep, self.distribution, self.kv_dtype)  # fmt: skip


def _token_grid(gemm_m: tuple[float, ...], limit: int) -> np.ndarray:
    grid = sorted({int(m) for m in gemm_m if 1 <= m <= limit} | {1, limit})
    return np.asarray(grid, dtype=np.float64)


class _Composer:
    """The kernels of one model at one parallelism, per rank (module docstring)."""

    def __init__(self, db: KernelDatabase, shape: ModelShape, target: AicTarget, max_tokens: int):
        self.db, self.s, self.t = db, shape, target
        self.gemm = db.gemm(kernels(target.gemm_dtype))
        self.gemm_bf16 = db.gemm("bfloat16") if target.gemm_dtype != "bfloat16" else self.gemm
        any_curve = next(iter(self.gemm_bf16.curves.values()))
        self.floor_s = float(min(c.y.min() for c in self.gemm_bf16.curves.values()))
        del any_curve
        self.bw = db.spec.mem_bw_bytes_s
        self.heads = shape.num_heads // target.tp
        self.kv_heads = max(1, -(-shape.num_kv_heads // target.tp))
        self.ar = db.allreduce(target.tp) if target.tp > 1 else None
        width = target.tp * target.dp
        self.moe_ar = db.allreduce(width) if (shape.is_moe and target.dp > 1) else None
        self.tokens = _token_grid(
            tuple(self.gemm.curves[next(iter(self.gemm.curves))].x), max_tokens
        )

    def _mem(self, nbytes: np.ndarray) -> np.ndarray:
        return np.maximum(nbytes / self.bw, self.floor_s)

    def _allreduce(self, table: Table1D | None, elements: np.ndarray) -> np.ndarray:
        return np.zeros_like(elements) if table is None else np.asarray(table(elements))

    def dense_layer(self) -> Table1D:
        s, t, n = self.s, self.t, self.tokens
        h, hd, tp = s.hidden_size, s.head_dim, t.tp
        q_out = (self.heads + 2 * self.kv_heads) * hd
        sec = self.gemm(n, q_out, h) + self.gemm(n, h, self.heads * hd)
        sec += 2 * self._mem(n * 4 * h * 2.0)  # two add+RMSNorm
        sec += self._mem(n * q_out * 2 * 2.0)  # RoPE (and QK-norm) on q, k
        sec += self._mem(n * 2 * self.kv_heads * hd * 2.0)  # KV cache write
        dense_mlp = (
            self.gemm(n, 2 * s.intermediate_size // tp, h)
            + self.gemm(n, h, s.intermediate_size // tp)
            + self._mem(n * 3 * (s.intermediate_size // tp) * 2.0)
        )
        if s.is_moe:
            sec += self.gemm_bf16(n, s.num_experts, h)  # router
            shared = (
                s.shared_expert_intermediate_size or s.moe_intermediate_size * s.num_shared_experts
            )
            if shared:
                sec += (s.num_moe_layers / s.num_layers) * (
                    self.gemm(n, 2 * shared // tp, h) + self.gemm(n, h, shared // tp)
                )
            sec += (s.num_dense_layers / s.num_layers) * dense_mlp
        else:
            sec += dense_mlp
        reduces = 1 if (s.is_moe and t.dp > 1) else 2
        sec += reduces * self._allreduce(self.ar, n * h)
        return Table1D(n, sec)

    def dense_iteration(self) -> Table1D:
        n, h = self.tokens, self.s.hidden_size
        sec = self._mem(n * h * 2.0 * 2) + self._mem(n * 2 * h * 2.0)  # embedding, final norm
        sec += self._allreduce(self.ar, n * h)
        return Table1D(n, sec)

    def per_sequence(self) -> Table1D:
        n, s = self.tokens, self.s
        vocab = s.vocab_size // self.t.tp
        sec = self.gemm_bf16(n, vocab, s.hidden_size) + self._mem(n * vocab * 4.0 * 2)
        sec += 0.5 * self._allreduce(self.ar, n * vocab)
        return Table1D(n, sec)

    def attention_rows(self) -> np.ndarray:
        s, t = self.s, self.t
        ctx = self.db.context_attention(self.heads, self.kv_heads, s.head_dim, t.kv_dtype)
        gen = self.db.generation_attention(self.heads, self.kv_heads, s.head_dim, t.kv_dtype)
        pcs = np.array([p for p in PC_GRID if p <= self.tokens[-1]], dtype=np.float64)
        kd = np.asarray(KD_GRID, dtype=np.float64)
        gen_s = {nd: np.asarray(gen(nd, kd)) for nd in ND_GRID}
        rows: list[tuple[float, float, float, float, float]] = [(0, 0, 0, 0, 0.0)]
        for nd in ND_GRID:
            rows += [(0, 0, nd, k, g) for k, g in zip(kd, gen_s[nd], strict=True)]
        for kp in KP_GRID:
            total = pcs + kp
            full = np.asarray(ctx(1, total))
            scale = attn_pairs(pcs, np.full_like(pcs, kp)) / attn_pairs(total, np.zeros_like(pcs))
            chunk = np.maximum(full * scale, np.asarray(ctx(1, pcs)))
            for pc, c in zip(pcs, chunk, strict=True):
                rows.append((pc, kp, 0, 0, float(c)))
                for nd in ND_GRID:
                    rows += [
                        (pc, kp, nd, k, float(c + g)) for k, g in zip(kd, gen_s[nd], strict=True)
                    ]
        return np.asarray(rows, dtype=np.float64)

    def moe_rows(self) -> np.ndarray | None:
        s, t = self.s, self.t
        if not s.is_moe:
            return None
        table = self.db.moe(s.hidden_size, s.moe_intermediate_size, s.top_k, s.num_experts,
                            t.moe_tp_size, t.moe_ep, kernels(t.moe_dtype), t.distribution)  # fmt: skip
        group = np.unique(np.concatenate([table.x, self.tokens * t.dp]))
        sec = np.asarray(table(group)) + self._allreduce(self.moe_ar, group * s.hidden_size)
        experts = max(s.num_experts / t.pricer_ep, 1.0)  # the pricer's key; one column
        return np.column_stack([group, np.full_like(group, experts), sec])


def compose_tables(
    db: KernelDatabase, shape: ModelShape, target: AicTarget, max_tokens: int = 16384
) -> tuple[OperatorTables, list[str]]:
    """The operator tables of `shape` at `target` from the kernel database (module doc)."""
    if shape.kv_lora_rank:
        raise ConfigError(f"{shape.name}: MLA attention is not composed (GQA models only)")
    c = _Composer(db, shape, target, max_tokens)
    moe = c.moe_rows()
    tables = OperatorTables(
        c.dense_layer(), c.dense_iteration(), c.per_sequence(), c.attention_rows(), moe,
        ("aiconfigurator",), target.tp, moe_kind="per-ep-rank",
    )  # fmt: skip
    notes = [
        f"AIConfigurator kernel tables: {db.system} / {db.backend} "
        + ", ".join(sorted({f"{u.table.split('/')[2]} {u.version}" for u in db.uses})),
        "kernels timed under CUDA graphs: no launch gaps; no CPU scheduling time between iterations (assumed)",
        f"elementwise kernels: bytes / {db.spec.mem_bw_bytes_s / 1e12:.2f} TB/s, at least "
        f"{c.floor_s * 1e6:.1f} us (the smallest GEMM timed)",
        f"KV cache {target.kv_dtype} (assumed); a mixed batch's attention = context + generation kernels",
    ]
    if shape.is_moe:
        notes.append(
            f"MoE: AIConfigurator's {target.distribution} table, one rank's time at MoE TP "
            f"{target.moe_tp_size} x EP {target.moe_ep} by the EP group's tokens"
            + (f", dispatch + combine as an all-reduce over {target.tp * target.dp} GPUs"
               if target.dp > 1 else "")
            + "; priced as the table says (per EP rank)"
        )  # fmt: skip
    if target.gemm_dtype in KERNEL_FAMILY or target.moe_dtype in KERNEL_FAMILY:
        notes.append(
            "8-bit weights: the fastest measured FP8 kernel (per-tensor or block-scaled) per operator"
        )
    return tables, notes


def quantized_weight_bytes(shape: ModelShape, target: AicTarget) -> int:
    """Weight bytes on one GPU: GEMM/MoE weights at their dtype, embeddings in bf16."""
    c = shape.param_counts()
    vocab = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    gemm_b, moe_b = WEIGHT_BYTES[target.gemm_dtype], WEIGHT_BYTES[target.moe_dtype]
    experts = c["ep"] / (target.moe_tp_size * target.moe_ep)
    return int((c["tp"] - vocab) / target.tp * gemm_b + vocab / target.tp * 2
               + experts * moe_b + c["replicated"] * 2)  # fmt: skip


def engine_settings(
    shape: ModelShape, target: AicTarget, gpu_memory_bytes: int
) -> tuple[EngineSettings, list[str]]:
    """The backend's default engine with its KV capacity from GPU memory (one per DP rank)."""
    d = ENGINE_DEFAULTS[target.backend]
    budget = (
        d.max_num_batched_tokens_large if gpu_memory_bytes >= 160e9 else d.max_num_batched_tokens
    )
    base = EngineSettings(
        engine=target.backend, model=shape.name, max_num_seqs=d.max_num_seqs,
        max_num_batched_tokens=budget, tensor_parallel_size=target.tp,
        data_parallel_size=target.dp, expert_parallel_size=max(target.moe_ep, 1),
        block_size=d.block_size, gpu_memory_utilization=d.memory_fraction,
        gpu_memory_bytes=gpu_memory_bytes, enable_chunked_prefill=d.enable_chunked_prefill,
        mixed_prefill_decode=d.mixed_prefill_decode, reserve_full_prompt=True,
        kv_cache_dtype="fp8" if target.kv_dtype == "fp8" else "auto", hardware=target.system,
    )  # fmt: skip
    per_token = shape.kv_bytes_per_token(target.tp, 1 if target.kv_dtype == "fp8" else 2)
    free = gpu_memory_bytes * d.memory_fraction - quantized_weight_bytes(shape, target)
    free -= base.non_kv_reserve_bytes(replace(shape, dtype_bytes=2))
    blocks = int(free // (per_token * d.block_size))
    if blocks < 1:
        raise ConfigError(
            f"{shape.name} at TP {target.tp} x DP {target.dp} (MoE TP {target.moe_tp_size} / EP "
            f"{target.moe_ep}) leaves no KV room on {gpu_memory_bytes / 2**30:.0f} GiB"
        )
    notes = [d.source, f"KV capacity {blocks * d.block_size} tokens per engine from GPU memory"]
    return replace(base, num_gpu_blocks=blocks), notes


def parallelism(target: AicTarget) -> Parallelism:
    return Parallelism(target.tp, target.dp, target.pricer_ep, LINK_OFF_GBPS, 0.0, 1.0)


def unsupported_reason(config: dict[str, Any]) -> str | None:
    """Why pdlab cannot compose a model from its HF config (None: a GQA dense or MoE model)."""
    cfg = {**config, **(config.get("text_config") or {})}
    mtype = str(cfg.get("model_type", ""))
    if cfg.get("kv_lora_rank") or mtype.startswith(("deepseek", "kimi", "glm_moe_dsa")):
        return "MLA attention (DeepSeek, Kimi, GLM-5): the twin's attention is per-head GQA"
    kinds = set(cfg.get("layer_types") or ())
    if kinds - {"full_attention"}:
        return f"mixed attention layers ({', '.join(sorted(kinds))}): one attention kind per model"
    if (
        cfg.get("sliding_window")
        and cfg.get("use_sliding_window", True)
        and mtype not in ("qwen3", "qwen3_moe")
    ):
        return "sliding-window attention: one full-attention kind per model"
    if mtype.startswith(("qwen3_5", "qwen3_next", "nemotron_h")):
        return "hybrid linear attention: not a GQA transformer"
    return None


def build_aic_profile(
    db: KernelDatabase,
    shape: ModelShape,
    target: AicTarget,
    *,
    fit: bool = True,
    name: str | None = None,
) -> Any:
    """An `OperatorProfile` (engine, KV capacity, tables, notes, tables used; fitted forms
    when `fit`) of `shape` served at `target`."""
    from cluster.hardware.operator_profile import MIN_POINTS, OperatorProfile, fit_phase, grid_rows
    from cluster.hardware.pricer import IterationPricer

    engine, engine_notes = engine_settings(shape, target, db.spec.mem_capacity_bytes)
    limit = max(engine.max_num_batched_tokens or 8192, 8192)
    tables, notes = compose_tables(db, shape, target, max_tokens=limit)
    par = parallelism(target)
    if shape.is_moe:
        notes.append(_moe_phi_note(db, shape, target))
    fits: dict[Any, Any] = {}
    if fit:
        pricer = IterationPricer(tables, shape, par)
        for phase, (rows, y, cluster) in grid_rows(pricer).items():
            if len(y) >= MIN_POINTS:
                fits[phase] = fit_phase(phase, rows, y, cluster, shape)
    sources = [u.to_json() for u in db.uses]
    return OperatorProfile(
        name or f"{shape.name}-{target.system}-{target.backend}-tp{target.tp}",
        tables,
        shape,
        par,
        fits,
        hardware=target.system,
        source="aiconfigurator:" + json_sources(sources),
        engine=engine,
        kv_tokens=(engine.num_gpu_blocks or 0) * engine.block_size,
        notes=tuple(notes + engine_notes),
    )


def _moe_phi_note(db: KernelDatabase, shape: ModelShape, target: AicTarget) -> str:
    """Eq. 2's MoE term on the MoE curve this profile prices with: the routing skew of
    phi(B) fitted there (models.expert_skew), for fits from live logs to use the same."""
    from models.expert_skew import fit_moe_term
    from models.fitting import FitError

    t = target
    table = db.moe(shape.hidden_size, shape.moe_intermediate_size, shape.top_k,
                   shape.num_experts, t.moe_tp_size, t.moe_ep, kernels(t.moe_dtype),
                   t.distribution)  # fmt: skip
    try:
        uniform = fit_moe_term(table.x, table.y, shape.top_k, shape.num_experts, skew=0.0)
        fit = fit_moe_term(table.x, table.y, shape.top_k, shape.num_experts)
    except FitError as exc:
        return f"phi(B) skew not fitted on the MoE table ({exc})"
    return (
        f"phi(B) on the MoE table: skew {fit.skew:g} (CV MAPE {100 * fit.cv_mape:.1f}% vs "
        f"{100 * uniform.cv_mape:.1f}% with uniform routing); DecodeModel(skew=...) uses it"
    )


def json_sources(sources: list[dict[str, Any]]) -> str:
    import json

    return json.dumps(sources, separators=(",", ":"), sort_keys=True)
