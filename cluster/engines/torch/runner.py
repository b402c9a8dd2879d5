"""Run one forward pass of the torch engine, timed (paper 000 §5.1: what Eq. 1–2 model).

`ModelRunner` owns the model, the KV pool and the sampler. A pass takes the requests'
slices (new tokens after their computed ones), first copies the blocks restored from the
host tier into their device pages, runs the model over the flattened tokens, and samples
the next token of every request whose slice ends its prompt or decodes. Its `wall_s` spans
the restore copies, the forward and the sampling, closed by a device synchronization (the
sampled ids are read back, which synchronizes too): the iteration time the models fit.
`cpu_s` is the calling thread's CPU time over the same span: on a CPU device with one torch
thread the forward computes on that thread, so `cpu_s` is the pass's work without the time
the host's scheduler gave other processes (wall_s - cpu_s: waiting for a core or the GIL).

In a DP×EP group (`shard`) the pass also carries each MoE layer's load on this rank and
its time includes the dispatch/combine waits; `dummy_run` is an idle rank's pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from cluster.engines.torch.attention import PassLayout, SeqSlice
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.expert_parallel import EPComm, LayerLoad
from cluster.engines.torch.kv_pool import KVPool
from cluster.engines.torch.model import Transformer
from cluster.engines.torch.request import EngineRequest

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class PassItem:
    """One request's slice of a pass; `sample` when its last new token yields a token."""

    req: EngineRequest
    num_new: int
    sample: bool


class PassOutput(NamedTuple):
    next_ids: list[int | None]  # per item, None when it did not sample
    experts_per_layer: list[int]
    wall_s: float  # 0.0 when the pass was not timed
    attn_pairs: int
    cpu_s: float = 0.0  # the scheduler thread's CPU time in the same span (0.0: not timed)
    layer_loads: tuple[LayerLoad, ...] = ()  # per MoE layer under expert parallelism


class ModelRunner:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cfg.num_threads)
        dtype = _DTYPES[cfg.dtype]
        self.model = Transformer(cfg.model, seed=cfg.seed, device=self.device, dtype=dtype)
        self.pool = KVPool(
            cfg.model, cfg.page_size, cfg.gpu_pages, cfg.host_pages, self.device, dtype
        )
        self._gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.comm: EPComm | None = None

    def shard(self, comm: EPComm) -> None:
        """Serve as one rank of an EP group: keep this rank's experts, route through `comm`."""
        self.model.shard_experts(comm)
        self.comm = comm

    def dummy_run(self) -> PassOutput:
        """An idle DP rank's pass: one token through every layer (`Transformer.dummy_forward`)."""
        t0 = time.perf_counter()
        experts = self.model.dummy_forward()
        self.synchronize()
        loads = tuple(self.comm.take_loads()) if self.comm is not None else ()
        return PassOutput([], experts, time.perf_counter() - t0, 1, 0.0, loads)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(
        self,
        items: Sequence[PassItem],
        restores: Sequence[tuple[int, int]] = (),
        timed: bool = True,
    ) -> PassOutput:
        """Run one pass over `items` after the (host page, device page) `restores`."""
        t0 = time.perf_counter() if timed else 0.0
        c0 = time.thread_time() if timed else 0.0
        if restores:
            self.pool.to_gpu([h for h, _ in restores], [g for _, g in restores])
        ps = self.cfg.page_size
        seqs = [SeqSlice(it.num_new, it.req.num_computed, it.req.pages) for it in items]
        layout = PassLayout(seqs, ps, self.device)
        ids: list[int] = []
        rows: list[int] = []
        for it in items:
            start = it.req.num_computed
            ids += it.req.tokens[start : start + it.num_new]
            if it.sample:
                rows.append(len(ids) - 1)
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        row_index = torch.tensor(rows, dtype=torch.long, device=self.device)
        slots = layout.write_slots
        logits, experts = self.model(
            tokens, layout, lambda layer, k, v: self.pool.write(layer, slots, k, v), row_index
        )
        sampled = self._sample(logits, [it.req for it in items if it.sample])
        if timed:
            self.synchronize()
        wall = time.perf_counter() - t0 if timed else 0.0
        cpu = time.thread_time() - c0 if timed else 0.0
        out: list[int | None] = []
        k = 0
        for it in items:
            if it.sample:
                if it.req.record_logits:
                    it.req.logits.append(logits[k].detach().to("cpu").clone())
                out.append(sampled[k])
                k += 1
            else:
                out.append(None)
        loads = tuple(self.comm.take_loads()) if self.comm is not None else ()
        return PassOutput(out, experts, wall, layout.attn_pairs, cpu, loads)

    def _sample(self, logits: torch.Tensor, reqs: Sequence[EngineRequest]) -> list[int]:
        if not reqs:
            return []
        greedy = logits.argmax(-1)
        temps = [r.temperature for r in reqs]
        if any(t > 0 for t in temps):
            t = torch.tensor([max(x, 1e-5) for x in temps], device=logits.device)[:, None]
            drawn = torch.multinomial((logits / t).softmax(-1), 1, generator=self._gen)[:, 0]
            hot = torch.tensor([x > 0 for x in temps], device=logits.device)
            greedy = torch.where(hot, drawn, greedy)
        return [int(x) for x in greedy.tolist()]
