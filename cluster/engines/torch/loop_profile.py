"""What the torch engine spends outside its operators: the scheduler's loop and the EP
collectives (the parts of an operator profile that `op_profile` does not time op by op).

- `scheduler_overhead_us(model, batches)`: one DP rank's real loop (`RankScheduler`, with
  its pass log, a one-rank link whose "all done?" answer is local) decodes `B` requests
  together; the overhead at batch size B is the median gap between one decode pass's end
  and the next one's start (admission, page caching, callbacks, metrics, logging).
- `profile_group(model, out_dir, ep)`: the whole bundle (`op_profile`, this loop, the
  link) measured by `ep` processes at once, as many as the group's ranks, so they contend
  for the CPU as the ranks do; times are the mean over the ranks;
- the link: the `ep` processes in a gloo (or NCCL) world run forward passes of the
  EP-sharded model over `tokens` tokens each (`Transformer.dummy_forward`: every layer,
  each token attending to itself; aligned by a barrier first), so each MoE
  layer's counts, dispatch and combine happen between the layers' compute as in a
  serving pass (a rank that waited in `recv` must be woken: on a busy CPU that costs more
  than back-to-back collectives); each point is the median over reps of the time one layer
  spent in its collectives on the rank that waited least (the other also waited for its
  peer's compute). Fitted (Theil–Sen: robust to points a busy CPU spoiled) as the pricer
  charges EP collectives per MoE layer (cluster.hardware.pricer),
  T(G) = 2·(latency + (e−1)/e · G·hidden·dtype / bandwidth) for G group tokens.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from cluster.engines.torch.config import EngineConfig, ModelConfig
from cluster.engines.torch.dp_scheduler import RankScheduler
from cluster.engines.torch.expert_parallel import EPComm, ExpertPlacement
from cluster.engines.torch.rank_log import RankLog, read_rank_logs
from cluster.engines.torch.request import EngineRequest
from cluster.engines.torch.runner import ModelRunner
from cluster.engines.torch.transfer import RoomRegistry

LINK_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _LocalLink:
    """A group of one rank: the loop's collectives answer locally."""

    dp_rank = 0
    sync_interval = 32
    lockstep = True

    def any_unfinished(self, local: bool) -> bool:
        return local

    def notify(self, msg: dict[str, Any]) -> None:
        return None


def scheduler_overhead_us(
    model: ModelConfig, batches: tuple[int, ...], *, threads: int = 1, new_tokens: int = 24
) -> dict[int, float]:
    """Median gap between decode passes of a rank's loop, by batch size (module doc)."""
    torch.set_num_threads(threads)
    cfg = EngineConfig(model=model, gpu_pages=4096, host_pages=0, chunk_tokens=1024,
                       max_running=max(batches), num_threads=threads)  # fmt: skip
    runner = ModelRunner(cfg)
    out: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="pdlab-loop-") as tmp:
        for b in batches:
            log = RankLog(tmp, b)
            sched = RankScheduler(cfg, "null", runner, rooms=RoomRegistry(), link=_LocalLink(),
                                  rank_log=log)  # fmt: skip
            done = threading.Semaphore(0)

            def fin(_ids: list[int], f: Any, done: threading.Semaphore = done) -> None:
                if f is not None:
                    done.release()

            sched.start()
            try:
                for i in range(b):
                    ids = [(i * 37 + j) % 256 for j in range(8)]
                    sched.submit(EngineRequest(f"o{i}", ids, new_tokens, fin, ignore_eos=True))
                for _ in range(b):
                    done.acquire(timeout=120)
            finally:
                sched.stop()
            passes = [p for p in read_rank_logs(tmp)["pass"] if p["rank"] == b]
            gaps = [q["t_start"] - p["t_start"] - p["duration_s"]
                    for p, q in itertools.pairwise(passes)
                    if p["kind"] == q["kind"] == "decode" and p.get("batch_size") == b]  # fmt: skip
            out[b] = statistics.median(gaps) * 1e6
    return out


def fit_link(
    points: list[dict[str, Any]], model: ModelConfig, ep: int, device: str, *, robust: bool = True
) -> dict[str, Any]:
    """The link that prices `points` (group tokens, seconds) as the pricer does (module
    doc): Theil–Sen when `robust` (a point a busy CPU spoiled does not tilt it), else least
    squares weighted by each point's `samples` (the mean over every collective)."""
    from scipy.stats import theilslopes

    g = np.array([p["group_tokens"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    if robust or len(points) < 2:
        slope, intercept, _lo, _hi = theilslopes(t, g)
    else:
        w = np.sqrt(np.array([p.get("samples", 1) for p in points], dtype=float))
        sol = np.linalg.lstsq(np.c_[g, np.ones_like(g)] * w[:, None], t * w, rcond=None)[0]
        slope, intercept = max(float(sol[0]), 0.0), float(sol[1])
    per_token = model.d_model * 4  # float32 hidden state
    latency = max(intercept, 0.0) / 2
    gbps = (ep - 1) / ep * per_token / max(slope / 2, 1e-15) / 1e9
    resid = t - (intercept + slope * g)
    return {"link_gbps": gbps, "link_latency_s": latency, "points": points,
            "fit_rel_rmse": float(np.sqrt(np.mean((resid / t) ** 2))),
            "source": f"measured: {'gloo' if device == 'cpu' else 'nccl'} all-to-all of "
            f"{ep} processes (counts, dispatch, combine of one MoE layer)"}  # fmt: skip


def profile_group(
    model: ModelConfig, out_dir: str | Path, ep: int, *, threads: int = 1, reps: int = 7,
    link_tokens: tuple[int, ...] = LINK_TOKENS, link_reps: int = 40, device: str = "cpu",
) -> Path:  # fmt: skip
    """`ep` processes, as many as the group has ranks, each measure the operators, the
    scheduler loop and together the link, at once (so they contend for the CPU as a
    group's ranks do); the bundle holds the mean over the ranks of every time."""
    import torch.multiprocessing as mp

    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="pdlab-prof-") as tmp:
        args = (ep, tmp, model, threads, reps, link_tokens, link_reps, device)
        mp.spawn(_profile_worker, args=args, nprocs=ep)
        out.mkdir(parents=True, exist_ok=True)
        first = Path(tmp) / "rank0"
        for name in ("dense.csv", "per_sequence.csv", "attention.csv", "moe.csv"):
            if (first / name).is_file():
                _mean_csv([Path(tmp) / f"rank{r}" / name for r in range(ep)], out / name)
        for name in ("config.json", "meta.json"):
            (out / name).write_text((first / name).read_text())
        points = json.loads((Path(tmp) / "link.json").read_text()) if ep > 1 else None
    link = (
        fit_link(points, model, ep, device) if points
        else {"link_gbps": 25.0, "link_latency_s": 10e-6, "source": "assumed (no EP)"}
    )  # fmt: skip
    (out / "link.json").write_text(json.dumps(link, indent=1) + "\n")
    return out


def _profile_worker(
    rank: int, ep: int, tmp: str, model: ModelConfig, threads: int, reps: int,
    link_tokens: tuple[int, ...], link_reps: int, device: str,
) -> None:  # fmt: skip
    from cluster.engines.torch.op_profile import Grid, measure_profile

    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=rank, world_size=ep)
    grid = Grid()
    dist.barrier()
    sched = scheduler_overhead_us(model, grid.sequences, threads=threads)
    measure_profile(model, Path(tmp) / f"rank{rank}", ep=ep, threads=threads, reps=reps,
                    grid=grid, scheduler_us=sched)  # fmt: skip
    dist.barrier()
    if ep > 1:
        points = _link_points(rank, ep, model, link_tokens, link_reps, device)
        if rank == 0:
            (Path(tmp) / "link.json").write_text(json.dumps(points))
    dist.barrier()
    dist.destroy_process_group()


def _mean_csv(paths: list[Path], out: Path) -> None:
    """The rows of `paths` (same keys), `time_us` averaged over the files."""
    rows: dict[tuple[str, ...], list[float]] = {}
    header: list[str] = []
    for path in paths:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            for row in reader:
                rows.setdefault(tuple(row[:-1]), []).append(float(row[-1]))
    lines = [",".join(header)] + [",".join([*k, f"{sum(v) / len(v):.3f}"]) for k, v in rows.items()]
    out.write_text("\n".join(lines) + "\n")


def _link_points(
    rank: int, ep: int, model: ModelConfig, tokens: tuple[int, ...], reps: int, device: str
) -> list[dict[str, Any]]:
    """Seconds in one MoE layer's collectives during real forward passes of `tokens` tokens
    per rank (module doc), in a world already joined."""
    from cluster.engines.torch.model import Transformer

    dev = torch.device(f"cuda:{rank}" if device.startswith("cuda") else "cpu")
    comm = EPComm(ExpertPlacement(model.num_experts, ep, rank))
    m = Transformer(model, seed=0, device=dev)
    m.shard_experts(comm)
    points = []
    for n in tokens:
        times = []
        for i in range(reps + 2):
            dist.barrier()
            m.dummy_forward(n)  # the layers' compute sits between their collectives
            loads = comm.take_loads()
            per_layer = torch.tensor([sum(x.comm_s for x in loads) / len(loads)], device=dev)
            dist.all_reduce(per_layer, op=dist.ReduceOp.MIN)  # the rank that waited least
            if i >= 2:
                times.append(float(per_layer.item()))
        points.append({"tokens_per_rank": n, "group_tokens": n * ep,
                       "seconds": statistics.median(times)})  # fmt: skip
    return points
