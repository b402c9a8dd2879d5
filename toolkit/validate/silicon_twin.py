"""One silicon row replayed on the twin: profiles from the kernel tables, then the benchmark's closed loop.

`SiliconTwin.replay(row)` builds (once per system, backend, model, quantization and
parallelism: `profile`) the engine's profile from AIConfigurator's kernel tables
(cluster.hardware.aiconfigurator_profile, no fitted forms: the replay prices with the
tables) and runs the row's benchmark on the engine model
(cluster.sim.engine_model.closed_loop): aggregated, one worker of the row's TP x DP GPUs
(its DP ranks in lockstep for an MoE model, apart for a dense one); disaggregated, the
row's prefill and decode workers with the KV moving between them in
KV bytes / (link bandwidth x prefill TP ranks sending at once), over NVLink when the
deployment fits one node (or an NVLink rack: GB200/GB300 list NVLink as their inter-node
link), else the system's inter-node bandwidth. A row pdlab cannot replay raises
`Unsupported` with the reason, worded the same for every row it applies to (so they count).
`overhead` is CPU time per iteration outside the kernels (none by default: the tables time
kernels only); `validate_silicon` can set it from vidur's measurement, a stated assumption.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cluster.core import ConfigError
from cluster.hardware.aiconfigurator_db import KernelDatabase
from cluster.hardware.aiconfigurator_profile import (
    ENGINE_DEFAULTS,
    QUANTS,
    WEIGHT_BYTES,
    AicTarget,
    build_aic_profile,
    quantized_weight_bytes,
    unsupported_reason,
)
from cluster.hardware.model_shape import ModelShape
from cluster.sim.engine_model.closed_loop import INFERENCEX, BenchmarkProtocol, Worker, closed_loop
from cluster.sim.engine_model.pricing import NO_OVERHEAD, IterationOverhead, iteration_time
from cluster.sim.engine_model.uniform_engine import EngineLimits, UniformEngine
from models.iteration import phi
from toolkit.validate.silicon_rows import Parallel, SiliconRow, find_model_config, read_config


class Unsupported(Exception):
    """A row pdlab does not replay; the message is the reason (the same for like rows)."""


class TwinResult(NamedTuple):
    ttft_ms: float
    tpot_ms: float
    requests: int
    iterations: int
    preemptions: int
    profile: str


@dataclass(frozen=True, slots=True)
class _Engine:
    profile: Any
    limits: EngineLimits
    key: str
    weight_bytes: int  # per GPU, at the quantized dtypes
    expert_bytes: int  # the routed experts' share of weight_bytes
    kv_bytes_per_token: int  # per GPU


def _reason(exc: ConfigError) -> str:
    msg = str(exc)
    if "no MoE rows" in msg:
        return "kernel tables: no MoE rows for the model's experts at this dtype and MoE TP/EP"
    if "no GEMM rows" in msg:
        return "kernel tables: no GEMMs of this dtype on this system"
    if "rows for" in msg and "heads" in msg:
        return "kernel tables: no attention rows for the heads per GPU"
    if "no KV room" in msg:
        return "weights exceed GPU memory at this parallelism"
    if "all-reduce rows" in msg:
        return "kernel tables: no all-reduce rows for this many GPUs (more than a node)"
    if "no " in msg and "table" in msg:
        return "kernel tables: an operator's table is missing for this backend"
    return msg.split(":")[0][:80]


class SiliconTwin:
    """Profiles cached per (system, backend, model, quantization, parallelism); rows replayed."""

    def __init__(
        self,
        systems_dir: Path | None = None,
        model_dirs: Iterable[Path] = (),
        protocol: BenchmarkProtocol = INFERENCEX,
        overhead: IterationOverhead = NO_OVERHEAD,
    ):
        self.systems_dir = systems_dir
        self.overhead = overhead
        self.model_dirs = list(model_dirs)
        self.protocol = protocol
        self._dbs: dict[tuple[str, str], KernelDatabase] = {}
        self._engines: dict[tuple[Any, ...], _Engine | Unsupported] = {}
        self._shapes: dict[str, ModelShape | Unsupported] = {}
        self._memo: dict[str, dict[tuple[Any, ...], float]] = {}

    def shape(self, row: SiliconRow) -> ModelShape:
        hit = self._shapes.get(row.model_id)
        if hit is None:
            path = find_model_config(row.model_id, self.model_dirs)
            if path is None:
                hit = Unsupported("no model config shipped for the model")
            else:
                cfg = read_config(path)
                why = unsupported_reason(cfg)
                hit = Unsupported(why) if why else ModelShape.from_hf_config(cfg, row.model_id)
            self._shapes[row.model_id] = hit
        if isinstance(hit, Unsupported):
            raise hit
        return hit

    def composes(self, row: SiliconRow) -> bool:
        """Whether the row's model is one pdlab composes (its tables may still lack rows)."""
        try:
            self.shape(row)
        except Unsupported:
            return False
        return True

    def _db(self, system: str, backend: str) -> KernelDatabase:
        key = (system, backend)
        if key not in self._dbs:
            self._dbs[key] = KernelDatabase(system, backend, None, self.systems_dir)
        return self._dbs[key]

    def engine(self, row: SiliconRow, par: Parallel, shape: ModelShape) -> _Engine:
        quant = row.gemm_quant or "bf16"
        moe_quant = row.moe_quant
        if quant not in QUANTS or (moe_quant and moe_quant not in QUANTS):
            raise Unsupported(
                f"{quant if quant not in QUANTS else moe_quant} weights: not a composed dtype"
            )
        moe = shape.is_moe
        key = (row.system, row.backend, row.model_id, quant, moe_quant if moe else None,
               par.tp, par.dp, par.moe_tp if moe else None, par.moe_ep if moe else 1)  # fmt: skip
        hit = self._engines.get(key)
        if hit is None:
            hit = self._build(key, row, par, shape, quant, moe_quant)
            self._engines[key] = hit
        if isinstance(hit, Unsupported):
            raise hit
        return hit

    def _build(
        self, key: tuple[Any, ...], row: SiliconRow, par: Parallel, shape: ModelShape,
        quant: str, moe_quant: str | None,
    ) -> _Engine | Unsupported:  # fmt: skip
        try:
            target = AicTarget(
                row.system, row.backend, None, quant, moe_quant if shape.is_moe else None,
                par.tp, par.dp if shape.is_moe else 1,
                par.moe_tp if shape.is_moe else None, par.moe_ep if shape.is_moe else 1,
                kv_dtype="fp8" if quant != "bf16" else "bfloat16",
            )  # fmt: skip
            prof = build_aic_profile(self._db(row.system, row.backend), shape, target, fit=False)
        except ConfigError as exc:
            return Unsupported(_reason(exc))
        e = prof.engine
        limits = EngineLimits(
            e.max_num_seqs, e.max_num_batched_tokens, e.num_gpu_blocks, e.block_size,
            e.mixed_prefill_decode, e.enable_chunked_prefill,
            ENGINE_DEFAULTS[row.backend].reserve_full_sequence,
        )  # fmt: skip
        kv = shape.kv_bytes_per_token(par.tp, 1 if target.kv_dtype == "fp8" else 2)
        weights = quantized_weight_bytes(shape, target)
        experts = shape.param_counts()["ep"] / (target.moe_tp_size * target.moe_ep)
        expert_bytes = int(experts * WEIGHT_BYTES[target.moe_dtype])
        return _Engine(prof, limits, "/".join(str(k) for k in key), weights, expert_bytes, kv)

    def _worker(
        self, eng: _Engine, ranks: int, row: SiliconRow, *, prefill: bool = True,
        decode: bool = True, max_seqs: int | None = None,
    ) -> Worker:  # fmt: skip
        pricer = eng.profile.pricer
        lim = eng.limits
        # Without chunked prefill a deployment's token budget holds a prompt and the decodes
        # beside it (InferenceX's TensorRT-LLM recipes: max_num_tokens = ISL + concurrency).
        need = row.isl + row.concurrency
        budget = (
            lim.max_num_batched_tokens if lim.chunked else max(lim.max_num_batched_tokens, need)
        )
        seats = min(max_seqs or lim.max_num_seqs, budget)
        lim = EngineLimits(
            seats, budget, lim.kv_blocks, lim.block_size, lim.mixed, lim.chunked, lim.reserve_output
        )

        memo = self._memo.setdefault(eng.key, {})
        overhead = self.overhead

        def price(
            chunks: list[tuple[int, int]], decodes: int, mean_ctx: float, group: float
        ) -> float:
            # Iterations that differ by less than a bin price the same (the grid is linear
            # within its cells): contexts to 16 tokens, chunks to 32 new / 256 cached tokens.
            key = (
                tuple((n >> 5, c >> 8) for n, c in chunks),
                decodes,
                int(mean_ctx) >> 4,
                int(group),
            )
            t = memo.get(key)
            if t is None:
                t = memo[key] = iteration_time(
                    pricer, chunks, [int(mean_ctx)] * decodes, group, overhead
                )
            return t

        return Worker(
            [UniformEngine(lim, prefill=prefill, decode=decode) for _ in range(ranks)], price
        )

    def _fits(self, eng: _Engine, row: SiliconRow) -> None:
        if eng.limits.kv_blocks * eng.limits.block_size < row.isl + row.osl:
            raise Unsupported("KV cache smaller than one request")

    def replay(self, row: SiliconRow) -> TwinResult:
        shape = self.shape(row)
        if row.mode == "agg":
            par = row.parallel("agg", shape.is_moe)
            if par.pp > 1:
                raise Unsupported("pipeline parallelism (PP > 1) is not modelled")
            eng = self.engine(row, par, shape)
            self._fits(eng, row)
            if shape.is_moe or par.dp == 1:
                workers = [self._worker(eng, par.dp, row)]
            else:  # dense DP ranks serve apart
                workers = [self._worker(eng, 1, row) for _ in range(par.dp)]
            res = closed_loop(row.concurrency, row.isl, row.osl, workers, protocol=self.protocol)
            keys = eng.key
        else:
            pre, dec = row.parallel("prefill", shape.is_moe), row.parallel("decode", shape.is_moe)
            if pre.pp > 1 or dec.pp > 1:
                raise Unsupported("pipeline parallelism (PP > 1) is not modelled")
            pe, de = self.engine(row, pre, shape), self.engine(row, dec, shape)
            self._fits(pe, row)
            self._fits(de, row)
            prefill = [self._worker(pe, pre.dp, row, decode=False) for _ in range(pre.workers)]
            decode = [
                self._worker(de, dec.dp, row, prefill=False, max_seqs=dec.batch_size)
                for _ in range(dec.workers)
            ]
            transfer = self.transfer_s(row, shape, pre, dec)
            res = closed_loop(row.concurrency, row.isl, row.osl, prefill, decode_workers=decode,
                              transfer_s=transfer, protocol=self.protocol)  # fmt: skip
            keys = f"{pe.key} -> {de.key}"
        return TwinResult(
            res.ttft_s * 1e3, res.tpot_s * 1e3, res.requests, res.iterations, res.preemptions, keys
        )

    def tpot_floor_ms(self, row: SiliconRow) -> float:
        """The least TPOT the row's measurements allow: a decode step reads the weights (of
        an MoE layer, the experts its tokens touch: phi of App. B.3) and the KV of the
        requests decoding (Little's law on the measured TTFT and TPOT: the share of each
        request's life spent decoding) at the GPU's memory bandwidth."""
        shape = self.shape(row)
        stage = "agg" if row.mode == "agg" else "decode"
        par = row.parallel(stage, shape.is_moe)
        eng = self.engine(row, par, shape)
        engines = par.dp * par.workers
        decode_s = row.osl * row.tpot_ms
        decoding = (
            row.concurrency
            / engines
            * decode_s
            / (decode_s + (row.ttft_ms if stage == "agg" else 0.0))
        )
        ctx = 0.9 * row.isl + 0.45 * row.osl  # the mean context of the protocol's decodes
        touched = (
            float(phi(decoding * par.dp, shape.top_k, shape.num_experts)) if shape.is_moe else 1.0
        )
        weights = eng.weight_bytes - eng.expert_bytes * (1.0 - touched)
        bytes_read = weights + decoding * ctx * eng.kv_bytes_per_token
        return 1e3 * bytes_read / self._db(row.system, row.backend).spec.mem_bw_bytes_s

    def transfer_s(self, row: SiliconRow, shape: ModelShape, pre: Parallel, dec: Parallel) -> float:
        """Seconds to move one prompt's KV from a prefill to a decode worker (module doc)."""
        spec = self._db(row.system, row.backend).spec
        one_node = pre.gpus + dec.gpus <= spec.gpus_per_node
        bw = spec.intra_node_bw_bytes_s if one_node else spec.inter_node_bw_bytes_s
        kv = shape.kv_bytes_per_token_total(2) * row.isl
        return kv / (bw * max(pre.tp, 1))
