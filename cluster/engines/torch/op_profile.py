"""An operator profile of the torch engine, measured on this machine (issue 22, DP+EP).

`measure_profile` times the engine's own code — the modules of `model.Transformer`, the
paged attention of `attention.PassLayout` over a `kv_pool.KVPool`, the MoE expert loop of
`expert_parallel`, the sampler and the scheduler's loop — and writes them in the layout
`pdlab profile import` reads (LLMServingSim's bundle, cluster.hardware.operator_tables),
with the model as a Hugging Face `config.json`:

- dense.csv (layer, tokens, time_us), per layer by tokens: `layernorm` (one RMSNorm; the
  importer counts two), `qkv_proj`, `rotary_emb`, `o_proj`, `residual_add` (both adds),
  `router` (MoE: gate, top-k and, under EP, the dispatch layout and the combine's sum);
  per iteration: `embedding`;
- per_sequence.csv (layer, sequences, time_us): `lm_head` (final norm and head over the
  sampled rows), `sampler` (argmax and read-back), `scheduler` (the engine loop around a
  pass: admission, caching pages, callbacks, metrics, the DP rank's logging — the interval
  between decode passes minus the runner's time, at that batch size);
- attention.csv: one layer's attention call (KV write and SDPA) for a prefill chunk over
  `kv_prefill` cached tokens or `n_decode` decodes over `kv_decode` each, plus 1/L of the
  pass's layout build (a per-pass cost the grid carries per layer);
- moe.csv (tokens, activated_experts, time_us): one rank's experts running `tokens`·k
  expert-token pairs over `activated_experts` of its experts — the key the pricer reads
  (cluster.hardware.pricer: a GPU's MoE block for `tokens` tokens routed top-k), so under
  EP e the pricer's group/e tokens are the rank's pairs/k. It is measured as the rank runs
  them: R tokens received after dispatch, each with the local slots it has on average
  under EP (k·(1/e) over the probability 1 − (1 − 1/e)^k that it comes at all), and keyed
  R·slots/k (`pair_keyed_moe`; fractional keys under EP);
- link.json (EP > 1, `measure_link`): one MoE layer's collectives (counts, dispatch,
  combine) between `ep` processes by tokens per rank, fitted as the pricer charges them,
  2·(latency + (e−1)/e·bytes/bandwidth) with bytes = tokens·hidden·dtype of the group.

Each time is the median of `reps` runs after a warm-up, on `threads` torch threads, in
microseconds. CPU timings are noisy when the machine is shared; `meta.json` records the
load average before and after.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cluster.engines.torch.attention import PassLayout, SeqSlice
from cluster.engines.torch.config import ModelConfig
from cluster.engines.torch.expert_parallel import ExpertPlacement, local_experts
from cluster.engines.torch.kv_pool import KVPool
from cluster.engines.torch.model import Block, MoEFFN, Transformer

PAGE = 16


@dataclass(frozen=True, slots=True)
class Grid:
    tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    sequences: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    kv_prefill: tuple[int, ...] = (0, 128, 256, 512, 1024, 2048)
    n_decode: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    kv_decode: tuple[int, ...] = (16, 64, 128, 256, 512)
    experts: tuple[int, ...] = (1, 2, 4, 8, 16)


def timed_us(fn: Callable[[], Any], reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e6


def _write(path: Path, header: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    lines = [",".join(header)] + [",".join(f"{v:.3f}" if isinstance(v, float) else str(v)
                                           for v in r) for r in rows]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def local_slots(k: int, ep: int) -> float:
    """Mean top-k slots a dispatched token has on one of `ep` ranks (module docstring)."""
    if ep == 1:
        return float(k)
    return k / ep / (1.0 - (1.0 - 1.0 / ep) ** k)


def pair_keyed_moe(
    rows: Sequence[tuple[float, int, float]], top_k: int, ep: int
) -> list[tuple[float, int, float]]:
    """Rows (R tokens received, experts, us) of one EP rank keyed as the pricer reads
    moe.csv: (R·slots/k, experts, us), slots = `local_slots(top_k, ep)` (module docstring);
    unchanged without EP (slots = k)."""
    f = local_slots(top_k, ep) / top_k
    return [(float(r) * f, int(e), float(us)) for r, e, us in rows]


class _Ops:
    """The model's parts at T tokens, on random inputs."""

    def __init__(self, model: Transformer, ep: int) -> None:
        self.m, self.cfg, self.ep = model, model.cfg, ep
        self.block: Block = model.blocks[0]  # type: ignore[assignment]
        self.g = torch.Generator().manual_seed(0)

    def x(self, t: int) -> torch.Tensor:
        return torch.randn(t, self.cfg.d_model, generator=self.g)

    def dense(self, t: int, reps: int) -> dict[str, float]:
        b, cfg, x = self.block, self.cfg, self.x(t)
        att = b.attn
        pos = torch.arange(t)
        q = att.wq(x).view(t, att.heads, att.head_dim)
        k = att.wk(x).view(t, att.kv_heads, att.head_dim)
        out = {
            "layernorm": timed_us(lambda: b.attn_norm(x), reps),
            "qkv_proj": timed_us(lambda: (att.wq(x).view(t, att.heads, att.head_dim),
                                          att.wk(x).view(t, att.kv_heads, att.head_dim),
                                          att.wv(x).view(t, att.kv_heads, att.head_dim)), reps),
            "rotary_emb": timed_us(lambda: (self.m.rope(q, pos), self.m.rope(k, pos)), reps),
            "o_proj": timed_us(lambda: att.wo(q.reshape(t, -1)), reps),
            "residual_add": timed_us(lambda: (x + x, x + x), reps),
            "embedding": timed_us(lambda: self.m.embed(torch.randint(0, 256, (t,))), reps),
        }  # fmt: skip
        if cfg.is_moe:
            out["router"] = timed_us(lambda: self._route(x), reps)
        return out

    def _route(self, x: torch.Tensor) -> None:
        """What an MoE layer does outside its experts (ep_moe_forward / MoEFFN.forward)."""
        ffn: MoEFFN = self.block.ffn  # type: ignore[assignment]
        probs = ffn.router(x).float().softmax(-1)
        weight, expert = probs.topk(ffn.top_k, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        if self.ep == 1:
            flat = expert.flatten()
            flat.argsort(stable=True)
            torch.bincount(flat, minlength=ffn.num_experts).tolist()
            return
        per = self.cfg.num_experts // self.ep
        torch.unique(expert).numel()
        ranks = torch.arange(self.ep)
        hit = (expert // per)[None] == ranks[:, None, None]
        sends = hit.any(-1)
        dest, token = sends.nonzero(as_tuple=True)
        ids = torch.where(hit[dest, token], expert[token], -1)
        torch.cat((x[token], ids.to(x.dtype), weight[token]), dim=1)
        sends.sum(-1).tolist()
        torch.zeros_like(x).index_add_(0, token, x[token])

    def per_sequence(self, s: int, reps: int) -> dict[str, float]:
        h = self.x(s)
        rows = torch.arange(s)
        logits = self.m.lm_head(self.m.norm(h)).float()
        return {
            "lm_head": timed_us(lambda: self.m.lm_head(self.m.norm(h[rows])).float(), reps),
            "sampler": timed_us(lambda: [int(v) for v in logits.argmax(-1).tolist()], reps),
        }

    def attention(self, pool: KVPool, seqs: list[SeqSlice], reps: int) -> float:
        cfg, att = self.cfg, self.block.attn
        t = sum(s.num_new for s in seqs)
        layout = PassLayout(seqs, PAGE, torch.device("cpu"))
        q = torch.randn(t, att.heads, att.head_dim, generator=self.g)
        k = torch.randn(t, att.kv_heads, att.head_dim, generator=self.g)
        build = timed_us(lambda: PassLayout(seqs, PAGE, torch.device("cpu")), max(reps // 2, 3))

        def call() -> None:
            kp, vp = pool.write(0, layout.write_slots, k, k)
            layout.attend(q, kp, vp)

        return timed_us(call, reps) + build / cfg.num_layers

    def moe(self, tokens: int, experts: int, reps: int) -> float:
        ffn: MoEFFN = self.block.ffn  # type: ignore[assignment]
        assert ffn.w_gate.shape[0] >= experts
        ids = synthetic_routing(tokens, experts, ffn.top_k, self.ep, seed=tokens * 131 + experts)
        w = torch.rand(tokens, ffn.top_k, generator=self.g)
        x = self.x(tokens)
        return timed_us(lambda: local_experts(ffn, x, ids, w, 0), reps)


def synthetic_routing(tokens: int, experts: int, k: int, ep: int, seed: int = 0) -> torch.Tensor:
    """[tokens, k] expert ids (-1: another rank's slot) of tokens dispatched to one rank:
    each takes 1 + Bernoulli·(k − 1) local slots with mean `local_slots(k, ep)` (at most
    `experts`), drawn over experts 0..experts−1 in turn so that all of them are used
    whenever the tokens have that many slots."""
    rng = torch.Generator().manual_seed(seed)
    p_more = (min(local_slots(k, ep), float(experts)) - 1.0) / max(k - 1, 1)
    more = torch.rand(tokens, generator=rng) < p_more
    n_slots = (1 + more.long() * (k - 1)).clamp(max=min(k, experts)).tolist()
    ids = torch.full((tokens, k), -1, dtype=torch.long)
    nxt = 0
    for i, n in enumerate(n_slots):
        chosen = [(nxt + j) % experts for j in range(n)]  # distinct: n <= experts
        nxt = (nxt + n) % experts
        ids[i, :n] = torch.tensor(chosen)
    return ids


def measure_profile(
    model: ModelConfig, out_dir: str | Path, *, ep: int = 1, threads: int = 1, reps: int = 7,
    grid: Grid = Grid(), scheduler_us: dict[int, float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:  # fmt: skip
    """Write the bundle (module docstring) for `model` served with EP degree `ep`."""
    say = progress or (lambda _msg: None)
    torch.set_num_threads(threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    m = Transformer(model, seed=0)
    if model.is_moe and ep > 1:
        placement = ExpertPlacement(model.num_experts, ep, 0)
        for blk in m.blocks:
            ffn = blk.ffn
            for name in ("w_gate", "w_up", "w_down"):
                w = getattr(ffn, name)
                setattr(ffn, name, torch.nn.Parameter(w[: placement.per_rank].clone(), False))
    ops = _Ops(m, ep)
    with torch.inference_mode():
        say("dense operators")
        dense = []
        for t in grid.tokens:
            dense += [(op, t, us) for op, us in ops.dense(t, reps).items()]
        _write(out / "dense.csv", ("layer", "tokens", "time_us"), dense)
        say("per-sequence operators")
        seq = []
        for s in grid.sequences:
            seq += [(op, s, us) for op, us in ops.per_sequence(s, reps).items()]
            if scheduler_us and s in scheduler_us:
                seq.append(("scheduler", s, scheduler_us[s]))
        _write(out / "per_sequence.csv", ("layer", "sequences", "time_us"), seq)
        say("attention")
        _write(out / "attention.csv", ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode",
                                       "time_us"), _attention(ops, model, grid, reps))  # fmt: skip
        if model.is_moe:
            say("MoE experts")
            per = model.num_experts // ep if ep > 1 else model.num_experts
            slots = local_slots(model.top_k, ep)
            rows = [(t, e, ops.moe(t, e, reps)) for t in grid.tokens for e in grid.experts
                    if e <= per and e <= t * slots]  # fmt: skip
            keyed = [(f"{t:.6g}", e, us) for t, e, us in pair_keyed_moe(rows, model.top_k, ep)]
            _write(out / "moe.csv", ("tokens", "activated_experts", "time_us"), keyed)
    (out / "config.json").write_text(json.dumps(model.hf_config(), indent=1) + "\n")
    meta = {"model": model.name, "ep": ep, "threads": threads, "reps": reps,
            "cpu_count": os.cpu_count(), "load_avg_before": list(load0),
            "load_avg_after": list(os.getloadavg()), "torch": torch.__version__,
            "local_slots_per_token": local_slots(model.top_k, ep) if model.is_moe else None,
            "moe_tokens": "expert-token pairs / top_k (measured by tokens received, re-keyed)"}  # fmt: skip
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def _attention(ops: _Ops, model: ModelConfig, grid: Grid, reps: int) -> list[tuple[Any, ...]]:
    need = max(max(grid.prefill_chunks) + max(grid.kv_prefill),
               max(grid.n_decode) * (max(grid.kv_decode) + 1))  # fmt: skip
    pool = KVPool(model, PAGE, -(-need // PAGE) + max(grid.n_decode), 0,
                  torch.device("cpu"), torch.float32)  # fmt: skip
    rows: list[tuple[Any, ...]] = []
    for pc in grid.prefill_chunks:
        for kp in grid.kv_prefill:
            pages = list(range(-(-(pc + kp) // PAGE)))
            rows.append((pc, kp, 0, 0, ops.attention(pool, [SeqSlice(pc, kp, pages)], reps)))
    for nd in grid.n_decode:
        for kd in grid.kv_decode:
            per = -(-(kd + 1) // PAGE)
            seqs = [SeqSlice(1, kd, list(range(i * per, (i + 1) * per))) for i in range(nd)]
            rows.append((0, 0, nd, kd, ops.attention(pool, seqs, reps)))
    return rows
