"""`pdlab bench --suite engine`: the torch engine's speed on this machine (SPEC §8, §9).

- prefill and decode tokens per second of `tiny-moe` on one torch thread: passes run
  straight through `ModelRunner` (a 512-token chunk; decode batches of 1, 8 and 32 at a
  256-token context), from the median pass and from the fastest (`_best`: the machine
  without contention), and the coefficient of variation of identical passes, which says
  how noisy CPU timings are for `pdlab fit`; with each decode batch, the fraction of experts
  its tokens activated (mean over MoE layers) next to φ(B) = 1 − (1 − k/E)^B (Eq. 2);
- the cost of telemetry per iteration: the work a pass does only for telemetry (timing,
  building and encoding the ForwardPassMetrics, encoding the KV events, two ZMQ sends)
  measured alone, over the median and the fastest decode pass at B = 1, the cheapest pass
  (`engine_telemetry_overhead`, `_worst`; goal <= 5%), and an A/B of whole runs of one
  workload with telemetry and publishers on and off (`engine_telemetry_overhead_ab`, as
  noisy as the passes themselves).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

import torch

from cluster.engines.shell.scheduling import publish_fpm
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.pass_metrics import PrefillSlice, prefill_metrics
from cluster.engines.torch.prefix_cache import PrefixCache
from cluster.engines.torch.request import EngineRequest
from cluster.engines.torch.runner import ModelRunner, PassItem
from cluster.engines.torch.scheduler import Scheduler
from cluster.engines.torch.transfer import RoomRegistry
from cluster.sglang.fpm import QueuedRequestMetrics
from cluster.wire.kv_events import SGLangBlockStored, encode_batch
from cluster.wire.publisher import ZmqBatchPublisher


def _ignore(ids: list[int], fin: Any) -> None:
    return None


def _requests(runner: ModelRunner, cache: PrefixCache, n: int, ctx: int) -> list[EngineRequest]:
    """n requests whose first `ctx` tokens are in pages (their K/V values do not matter)."""
    ps = runner.cfg.page_size
    rng = random.Random(n * 7919 + ctx)
    out = []
    for i in range(n):
        ids = [rng.randrange(256) for _ in range(ctx + 1)]
        req = EngineRequest(f"b{i}", ids, 1, _ignore)
        pages = cache.lend(-(-(ctx + 1) // ps), 0, 0.0)
        assert pages is not None
        req.pages, req.blocks = pages, [None] * len(pages)
        out.append(req)
    return out


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def _pass_times(runner: ModelRunner, items: list[PassItem], reps: int) -> list[float]:
    runner.run(items)  # warm-up
    return [runner.run(items).wall_s for _ in range(reps)]


def _telemetry_cost_s(cfg: EngineConfig, reps: int) -> float:
    """Seconds per pass spent only on telemetry (see module docstring)."""
    fpm = ZmqBatchPublisher("tcp://127.0.0.1:*")
    kv = ZmqBatchPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    slices = [PrefillSlice(64, 128, 0, 192)] * 4
    experts = [cfg.model.top_k * 4] * cfg.model.num_layers
    events = [
        SGLangBlockStored(block_hashes=[i], parent_block_hash=None, token_ids=list(range(16)),
                          block_size=16, lora_id=None, medium=m)
        for i, m in enumerate(("GPU", "CPU_PINNED"))
    ]  # fmt: skip
    try:
        t0 = time.perf_counter()
        for _ in range(reps):
            start = time.perf_counter()
            wall = time.perf_counter() - start
            m = prefill_metrics(cfg.worker_id, wall, slices, 1000, experts, QueuedRequestMetrics())
            publish_fpm(fpm, m)
            kv.publish(encode_batch(events, time.time()))
        return (time.perf_counter() - t0) / reps
    finally:
        fpm.close()
        kv.close()


def _workload_seconds(sched: Scheduler, seed: int, n: int, prompt: int, new: int) -> float:
    rng = random.Random(seed)
    left = threading.Semaphore(0)

    def done(ids: list[int], fin: Any) -> None:
        if fin is not None:
            left.release()

    t0 = time.perf_counter()
    for i in range(n):
        ids = [rng.randrange(256) for _ in range(prompt)]
        sched.submit(EngineRequest(f"w{i}", ids, new, done, ignore_eos=True))
    for _ in range(n):
        left.acquire()
    return time.perf_counter() - t0


def _ab_overhead(quick: bool) -> float:
    """Whole-run A/B: telemetry and publishers on vs off, interleaved, medians."""
    on_cfg = EngineConfig(gpu_pages=512, host_pages=0)
    off_cfg = EngineConfig(gpu_pages=512, host_pages=0, telemetry=False)
    fpm = ZmqBatchPublisher("tcp://127.0.0.1:*")
    kv = ZmqBatchPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    on = Scheduler(on_cfg, "null", ModelRunner(on_cfg), rooms=RoomRegistry(),
                   kv_publisher=kv, fpm_publisher=fpm)  # fmt: skip
    off = Scheduler(off_cfg, "null", ModelRunner(off_cfg), rooms=RoomRegistry())
    for s in (on, off):
        s.start()
    times: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for rep in range(3 if quick else 8):
            for name, s in (("on", on), ("off", off)) if rep % 2 else (("off", off), ("on", on)):
                times[name].append(_workload_seconds(s, rep, 8, 96, 16))
                s.call(s.flush).result()
    finally:
        for s in (on, off):
            s.stop()
        fpm.close()
        kv.close()
    return statistics.median(times["on"]) / statistics.median(times["off"]) - 1.0


def run(quick: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    reps = 5 if quick else 30
    cfg = EngineConfig(gpu_pages=1024, host_pages=0)
    runner = ModelRunner(cfg)
    out: dict[str, float] = {}
    cache = PrefixCache(cfg.page_size, cfg.gpu_pages, 0)
    chunk = 512
    (req,) = _requests(runner, cache, 1, chunk - 1)
    req.num_computed = 0
    prefill = _pass_times(runner, [PassItem(req, chunk, True)], reps)
    out["engine_prefill_tokens_per_s"] = chunk / statistics.median(prefill)
    out["engine_prefill_tokens_per_s_best"] = chunk / min(prefill)
    out["engine_prefill_pass_cv"] = _cv(prefill)
    b1: list[float] = []
    for b in (1, 8, 32):
        reqs = _requests(runner, cache, b, 256)
        for r in reqs:
            r.num_computed = 256
        items = [PassItem(r, 1, True) for r in reqs]
        times = _pass_times(runner, items, reps)
        m = cfg.model  # phi(B): the fraction of experts a decode pass of B tokens activates
        experts = runner.run(items).experts_per_layer
        out[f"engine_phi_measured_b{b}"] = statistics.mean(experts) / m.num_experts
        out[f"engine_phi_model_b{b}"] = 1 - (1 - m.top_k / m.num_experts) ** b
        out[f"engine_decode_tokens_per_s_b{b}"] = b / statistics.median(times)
        out[f"engine_decode_tokens_per_s_b{b}_best"] = b / min(times)
        out[f"engine_decode_pass_cv_b{b}"] = _cv(times)
        b1 = b1 or times
    cost = _telemetry_cost_s(cfg, 200 if quick else 2000)
    out["engine_telemetry_us_per_pass"] = cost * 1e6
    # Against the cheapest pass (decode at B = 1): its median, and its fastest (worst case).
    out["engine_telemetry_overhead"] = cost / statistics.median(b1)
    out["engine_telemetry_overhead_worst"] = cost / min(b1)
    out["engine_telemetry_overhead_ab"] = _ab_overhead(quick)
    return out
