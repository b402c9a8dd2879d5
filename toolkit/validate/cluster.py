"""Validation rows of a cluster run imported with `pdlab import lss-run` (toolkit.validate.run).

The run's requests replay on the cluster twin (toolkit.twin.lss) with the model's error
sources (toolkit.validate.cluster_interval: the profile's held-out residuals, each instance's ranged
parameters at their ends); its series (toolkit.validate.series) and request times are
compared with the imported references:
- throughput series: `span_s` (end of the last tick with output, the twin's ticks counted
  as LLMServingSim counts its own: tick k holds (k-1, k] after the first arrival; the real
  run's ticks are vLLM's 1 s log lines, whose phase to the first arrival is unknown, so its
  last token lies in (k-2, k]: the `ticks` source puts the twin's exact last token against
  that), `throughput_tick_mape`, and, without a latency table, `throughput_tok_s` (the
  requests' output tokens over each side's span: the real series' own sum falls short of
  them where its log lost lines, by 0.1-0.9% on the A6000 setups);
- latency table: `throughput_tok_s`, `ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s` against the
  `vLLM` row, peers' rows the same way; the bootstrap from toolkit.twin.metrics.compare with
  the real run represented by its means (its per-request times are not recorded);
- instance series: KV in use (gpu_mem_mb less the model's weights on one GPU, MiB) and
  prefix hit %; pool series: the pool's stored KV and hit %.
Relative rows (`span_s`, `throughput_tok_s`, means, `kv_mem_mean_mib`): the interval
combines the row's own spread (tick resolution, or the bootstrap) with the model's sources,
in quadrature (toolkit.twin.metrics.combined_interval), each in the row's `sources`.
Per-tick rows (`throughput_tick_mape`, `prefix_hit_tick_mae`, `kv_mem_tick_wape`, the pool's
and per-instance ones): the error is the metric itself with a moving-block bootstrap
interval over ticks, which an error of 0 is never inside; their `covered` says instead
whether the real series lies in the twin's per-tick 95% band (the model's sources and the
tick phase in quadrature) on at least 95% of the ticks the metric counts, and
`ticks_covered` gives that share. A peer's series are scored exactly as the twin's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from toolkit.queries.run import open_run
from toolkit.twin.interval import PROFILE_REPLAYS
from toolkit.twin.lss import load_cluster_inputs, weights_mib
from toolkit.twin.metrics import Timings, combined_interval, compare, interval_spread
from toolkit.validate.cluster_interval import (
    ClusterTwin,
    Ticks,
    cluster_twin,
    inside_band,
    share,
    spreads,
)
from toolkit.validate.rows import RunRows, ValidationRow, make_row
from toolkit.validate.series import block_interval, span_ticks, tick_mae, tick_mape, tick_wape

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


def _ticks_for(refs: pl.DataFrame) -> Any:
    """The ticks of every series the references have (cluster_interval.Ticks)."""
    thr = _arrays(refs, "throughput_tok_s", None).get("real")
    nodes = sorted(
        {int(x) for x in refs.filter(pl.col("scope") == "instance")["node_id"].to_list()}
    )
    masks = {}
    for node in nodes:
        got = [
            *_arrays(refs, "prefix_hit_pct", node).values(),
            *_arrays(refs, "gpu_mem_mb", node).values(),
        ]
        real_kv = _arrays(refs, "gpu_mem_mb", node).get("real")
        n = max(len(v) for v in got)
        masks[node] = (
            np.zeros(n, bool)
            if real_kv is None
            else np.pad(~np.isnan(real_kv), (0, n - len(real_kv)))
        )
    pool = [
        *_arrays(refs, "cpu_prefix_hit_pct", None).values(),
        *_arrays(refs, "cpu_mem_mb", None).values(),
    ]

    def ticks(replay: Any, origin: float) -> Ticks:
        last = max(q.done_s for q in replay.requests) - origin
        n = 0 if thr is None else max(len(thr), math.ceil(last) + 2)
        return Ticks(n, masks, max((len(v) for v in pool), default=0))

    return ticks  # fmt: skip


def cluster_rows(
    db: str | Path,
    run: str,
    *,
    samples: int = 1000,
    seed: int = 0,
    profile_replays: int = PROFILE_REPLAYS,
) -> RunRows:
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
    twin = cluster_twin(inputs, _ticks_for(refs), profile_replays=profile_replays, seed=seed)
    rows: list[ValidationRow] = []
    frames: list[pl.DataFrame] = []
    kw = {"samples": samples, "seed": seed}
    thr = _arrays(refs, "throughput_tok_s", None)
    if "real" in thr:
        rows += _throughput_rows(run, thr, twin, lat.height == 0, frames, kw)
    if lat.height:
        rows += _latency_rows(run, lat, twin, kw)
    rows += _prefix_rows(run, refs, twin, frames, kw)
    notes = [
        f"front end: {inputs.frontend}",
        *(f"instance {i}: {x.role}, max_num_seqs {x.engine.max_num_seqs}, max_num_batched_tokens "
          f"{x.engine.max_num_batched_tokens}, {x.kv_blocks} KV blocks" for i, x in enumerate(inputs.instances)),
        *inputs.config.get("assumptions", []),
    ]  # fmt: skip
    series = pl.concat(frames) if frames else pl.DataFrame()
    return RunRows(rows, series, notes)


def _relative(
    run: str, metric: str, real: float, twin_v: float, own: tuple[float, float], twin: ClusterTwin,
    key: str, peers: dict[str, float], own_name: str,
) -> ValidationRow:  # fmt: skip
    """A relative row: its own interval (`own_name`) and the model's sources combined."""
    err = twin_v / real - 1.0
    src = {own_name: interval_spread(err, own)} | spreads(twin, key)
    return make_row(run, metric, real, twin_v, err, combined_interval(err, src), peers, sources=src)


def _throughput_rows(
    run: str,
    thr: dict[str, np.ndarray],
    twin: ClusterTwin,
    with_rate: bool,
    frames: list[pl.DataFrame],
    kw: dict[str, int],
) -> list[ValidationRow]:
    real = np.nan_to_num(thr["real"])
    series = np.asarray(twin.values["throughput"])
    last = float(twin.values["span_s"])
    peers = {k: np.nan_to_num(v) for k, v in thr.items() if k != "real"}
    for src, v in (("real", real), ("twin", series), *peers.items()):
        frames.append(_frame(np.arange(len(v)), "throughput_tok_s", None, src, v))
    k_real, k_twin = span_ticks(real), span_ticks(series)
    rows = []
    if k_real > 2:
        # the real run's last token lies in (k-2, k]: its 1 s logger runs at an unknown phase
        own = (last / k_real - 1.0, last / (k_real - 2) - 1.0)
        rows.append(_relative(
            run, "span_s", float(k_real), float(k_twin), own, twin, "span_s",
            {p: span_ticks(v) / k_real - 1.0 for p, v in peers.items()}, "ticks",
        ))  # fmt: skip
    covered = share(inside_band(twin, "throughput", real, real > 0))
    rows.append(make_row(
        run, "throughput_tick_mape", float(np.mean(real[real > 0])), float(np.mean(series[: len(real)][real[: len(series)] > 0])),
        tick_mape(real, series), block_interval(tick_mape, real, series, **kw),
        {p: tick_mape(real, v) for p, v in peers.items()}, "fraction", ticks_covered=covered, per_tick=True,
    ))  # fmt: skip
    if with_rate and k_real > 2:
        # the run's output tokens (its requests'), over each side's span: the real series'
        # own sum can fall short of them (its log lines lost some)
        tokens = float(sum(q.output_tokens for q in twin.replay.requests))
        r_rate, t_rate = tokens / k_real, tokens / max(k_twin, 1)
        exact = tokens / last
        own = (exact / (tokens / (k_real - 2)) - 1.0, exact / r_rate - 1.0)
        rows.append(_relative(
            run, "throughput_tok_s", r_rate, t_rate, own, twin, "throughput_tok_s",
            {p: (v.sum() / max(span_ticks(v), 1)) / r_rate - 1.0 for p, v in peers.items()},
            "ticks",
        ))  # fmt: skip
    return rows


def _latency_rows(
    run: str, lat: pl.DataFrame, twin: ClusterTwin, kw: dict[str, int]
) -> list[ValidationRow]:
    real = lat.filter(pl.col("is_real")).row(0, named=True)
    peers = lat.filter(~pl.col("is_real")).to_dicts()
    reqs = twin.replay.requests
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
        rv, twin_v = real["throughput_tok_s"], float(twin.values["throughput_tok_s"])
        rng = np.random.default_rng(kw["seed"])
        idx = rng.integers(0, len(reqs), size=(kw["samples"], len(reqs)))
        boot = t_out[idx].sum(axis=1) / (sim.t_done[idx].max(axis=1) - arr[idx].min(axis=1))
        lo, hi = np.percentile(boot / rv - 1.0, [2.5, 97.5])
        rows.append(_relative(
            run, "throughput_tok_s", rv, twin_v, (float(lo), float(hi)), twin, "throughput_tok_s",
            peer_errors("throughput_tok_s"), "requests",
        ))  # fmt: skip
    ttft, tpot, e2e = real["ttft_mean_s"], real["tpot_mean_s"], real["e2e_mean_s"]
    if ttft is not None or tpot is not None:
        first = arr + (ttft or 0.0)
        done = first + (tpot or 0.0) * np.maximum(t_out - 1, 0)
        m = compare(Timings(arr, t_out, first, done), sim, samples=kw["samples"], seed=kw["seed"])
        for name, val in (("ttft_mean_s", ttft), ("tpot_mean_s", tpot)):
            if val is not None and val > 0:
                x = m[name]
                rows.append(
                    _relative(
                        run, name, val, x.sim, x.ci95, twin, name, peer_errors(name), "requests"
                    )
                )
    if e2e is not None and e2e > 0:
        m = compare(
            Timings(arr, t_out, arr, arr + e2e), sim, samples=kw["samples"], seed=kw["seed"]
        )
        x = m["e2e_mean_s"]
        rows.append(
            _relative(run, "e2e_mean_s", e2e, x.sim, x.ci95, twin, "e2e_mean_s",
                      peer_errors("e2e_mean_s"), "requests")
        )  # fmt: skip
    return rows


def _prefix_rows(
    run: str,
    refs: pl.DataFrame,
    twin: ClusterTwin,
    frames: list[pl.DataFrame],
    kw: dict[str, int],
) -> list[ValidationRow]:
    rows: list[ValidationRow] = []
    per_node: list[ValidationRow] = []
    pooled: dict[str, dict[str, list[np.ndarray]]] = {"hit": {}, "kv": {}}
    nodes = sorted(twin.ticks.nodes)
    for node in nodes:
        hits = _arrays(refs, "prefix_hit_pct", node)
        mem = _arrays(refs, "gpu_mem_mb", node)
        w = weights_mib(twin.inputs, node)
        series = {
            "hit": np.asarray(twin.values[f"hit[{node}]"]),
            "kv": np.asarray(twin.values[f"kv[{node}]"]),
        }
        got = {"hit": hits, "kv": {k: v - w for k, v in mem.items()}}
        for key, metric, ref_metric in (
            ("hit", "prefix_hit_tick_mae", "prefix_hit_pct"),
            ("kv", "kv_mem_tick_wape", "gpu_mem_mb"),
        ):
            ref = got[key]
            if "real" not in ref:
                continue
            real, tw = _ok(ref["real"], series[key])
            inside = inside_band(twin, f"{key}[{node}]", ref["real"])
            peers = {p: _ok(ref["real"], v) for p, v in ref.items() if p != "real"}
            bucket = pooled[key]
            bucket.setdefault("real", []).append(real)
            bucket.setdefault("twin", []).append(tw)
            bucket.setdefault("inside", []).append(inside)
            for p, (pr, pv) in peers.items():
                bucket.setdefault(p, []).append(pv)
                bucket.setdefault(f"real:{p}", []).append(pr)
            off = 0.0 if key == "hit" else w
            for src, v in (
                ("real", ref["real"] + off),
                ("twin", series[key] + off),
                *((p, ref[p] + off) for p in peers),
            ):
                frames.append(_frame(np.arange(len(v)), ref_metric, node, src, v))
            if len(nodes) > 1:
                per_node.append(
                    _series_row(run, f"{metric}[{node}]", real, tw, peers, key, kw, share(inside))
                )
    for key, metric in (("hit", "prefix_hit_tick_mae"), ("kv", "kv_mem_tick_wape")):
        b = pooled[key]
        if "real" not in b:
            continue
        real, tw = np.concatenate(b["real"]), np.concatenate(b["twin"])
        peers = {p: (np.concatenate(b[f"real:{p}"]), np.concatenate(v)) for p, v in b.items()
                 if p not in ("real", "twin", "inside") and not p.startswith("real:")}  # fmt: skip
        rows.append(
            _series_row(run, metric, real, tw, peers, key, kw, share(np.concatenate(b["inside"])))
        )
        if key == "kv":
            own = block_interval(lambda a, b: b.mean() / a.mean() - 1.0, real, tw, **kw)
            rows.append(_relative(
                run, "kv_mem_mean_mib", float(real.mean()), float(tw.mean()), own, twin,
                "kv_mem_mean_mib", {p: pv.mean() / pr.mean() - 1.0 for p, (pr, pv) in peers.items()},
                "ticks",
            ))  # fmt: skip
    return rows + per_node + _pool_rows(run, refs, twin, frames, kw)


def _series_row(
    run: str, metric: str, real: np.ndarray, twin: np.ndarray,
    peers: dict[str, tuple[np.ndarray, np.ndarray]], key: str, kw: dict[str, int],
    ticks_covered: float | None,
) -> ValidationRow:  # fmt: skip
    fn = tick_mae if key == "hit" else tick_wape
    return make_row(
        run, metric, float(np.mean(real)), float(np.mean(twin)), fn(real, twin),
        block_interval(fn, real, twin, **kw), {p: fn(pr, pv) for p, (pr, pv) in peers.items()},
        "points" if key == "hit" else "fraction", ticks_covered=ticks_covered, per_tick=True,
    )  # fmt: skip


def _pool_rows(
    run: str, refs: pl.DataFrame, twin: ClusterTwin, frames: list[pl.DataFrame],
    kw: dict[str, int],
) -> list[ValidationRow]:  # fmt: skip
    hits, mem = _arrays(refs, "cpu_prefix_hit_pct", None), _arrays(refs, "cpu_mem_mb", None)
    if "real" not in hits and "real" not in mem:
        return []
    series = {"hit": np.asarray(twin.values["pool_hit"]), "kv": np.asarray(twin.values["pool_kv"])}
    rows = []
    for key, ref, metric, ref_metric in (
        ("hit", hits, "pool_hit_tick_mae", "cpu_prefix_hit_pct"), ("kv", mem, "pool_mem_tick_wape", "cpu_mem_mb"),
    ):  # fmt: skip
        if "real" not in ref:
            continue
        real, tw = _ok(ref["real"], series[key])
        peers = {p: _ok(ref["real"], v) for p, v in ref.items() if p != "real"}
        for src, v in (("real", ref["real"]), ("twin", series[key]), *((p, ref[p]) for p in peers)):
            frames.append(_frame(np.arange(len(v)), ref_metric, None, src, v))
        inside = inside_band(twin, f"pool_{key}", ref["real"])
        rows.append(_series_row(run, metric, real, tw, peers, key, kw, share(inside)))
    return rows
