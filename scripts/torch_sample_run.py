"""Record the small torch-cluster run that notebook 02 fits (toolkit/data/torch_tiny_moe/).

Starts the live cluster of `pdlab serve --engines torch` (three tiny-moe engines on CPU, one
torch thread each, 1P2D), plays cc agents through its proxy for `--duration` seconds with
short tool gaps (so decode batches grow past a few requests and phi(B) is sampled over a
range of B), stops, and keeps only what a fit needs: the run's `runs`, `nodes` and
iteration rows as Parquet (`toolkit.samples.torch_cluster`; the KV events, requests and router
decisions of a live run are left out to keep the files small). Prints the fit's held-out
MAPE per node and phase and the spread of decode pass times at equal batch size.

    python scripts/torch_sample_run.py                 # rewrites toolkit/data/torch_tiny_moe/
    python scripts/torch_sample_run.py -o /tmp/sample --duration 120 --agents 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def record(db: Path, duration_s: float, agents: int, seed: int) -> str:
    from cluster.live.serving import ServerThread
    from toolkit.serve.sglang import create_sglang_app
    from toolkit.serve.torch import TorchClusterOptions, build_agents, build_cluster

    opts = TorchClusterOptions(agents=agents, time_scale=0.02, seed=seed, planner="static")
    cluster = build_cluster(opts, db, None)
    try:
        cluster.prepare()
        with ServerThread(create_sglang_app(cluster, "sample")) as server:
            loop = build_agents(opts, server.url).start()
            time.sleep(duration_s)
            stats = loop.stop()
    finally:
        cluster.stop()
    print(
        f"{stats.turns_ok} turns served, {stats.turns_failed} failed {stats.errors}",
        file=sys.stderr,
    )
    return str(cluster.run_id)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("-o", "--out", type=Path, default=None, help="Parquet directory")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of agents")
    p.add_argument("--agents", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from toolkit.fit.run import fit_run, mape_table
    from toolkit.queries import decode_noise, open_run
    from toolkit.samples.torch_cluster import SAMPLE_DIR, torch_sample_db, write_sample

    out = a.out or SAMPLE_DIR
    with tempfile.TemporaryDirectory(prefix="pdlab-sample-") as tmp:
        raw = Path(tmp) / "run.duckdb"
        run_id = record(raw, a.duration, a.agents, a.seed)
        files = write_sample(raw, run_id, out)
        db = torch_sample_db(Path(tmp) / "check.duckdb") if a.out is None else raw
        print(mape_table(fit_run(db, run_id)))
        with open_run(db, run_id) as run:
            print(decode_noise(run))
    size = sum(f.stat().st_size for f in files) / 1024
    print(f"{out}: run {run_id}, {size:.0f} KiB")


if __name__ == "__main__":
    main()
