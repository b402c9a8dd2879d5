"""Validation rows of a benchmark run (`pdlab import vllm-bench` / `sglang-bench`).

The run replays on the engine twin (`pdlab twin`, toolkit.twin.run.run_twin, nothing stored)
with the operator profile given for it; its per-request times give the rows directly:
`ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s`, `throughput_tok_s` (output tokens from the first
arrival to the last token) and `span_s`. Every row's interval is the twin's combined one
(toolkit.twin.interval): the paired bootstrap over requests with the model's error (the
profile's held-out residuals, each ranged parameter at its ends), each source's (down, up)
in the row's `sources`. Peers: the simulators' mean figures imported with the run
(reference_latency, e.g. LLMServingSim's own validation summary), each against the real row
of the same table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from toolkit.queries.run import open_run
from toolkit.twin.interval import PROFILE_REPLAYS
from toolkit.twin.metrics import (
    bootstrap_indices,
    combined_interval,
    interval,
    interval_spread,
    span_values,
)
from toolkit.twin.run import SPAN_KEYS, run_twin
from toolkit.validate.rows import RunRows, make_row


def bench_rows(
    db: str | Path,
    run: str,
    profile: str | Path,
    *,
    samples: int = 1000,
    seed: int = 0,
    profile_replays: int = PROFILE_REPLAYS,
) -> RunRows:
    res = run_twin(
        db, run, profile, store=False, samples=samples, seed=seed, profile_replays=profile_replays
    )
    with open_run(db, run) as r:
        lat = r.df("SELECT * FROM reference_latency WHERE run_id = ?", [r.run_id])
    real_row = lat.filter(pl.col("is_real")).to_dicts()
    peers = lat.filter(~pl.col("is_real")).to_dicts()

    def peer_errors(col: str) -> dict[str, float]:
        if not real_row or not real_row[0][col]:
            return {}
        return {
            p["framework"]: p[col] / real_row[0][col] - 1.0 for p in peers if p[col] is not None
        }

    rows = []
    for name in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s"):
        m = res.metrics[name]
        rows.append(
            make_row(
                run, name, m.real, m.sim, m.error, m.ci95, peer_errors(name), sources=m.sources
            )
        )
    idx = bootstrap_indices(len(res.real.t_arrival), samples, seed)
    real_v, sim_v = span_values(res.real), span_values(res.sim)
    real_b, sim_b = span_values(res.real, idx), span_values(res.sim, idx)
    for name in SPAN_KEYS:
        rv, sv = float(real_v[name]), float(sim_v[name])
        err = sv / rv - 1.0
        spreads = {"requests": interval_spread(err, interval(sim_b[name] / real_b[name] - 1.0))}
        spreads |= {s.name: s.spread[name] for s in res.sources or [] if name in s.spread}
        rows.append(
            make_row(
                run, name, rv, sv, err, combined_interval(err, spreads),
                peer_errors(name) if name == "throughput_tok_s" else {}, sources=spreads,
            )
        )  # fmt: skip
    e = res.inputs.engine
    notes = [
        f"profile {profile}",
        f"max_num_seqs {e.max_num_seqs}, max_num_batched_tokens {e.max_num_batched_tokens}, "
        f"KV {res.inputs.kv.blocks} blocks ({res.inputs.kv.source})",
    ]
    return RunRows(rows, _series(res), notes)


def _series(res: object) -> pl.DataFrame:
    """Output tokens per 1 s tick, real and twin (tokens spread evenly from first to last)."""
    frames = []
    real, sim = res.real, res.sim  # type: ignore[attr-defined]
    origin = float(real.t_arrival.min())
    n = int(np.ceil(max(real.t_done.max(), sim.t_done.max()) - origin)) + 2
    for src, t in (("real", real), ("twin", sim)):
        out = np.zeros(n)
        for first, done, k in zip(
            t.t_first_token - origin, t.t_done - origin, t.t_out, strict=True
        ):
            times = np.linspace(first, done, int(k)) if k > 1 else np.array([first])
            np.add.at(out, np.minimum(np.ceil(times).astype(int), n - 1), 1.0)
        frames.append(pl.DataFrame({"t": np.arange(n, dtype=float), "metric": "throughput_tok_s",
                                    "node_id": None, "source": src, "value": out},
                                   schema={"t": pl.Float64, "metric": pl.Utf8, "node_id": pl.Int64,
                                           "source": pl.Utf8, "value": pl.Float64}))  # fmt: skip
    return pl.concat(frames)
