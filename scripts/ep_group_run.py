"""Record a real run of a torch engine DP×EP group as the twin's input (issue 22, DP+EP).

Starts `pdlab engine --dp N --ep N` (tiny-moe on CPU by default: N rank processes, gloo
all-to-all per MoE layer, vLLM's lockstep and least-loaded balancing), sends an open-loop
workload to its front end — `--requests` requests at Poisson arrivals of `--rate` per
second (0 = all at once), random token prompts of `--input-tokens LO HI` and outputs pinned
to `--output-tokens LO HI` with ignore_eos, as LLMServingSim's bench pins them — waits for
every answer, stops the group, and stores the run in `--db` (toolkit.importers.torch_group:
engine settings, model shape, per-request timings and rank, per-rank iterations, passes and
MoE layer loads). Prints the run's mean TTFT, TPOT and E2E, throughput and mean running
requests per rank.

    python scripts/ep_group_run.py --db runs.duckdb --run-id ep2-poisson --rate 6
    python scripts/ep_group_run.py --db runs.duckdb --run-id ep2-saturated --rate 0
    pdlab twin runs.duckdb --run ep2-poisson --profile torch_tiny_moe_ep2.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def workload(
    n: int, rate: float, tin: tuple[int, int], tout: tuple[int, int], seed: int
) -> list[tuple[float, list[int], int]]:
    """(send time s, prompt ids, output tokens) per request: Poisson arrivals, random ids."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        ids = [rng.randrange(256) for _ in range(rng.randint(*tin))]
        out.append((t, ids, rng.randint(*tout)))
        t += rng.expovariate(rate) if rate > 0 else 0.0
    return out


async def send_all(url: str, reqs: list[tuple[float, list[int], int]]) -> list[dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=len(reqs))
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        t0 = time.monotonic()

        async def one(i: int, at: float, ids: list[int], n_out: int) -> dict[str, Any]:
            await asyncio.sleep(max(at - (time.monotonic() - t0), 0.0))
            sent = time.monotonic()
            body = {"input_ids": ids, "rid": f"req-{i:05d}",
                    "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True}}  # fmt: skip
            r = await client.post(url + "/generate", json=body)
            return {"i": i, "status": r.status_code, "sent": sent, "done": time.monotonic(),
                    "rank": r.headers.get("x-data-parallel-rank")}  # fmt: skip

        return list(await asyncio.gather(*(one(i, *q) for i, q in enumerate(reqs))))


def summarize(db: Path, run_id: str) -> dict[str, Any]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    row = con.execute(
        "SELECT count(*), avg(t_first_token - t_arrival), "
        "avg((t_done - t_first_token) / nullif(t_out - 1, 0)), avg(t_done - t_arrival), "
        "min(t_arrival), max(t_arrival), max(t_done), sum(t_out) FROM requests WHERE run_id = ?",
        [run_id],
    ).fetchone()
    assert row is not None
    n, ttft, tpot, e2e, a0, a1, end, out_tok = row
    per_rank = con.execute(
        "SELECT prefill_node, count(*), sum(t_done - t_prefill_start) FROM requests "
        "WHERE run_id = ? GROUP BY 1 ORDER BY 1",
        [run_id],
    ).fetchall()
    passes = con.execute(
        "SELECT node_id, kind, count(*), avg(duration_s) FROM dp_passes WHERE run_id = ? "
        "GROUP BY 1, 2 ORDER BY 1, 2",
        [run_id],
    ).fetchall()
    con.close()
    span = end - a0
    return {
        "run_id": run_id, "requests": n, "offered_rate_per_s": (n - 1) / (a1 - a0) if a1 > a0 else None,
        "mean_ttft_s": ttft, "mean_tpot_s": tpot, "mean_e2e_s": e2e, "span_s": span,
        "throughput_tok_s": out_tok / span,
        "ranks": {int(r): {"requests": c, "mean_running": busy / span} for r, c, busy in per_rank},
        "passes": {f"dp{n}.{k}": {"count": c, "mean_s": s} for n, k, c, s in passes},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per s (0: burst)")
    p.add_argument("--input-tokens", type=int, nargs=2, default=(32, 256))
    p.add_argument("--output-tokens", type=int, nargs=2, default=(16, 96))
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--kv-gpu-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, default=None, help="keep the group's logs here")
    p.add_argument(
        "--bundle",
        action="store_true",
        help="also export the run to toolkit/data/torch_ep_group/RUN_ID/",
    )
    p.add_argument("--interconnect", type=Path, default=None,
                   help="link.json of a measured profile (all-to-all latency, bandwidth)")  # fmt: skip
    a = p.parse_args(argv)
    from cluster.engines.torch.config import EngineConfig, preset
    from cluster.engines.torch.dp_group import DPGroup
    from toolkit.importers.torch_group import read_group_run, write_group_run

    cfg = EngineConfig(
        model=preset(a.model), seed=a.seed, gpu_pages=a.kv_gpu_tokens // 16, host_pages=0,
        chunk_tokens=a.chunk_tokens, max_running=a.max_running, num_threads=a.threads,
    )  # fmt: skip
    reqs = workload(a.requests, a.rate, tuple(a.input_tokens), tuple(a.output_tokens), a.seed)
    with tempfile.TemporaryDirectory(prefix="pdlab-ep-run-") as tmp:
        log_dir = a.log_dir or Path(tmp)
        group = DPGroup(cfg, a.dp, a.ep, log_dir=log_dir)
        load0 = os.getloadavg()
        try:
            url = group.start().http_url
            t = time.monotonic()
            got = asyncio.run(send_all(url, reqs))
            wall = time.monotonic() - t
        finally:
            codes = group.stop()
        bad = [g for g in got if g["status"] != 200]
        print(f"{len(got) - len(bad)} answered, {len(bad)} failed in {wall:.1f} s; rank exit "
              f"codes {codes}; load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}", file=sys.stderr)  # fmt: skip
        link = None if a.interconnect is None else json.loads(a.interconnect.read_text())
        workload_doc = {"requests": a.requests, "rate_per_s": a.rate, "seed": a.seed,
                        "input_tokens": list(a.input_tokens),
                        "output_tokens": list(a.output_tokens), "ignore_eos": True,
                        "load_avg_before": list(load0)}  # fmt: skip
        run = read_group_run(log_dir, a.run_id, interconnect=link,
                             extra_config={"workload": workload_doc})  # fmt: skip
        write_group_run(a.db, run)
    summary = summarize(a.db, a.run_id)
    if a.bundle:
        from toolkit.samples.torch_ep_group import BUNDLE_DIR, write_bundle

        write_bundle(a.db, a.run_id)
        (BUNDLE_DIR / a.run_id / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
