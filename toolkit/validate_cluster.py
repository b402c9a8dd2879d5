"""Validation rows of a cluster run imported with `pdlab import lss-run` (toolkit.validate).

The run's requests replay on the cluster twin (toolkit.twin_lss); its series
(toolkit.validate_series) and request times are compared with the imported references:
- throughput series: `span_s` (end of the last tick with output, the twin's ticks counted
  as LLMServingSim counts its own: tick k holds (k-1, k] after the first arrival; the real
  run's ticks are vLLM's 1 s log lines, whose phase to the first arrival is unknown, so its
  last token lies in (k-2, k]: the interval puts the twin's exact last token against that),
  `throughput_tick_mape`, and, without a latency table, `throughput_tok_s` (tokens over span);
- latency table: `throughput_tok_s`, `ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s` against the
  `vLLM` row, peers' rows the same way; intervals from toolkit.twin_metrics.compare with the
  real run represented by its means (its per-request times are not recorded);
- instance series: KV in use (gpu_mem_mb less the model's weights on one GPU, MiB) and
  prefix hit %; pool series: the pool's stored KV and hit %.
A peer's series are scored exactly as the twin's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from toolkit.queries.run import open_run
from toolkit.twin_lss import block_mib, load_cluster_inputs, replay_cluster_run, weights_mib
from toolkit.twin_metrics import Timings, compare
from toolkit.validate_series import (
    block_interval,
    hit_pct,
    pool_chunks_ticks,
    span_ticks,
    state_ticks,
    throughput_ticks,
    tick_mae,
    tick_mape,
    tick_wape,
)
from toolkit.validation_rows import RunRows, ValidationRow, make_row

MIB = 2**20


def _arrays(refs: pl.DataFrame, metric: str, node: int | None) -> dict[str, np.ndarray]:
    """source -> values by integer tick of one series."""
    sel = refs.filter(pl.col("metric") == metric)
    sel = sel.filter(pl.col("node_id").is_null() if node is None else pl.col("node_id") == node)
    out = {}
    for src in sel["source"].unique().sort().to_list():
        s = sel.filter(pl.col("source") == src)
        idx = np.round(s["t"].to_numpy()).astype(int)
        arr = np.full(int(idx.max()) + 1, np.nan)
        arr[idx] = s["value"].to_numpy()
        out[src] = arr
    return out


def _ok(real: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both on the real series' ticks, ticks the real series lacks left out."""
    other = np.pad(other, (0, max(0, len(real) - len(other))))[: len(real)]
    keep = ~np.isnan(real) & ~np.isnan(other)
    return real[keep], other[keep]


def _frame(
    t: np.ndarray, metric: str, node: int | None, source: str, v: np.ndarray
) -> pl.DataFrame:
    return pl.DataFrame(
        {"t": t.astype(float), "metric": metric, "node_id": node, "source": source, "value": v},
        schema={
            "t": pl.Float64,
            "metric": pl.Utf8,
            "node_id": pl.Int64,
            "source": pl.Utf8,
            "value": pl.Float64,
        },
    )


def cluster_rows(db: str | Path, run: str, *, samples: int = 1000, seed: int = 0) -> RunRows:
    with open_run(db, run) as r:
        refs = r.df(
            "SELECT source, scope, node_id, metric, t, value FROM reference_series "
            "WHERE run_id = ? ORDER BY t",
            [r.run_id],
        )
        lat = r.df("SELECT * FROM reference_latency WHERE run_id = ?", [r.run_id])
    if refs.height == 0 and lat.height == 0:
        return RunRows([], pl.DataFrame(), [])
    inputs = load_cluster_inputs(db, run)
    replay = replay_cluster_run(inputs)
    origin = min(q.arrival_s for q in inputs.requests)
    rows: list[ValidationRow] = []
    frames: list[pl.DataFrame] = []
    kw = {"samples": samples, "seed": seed}
    thr = _arrays(refs, "throughput_tok_s", None)
    last = max(q.done_s for q in replay.requests) - origin
    if "real" in thr:
        rows += _throughput_rows(run, thr, replay, origin, last, lat.height == 0, frames, kw)
    if lat.height:
        rows += _latency_rows(run, lat, replay, origin, kw)
    rows += _prefix_rows(run, refs, inputs, replay, origin, frames, kw)
    notes = [
        f"front end: {inputs.frontend}",
        *(f"instance {i}: {x.role}, max_num_seqs {x.engine.max_num_seqs}, max_num_batched_tokens "
          f"{x.engine.max_num_batched_tokens}, {x.kv_blocks} KV blocks" for i, x in enumerate(inputs.instances)),
        *inputs.config.get("assumptions", []),
    ]  # fmt: skip
    series = pl.concat(frames) if frames else pl.DataFrame()
    return RunRows(rows, series, notes)


def _throughput_rows(
    run: str,
    thr: dict[str, np.ndarray],
    replay: Any,
    origin: float,
    last: float,
    with_rate: bool,
    frames: list[pl.DataFrame],
    kw: dict[str, int],
) -> list[ValidationRow]:
    real = np.nan_to_num(thr["real"])
    n = max(len(real), math.ceil(last) + 2)
    twin = throughput_ticks(replay, origin, n)
    peers = {k: np.nan_to_num(v) for k, v in thr.items() if k != "real"}
    for src, v in (("real", real), ("twin", twin), *peers.items()):
        frames.append(_frame(np.arange(len(v)), "throughput_tok_s", None, src, v))
    k_real, k_twin = span_ticks(real), span_ticks(twin)
    rows = []
    if k_real > 2:
        # the real run's last token lies in (k-2, k]: its 1 s logger runs at an unknown phase
        lo, hi = last / k_real - 1.0, last / (k_real - 2) - 1.0
        rows.append(make_row(
            run, "span_s", float(k_real), float(k_twin), k_twin / k_real - 1.0, (lo, hi),
            {p: span_ticks(v) / k_real - 1.0 for p, v in peers.items()},
        ))  # fmt: skip
    rows.append(make_row(
        run, "throughput_tick_mape", float(np.mean(real[real > 0])), float(np.mean(twin[: len(real)][real[: len(twin)] > 0])),
        tick_mape(real, twin), block_interval(tick_mape, real, twin, **kw),
        {p: tick_mape(real, v) for p, v in peers.items()}, "fraction",
    ))  # fmt: skip
    if with_rate and k_real > 2:
        r_rate, t_rate = real.sum() / k_real, twin.sum() / max(k_twin, 1)
        exact = twin.sum() / last
        ci = (exact / (real.sum() / (k_real - 2)) - 1.0, exact / r_rate - 1.0)
        rows.append(make_row(
            run, "throughput_tok_s", r_rate, t_rate, t_rate / r_rate - 1.0, ci,
            {p: (v.sum() / max(span_ticks(v), 1)) / r_rate - 1.0 for p, v in peers.items()},
        ))  # fmt: skip
    return rows


def _latency_rows(
    run: str, lat: pl.DataFrame, replay: Any, origin: float, kw: dict[str, int]
) -> list[ValidationRow]:
    real = lat.filter(pl.col("is_real")).row(0, named=True)
    peers = lat.filter(~pl.col("is_real")).to_dicts()
    reqs = replay.requests
    arr = np.array([q.arrival_s for q in reqs])
    t_out = np.array([q.output_tokens for q in reqs], dtype=float)
    sim = Timings(
        arr, t_out, np.array([q.first_token_s for q in reqs]), np.array([q.done_s for q in reqs])
    )
    rows = []

    def peer_errors(col: str) -> dict[str, float]:
        return {
            p["framework"]: p[col] / real[col] - 1.0
            for p in peers
            if p[col] is not None and real[col]
        }

    if real["throughput_tok_s"]:
        span = sim.t_done.max() - arr.min()
        twin = t_out.sum() / span
        rng = np.random.default_rng(kw["seed"])
        idx = rng.integers(0, len(reqs), size=(kw["samples"], len(reqs)))
        boot = t_out[idx].sum(axis=1) / (sim.t_done[idx].max(axis=1) - arr[idx].min(axis=1))
        lo, hi = np.percentile(boot / real["throughput_tok_s"] - 1.0, [2.5, 97.5])
        rows.append(make_row(
            run, "throughput_tok_s", real["throughput_tok_s"], twin,
            twin / real["throughput_tok_s"] - 1.0, (float(lo), float(hi)), peer_errors("throughput_tok_s"),
        ))  # fmt: skip
    ttft, tpot, e2e = real["ttft_mean_s"], real["tpot_mean_s"], real["e2e_mean_s"]
    if ttft is not None or tpot is not None:
        first = arr + (ttft or 0.0)
        done = first + (tpot or 0.0) * np.maximum(t_out - 1, 0)
        m = compare(Timings(arr, t_out, first, done), sim, samples=kw["samples"], seed=kw["seed"])
        for name, col, val in (
            ("ttft_mean_s", "ttft_mean_s", ttft),
            ("tpot_mean_s", "tpot_mean_s", tpot),
        ):
            if val is not None and val > 0:
                x = m[name]
                rows.append(
                    make_row(run, name, val, x.sim, x.sim / val - 1.0, x.ci95, peer_errors(col))
                )
    if e2e is not None and e2e > 0:
        m = compare(
            Timings(arr, t_out, arr, arr + e2e), sim, samples=kw["samples"], seed=kw["seed"]
        )
        x = m["e2e_mean_s"]
        rows.append(
            make_row(
                run, "e2e_mean_s", e2e, x.sim, x.sim / e2e - 1.0, x.ci95, peer_errors("e2e_mean_s")
            )
        )
    return rows


def _prefix_rows(
    run: str,
    refs: pl.DataFrame,
    inputs: Any,
    replay: Any,
    origin: float,
    frames: list[pl.DataFrame],
    kw: dict[str, int],
) -> list[ValidationRow]:
    rows: list[ValidationRow] = []
    per_node: list[ValidationRow] = []
    pooled: dict[str, dict[str, list[np.ndarray]]] = {"hit": {}, "kv": {}}
    nodes = sorted(
        {int(x) for x in refs.filter(pl.col("scope") == "instance")["node_id"].to_list()}
    )
    for node in nodes:
        hits = _arrays(refs, "prefix_hit_pct", node)
        mem = _arrays(refs, "gpu_mem_mb", node)
        n = max([len(v) for v in (*hits.values(), *mem.values())])
        st = state_ticks(replay, node, origin, n)
        w, blk = weights_mib(inputs, node), block_mib(inputs, node)
        twin = {"hit": hit_pct(st["local_hits"], st["queries"]), "kv": st["kv_blocks"] * blk}
        got = {"hit": hits, "kv": {k: v - w for k, v in mem.items()}}
        for key, metric, ref_metric in (
            ("hit", "prefix_hit_tick_mae", "prefix_hit_pct"),
            ("kv", "kv_mem_tick_wape", "gpu_mem_mb"),
        ):
            ref = got[key]
            if "real" not in ref:
                continue
            real, tw = _ok(ref["real"], twin[key])
            peers = {p: _ok(ref["real"], v) for p, v in ref.items() if p != "real"}
            bucket = pooled[key]
            bucket.setdefault("real", []).append(real)
            bucket.setdefault("twin", []).append(tw)
            for p, (pr, pv) in peers.items():
                bucket.setdefault(p, []).append(pv)
                bucket.setdefault(f"real:{p}", []).append(pr)
            off = 0.0 if key == "hit" else w
            for src, v in (
                ("real", ref["real"] + off),
                ("twin", twin[key] + off),
                *((p, ref[p] + off) for p in peers),
            ):
                frames.append(_frame(np.arange(len(v)), ref_metric, node, src, v))
            if len(nodes) > 1:
                per_node.append(_series_row(run, f"{metric}[{node}]", real, tw, peers, key, kw))
    for key, metric in (("hit", "prefix_hit_tick_mae"), ("kv", "kv_mem_tick_wape")):
        b = pooled[key]
        if "real" not in b:
            continue
        real, tw = np.concatenate(b["real"]), np.concatenate(b["twin"])
        peers = {p: (np.concatenate(b[f"real:{p}"]), np.concatenate(v)) for p, v in b.items()
                 if p not in ("real", "twin") and not p.startswith("real:")}  # fmt: skip
        rows.append(_series_row(run, metric, real, tw, peers, key, kw))
        if key == "kv":
            rows.append(make_row(
                run, "kv_mem_mean_mib", float(real.mean()), float(tw.mean()), tw.mean() / real.mean() - 1.0,
                block_interval(lambda a, b: b.mean() / a.mean() - 1.0, real, tw, **kw),
                {p: pv.mean() / pr.mean() - 1.0 for p, (pr, pv) in peers.items()},
            ))  # fmt: skip
    return rows + per_node + _pool_rows(run, refs, inputs, replay, origin, frames, kw)


def _series_row(
    run: str, metric: str, real: np.ndarray, twin: np.ndarray,
    peers: dict[str, tuple[np.ndarray, np.ndarray]], key: str, kw: dict[str, int],
) -> ValidationRow:  # fmt: skip
    fn = tick_mae if key == "hit" else tick_wape
    return make_row(
        run, metric, float(np.mean(real)), float(np.mean(twin)), fn(real, twin),
        block_interval(fn, real, twin, **kw), {p: fn(pr, pv) for p, (pr, pv) in peers.items()},
        "points" if key == "hit" else "fraction",
    )  # fmt: skip


def _pool_rows(
    run: str, refs: pl.DataFrame, inputs: Any, replay: Any, origin: float,
    frames: list[pl.DataFrame], kw: dict[str, int],
) -> list[ValidationRow]:  # fmt: skip
    hits, mem = _arrays(refs, "cpu_prefix_hit_pct", None), _arrays(refs, "cpu_mem_mb", None)
    if "real" not in hits and "real" not in mem:
        return []
    n = max(len(v) for v in (*hits.values(), *mem.values()))
    q = e = np.zeros(n)
    for node in range(len(replay.instances)):
        st = state_ticks(replay, node, origin, n)
        q, e = q + st["queries"], e + st["external_hits"]
    chunk_mib = replay.pool.chunk_bytes / 2**20 if replay.pool is not None else 0.0
    twin = {"hit": hit_pct(e, q), "kv": pool_chunks_ticks(replay, origin, n) * chunk_mib}
    rows = []
    for key, ref, metric, ref_metric in (
        ("hit", hits, "pool_hit_tick_mae", "cpu_prefix_hit_pct"), ("kv", mem, "pool_mem_tick_wape", "cpu_mem_mb"),
    ):  # fmt: skip
        if "real" not in ref:
            continue
        real, tw = _ok(ref["real"], twin[key])
        peers = {p: _ok(ref["real"], v) for p, v in ref.items() if p != "real"}
        for src, v in (("real", ref["real"]), ("twin", twin[key]), *((p, ref[p]) for p in peers)):
            frames.append(_frame(np.arange(len(v)), ref_metric, None, src, v))
        rows.append(_series_row(run, metric, real, tw, peers, key, kw))
    return rows
