"""Replay validation against the recorded SWE-agent run (paper 003 §5.1 in miniature).

The trace (`thunderagent_sweagent_glm45fp8_h200_turns.jsonl`) was served by vLLM on one
H200 instance (TP4 x PP2, GLM-4.5-FP8: k = 8 of E = 160 routed experts, chunked prefill,
prefix caching) at 1, 4 and 32 concurrent agents. We fit a `HardwareProfile` to its
client-side timings and replay the programs at their recorded concurrency on one
collocated simulated node, then compare each turn's simulated LLM time (t_done -
t_arrival) with the recorded `llm_time_s`.

Fit (`fit_sweagent_profile`):
- Prefill (Eq. 1) from the bs1 turns, which run alone: `prefill_time_s` against t_uc and
  A with t_c the previous turn's input plus output (the appended context is what prefix
  caching cannot serve) and t_uc the rest; NNLS over (c0, c1, c2). c0 absorbs per-call
  overheads inside the measured time to first token.
- Decode (Eq. 2 with the context term): each turn's decode time is
  t_out (d0 + d1 phi(B) + d2 B + c ctx) + I, where B is the mean number of calls in
  flight during its decode window (from llm_enter/llm_exit overlaps), ctx their summed
  context, and I the prefill work of the calls that started inside that window (the
  simulator stalls decode for prefill iterations, so the fit must not absorb it twice).
  NNLS over turns grouped into (run, B decile) bins, on relative residuals of the bin
  sums, so that sums of decode time (what mean JCT depends on) are fitted at every
  concurrency rather than the noisiest single turns.

What limits per-turn accuracy (measured by `replay_validation`): `output_tokens` counts
only the visible output; at bs1 the time per visible token ranges from 17 ms to 290 ms,
i.e. many turns also generate tokens the trace does not count (reasoning), which no
token-count model can attribute to a particular turn; the client-side timings add HTTP
and tokenization overheads (llm_time_s exceeds prefill + decode by a median 67 ms); and
vLLM mixes prefill chunks into decode iterations where the simulator alternates them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy.optimize import nnls

from cluster.core import ConfigError
from cluster.hardware.profiles import HardwareProfile
from models import phi

TRACE = "thunderagent_sweagent_glm45fp8_h200_turns.jsonl"
SLICE = "sweagent_turns_slice.jsonl"  # the four-program test fixture (a clean clone)
TOP_K, NUM_EXPERTS = 8, 160  # GLM-4.5: 8 of 160 routed experts per token
RUN_AGENTS = {"bs1": 1, "bs4": 4, "bs32": 32}


class SweagentFit(NamedTuple):
    profile: HardwareProfile
    prefill_coef: tuple[float, float, float]  # c0 (s), c1 (s/token), c2 (s/pair)
    decode_coef: tuple[float, float, float]  # d0, d1 (s per visible token), d2 (s/request)
    ctx_coef: float  # s per context token in the batch, per visible token
    prefill_mape: float  # held-in MAPE of the bs1 prefill fit
    decode_sum_error: dict[str, float]  # per run: fitted / recorded sum of decode time - 1
    num_turns: int


class ReplayReport(NamedTuple):
    run: str
    turns: int  # turns compared (simulated and recorded)
    mean_llm_s_sim: float
    mean_llm_s_real: float
    mean_error: float  # mean simulated / mean recorded LLM time - 1 (signed)
    mape: float  # mean over turns of |sim - real| / real
    p99_abs_error: float  # 99th percentile over turns of |sim - real| / real
    p99_llm_s_sim: float
    p99_llm_s_real: float
    p99_error: float  # p99 simulated / p99 recorded LLM time - 1
    sim_seconds: float


def trace_path(path: str | Path | None = None) -> Path:
    """`path`, else the full trace in the data directory, else the bundled slice."""
    from cluster.workloads.traces import resolve_trace_path

    if path is not None:
        return resolve_trace_path(path)
    try:
        return resolve_trace_path(TRACE)
    except ConfigError:
        return resolve_trace_path(SLICE)


def load_turns(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The trace's turns sorted by (run, instance, step), with the cached prefix t_c."""
    from cluster.workloads.traces import open_text

    p = trace_path(path)
    with open_text(p) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows or "llm_enter" not in rows[0]:
        raise ConfigError(f"{p}: not a SWE-agent turn trace (needs llm_enter/llm_exit)")
    rows.sort(key=lambda r: (r["run"], r["instance"], r["step"]))
    prev: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        q = prev.get((r["run"], r["instance"]))
        t_in = r["input_tokens"]
        if q is None:
            t_c = 0
        else:
            reused = q["input_tokens"] + q["output_tokens"]
            t_c = min(reused if t_in > reused else q["input_tokens"], t_in - 1)
            t_c = max(t_c, 0) if t_in > q["input_tokens"] else 0  # shrank: no reuse
        r["t_c"] = t_c
        prev[(r["run"], r["instance"])] = r
    return rows


def _prefill_x(rows: list[dict[str, Any]]) -> np.ndarray:
    t_in = np.array([r["input_tokens"] for r in rows], dtype=float)
    t_c = np.array([r["t_c"] for r in rows], dtype=float)
    t_uc = t_in - t_c
    a = t_uc * t_c + t_uc * (t_uc + 1.0) / 2.0
    return np.column_stack([np.ones_like(t_uc), t_uc, a])


def _decode_rows(
    rows: list[dict[str, Any]], prefill_coef: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per turn: features [t_out, t_out phi(B), t_out B, t_out ctx], decode time less the
    prefill work started inside its window, and B."""
    x_out, y_out, b_out = [], [], []
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    for rs in by_run.values():
        enter = np.array([r["llm_enter"] for r in rs])
        leave = np.array([r["llm_exit"] for r in rs])
        ctx = np.array([r["input_tokens"] for r in rs], dtype=float)
        work = _prefill_x(rs) @ prefill_coef
        for i, r in enumerate(rs):
            a = r["llm_enter"] + r["prefill_time_s"]
            b = r["llm_exit"]
            if b <= a or r["output_tokens"] < 1:
                continue
            overlap = np.clip(np.minimum(leave, b) - np.maximum(enter, a), 0.0, None) / (b - a)
            batch = float(overlap.sum())
            inside = (enter > a) & (enter < b)
            inside[i] = False
            t_out = float(r["output_tokens"])
            f = float(phi(batch, TOP_K, NUM_EXPERTS, 1.0))
            x_out.append([t_out, t_out * f, t_out * batch, t_out * float((overlap * ctx).sum())])
            y_out.append(r["decode_time_s"] - float(work[inside].sum()))
            b_out.append(batch)
    return np.array(x_out), np.array(y_out), np.array(b_out)


@lru_cache(maxsize=4)
def fit_sweagent_profile(path: str | None = None, kv_tokens: int = 4_000_000) -> SweagentFit:
    """Fit prefill on bs1 and decode on all runs (see module docstring)."""
    rows = load_turns(path)
    solo = [r for r in rows if r["run"] == "bs1"]
    if len(solo) < 10:
        raise ConfigError("the trace needs the bs1 run (isolated turns) to fit prefill")
    x = _prefill_x(solo)
    y = np.array([r["prefill_time_s"] for r in solo])
    pre, _ = nnls(x, y)
    mape = float(np.mean(np.abs(x @ pre - y) / y))
    xd, yd, bd = _decode_rows(rows, pre)
    runs = np.array([r["run"] for r in rows if _decodes(r)])
    # Aggregate into (run, B decile) bins: fit sums of decode time, not single turns.
    keys: list[str] = []
    for run in sorted(set(runs)):
        m = runs == run
        edges = np.unique(np.quantile(bd[m], np.linspace(0, 1, 11)))
        idx = np.clip(np.searchsorted(edges, bd[m], side="right") - 1, 0, len(edges) - 2)
        keys.extend(f"{run}:{k}" for k in idx)
    keys_arr = np.array(keys)
    bins = sorted(set(keys))
    xb = np.array([xd[keys_arr == k].sum(axis=0) for k in bins])
    yb = np.array([yd[keys_arr == k].sum() for k in bins])
    # Relative residuals: the single bs1 bin weighs as much as each bs32 bin.
    dec, _ = nnls(xb / yb[:, None], np.ones_like(yb))
    errors = {
        run: float((xd[runs == run] @ dec).sum() / yd[runs == run].sum() - 1.0)
        for run in sorted(set(runs))
    }
    profile = HardwareProfile(
        name="h200-glm45-fit",
        prefill=(float(pre[0]), float(pre[1]), float(pre[2]), 0.0),
        decode=(float(dec[0]), float(dec[1]), float(dec[2])),
        top_k=TOP_K,
        num_experts=NUM_EXPERTS,
        t_fwd=1.0,
        t_acc=1.0,
        decode_ctx_s_per_token=float(dec[3]),
        noise=0.0,
        l1_tokens=kv_tokens,
        l2_tokens=4 * kv_tokens,
        chunk_tokens=8192,
        block_tokens=256,  # the simulator's block granularity (vLLM uses 16; cost, not reuse)
        max_decode_batch=256,
        hardware="1x(8xH200 TP4xPP2) vLLM, GLM-4.5-FP8 (fitted to the SWE-agent trace)",
    )
    return SweagentFit(
        profile,
        (float(pre[0]), float(pre[1]), float(pre[2])),
        (float(dec[0]), float(dec[1]), float(dec[2])),
        float(dec[3]),
        mape,
        errors,
        len(rows),
    )


def _decodes(r: dict[str, Any]) -> bool:
    return r["llm_exit"] > r["llm_enter"] + r["prefill_time_s"] and r["output_tokens"] >= 1


def replay_config(run: str = "bs32", path: str | None = None, limit: int = 0, **kw: Any) -> Any:
    """The SimConfig replaying `run` at its recorded concurrency on one collocated node."""
    from cluster.sim.simulator import SimConfig

    if run not in RUN_AGENTS:
        raise ConfigError(f"run must be one of {sorted(RUN_AGENTS)}, got {run!r}")
    fit = fit_sweagent_profile(path)
    params: dict[str, Any] = dict(
        workload=str(trace_path(path)),
        workload_params={"run": run, "limit": limit, "cycle": False},
        nodes=1,
        split="collocated",
        agents=RUN_AGENTS[run],
        duration_s=20_000.0,
        warmup_s=0.0,
        planner="static",
        profile=fit.profile,
        stagger_s=2.0,  # the recorded runs start their first agents within ~2 s
        seed=0,
    )
    params.update(kw)
    return SimConfig(**params)


def replay_validation(
    run: str = "bs32", path: str | None = None, limit: int = 0, **kw: Any
) -> ReplayReport:
    """Replay `run` and compare simulated with recorded per-turn LLM times."""
    from cluster.sim.simulator import Simulator

    cfg = replay_config(run, path, limit, **kw)
    sim = Simulator(cfg)
    sim.run()
    recorded = {
        (f"{r['run']}/{r['instance']}", k): r["llm_time_s"]
        for k, r in _indexed(load_turns(path), run)
    }
    sim_t, real_t = [], []
    for req in sim.requests:
        if req.t_done is None:
            continue
        real = recorded.get((req.program, req.turn_index))
        if real is None or not real > 0:
            continue
        sim_t.append(req.t_done - req.t_arrival)
        real_t.append(real)
    if not sim_t:
        raise ConfigError(f"no completed turns to compare for run {run!r}")
    s, r = np.array(sim_t), np.array(real_t)
    rel = np.abs(s - r) / r
    return ReplayReport(
        run,
        len(s),
        float(s.mean()),
        float(r.mean()),
        float(s.mean() / r.mean() - 1.0),
        float(rel.mean()),
        float(np.percentile(rel, 99)),
        float(np.percentile(s, 99)),
        float(np.percentile(r, 99)),
        float(np.percentile(s, 99) / np.percentile(r, 99) - 1.0),
        float(sim.now),
    )


def _indexed(rows: list[dict[str, Any]], run: str) -> list[tuple[int, dict[str, Any]]]:
    """(turn index within its program, row) for the run's rows (rows are in step order)."""
    out = []
    last: str | None = None
    k = 0
    for r in rows:
        if r["run"] != run:
            continue
        k = k + 1 if r["instance"] == last else 0
        last = r["instance"]
        out.append((k, r))
    return out


def fit_summary(fit: SweagentFit) -> dict[str, Any]:
    """JSON-able description of a fit (for reports and the CLI)."""
    return {
        "prefill_c0_s": fit.prefill_coef[0],
        "prefill_c1_s_per_token": fit.prefill_coef[1],
        "prefill_c2_s_per_pair": fit.prefill_coef[2],
        "decode_d0_s": fit.decode_coef[0],
        "decode_d1_s": fit.decode_coef[1],
        "decode_d2_s": fit.decode_coef[2],
        "decode_ctx_s_per_token": fit.ctx_coef,
        "prefill_mape_bs1": fit.prefill_mape,
        "decode_sum_error": fit.decode_sum_error,
        "turns": fit.num_turns,
        "tpot_b1_ms": 1e3
        * (
            fit.decode_coef[0]
            + fit.decode_coef[1] * phi(1, TOP_K, NUM_EXPERTS, 1.0)
            + fit.decode_coef[2]
        ),
    }
