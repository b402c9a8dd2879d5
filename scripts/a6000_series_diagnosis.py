"""Where a cluster twin's per-tick throughput leaves the real series (issue 22).

    python scripts/a6000_series_diagnosis.py DB RUN [RUN ...]

DB holds runs imported with `pdlab import lss-run` and a throughput reference
(scripts/a6000_figures.sh makes one). For each run the twin is replayed once
(toolkit.twin.lss) and its series is split, as the real series runs, into phases: ramp
(ticks 1-5), arrivals (prefills interleaved with decodes, to the last arrival), decode
(arrivals over, until the real series falls below half its peak) and tail (the last
requests). Per phase: tokens twin / real (and LLMServingSim / real), and the phase's share
of the run's per-tick MAPE. Then the MAPE with the twin's tokens binned at a tick phase
shifted by -0.9..+0.9 s (the real series is vLLM's 1 s log, whose phase to the first
arrival is not recorded), and the tail's small-batch step: the real series' last full ticks
bound the real step time from below (one request at most ~ 1 / tokens per tick s), next to
the twin's mean step with one and two requests running.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.queries.run import open_run
from toolkit.twin.lss import load_cluster_inputs, replay_cluster_run
from toolkit.validate.cluster import _arrays
from toolkit.validate.series import throughput_ticks, tick_mape


def _fit(a: np.ndarray, n: int) -> np.ndarray:
    return np.pad(a, (0, max(0, n - len(a))))[:n]


def diagnose(db: str, run: str) -> None:
    with open_run(db, run) as r:
        refs = r.df(
            "SELECT source, scope, node_id, metric, t, value FROM reference_series "
            "WHERE run_id = ? ORDER BY t",
            [r.run_id],
        )
    thr = _arrays(refs, "throughput_tok_s", None)
    real = np.nan_to_num(thr["real"])
    n = len(real)
    peer = _fit(np.nan_to_num(thr.get("LLMServingSim", np.zeros(n))), n)
    rep = replay_cluster_run(load_cluster_inputs(db, run))
    origin = min(q.arrival_s for q in rep.requests)
    twin = _fit(throughput_ticks(rep, origin, n + 5), n)
    last_arrival = int(np.ceil(max(q.arrival_s for q in rep.requests) - origin))
    drain = last_arrival + int(np.argmax(real[last_arrival:] < 0.5 * real.max()))
    phases = {
        "ramp": (1, 6), "arrivals": (6, last_arrival + 1),
        "decode": (last_arrival + 1, drain + 1), "tail": (drain + 1, n),
    }  # fmt: skip
    ticks = int(np.sum(real > 0))
    print(f"{run}: per-tick MAPE twin {tick_mape(real, twin):.3f}, LLMServingSim "
          f"{tick_mape(real, peer):.3f}")  # fmt: skip
    for name, (a, b) in phases.items():
        r, t, p = real[a:b], twin[a:b], peer[a:b]
        k = r > 0
        share_t = np.sum(np.abs(t[k] - r[k]) / r[k]) / ticks
        share_p = np.sum(np.abs(p[k] - r[k]) / r[k]) / ticks
        print(f"  {name:8s} ticks {a}-{b - 1}: tokens twin/real {t.sum() / r.sum():.3f} "
              f"(LLMServingSim {p.sum() / r.sum():.3f}); MAPE share twin {share_t:.3f}, "
              f"LLMServingSim {share_p:.3f}")  # fmt: skip
    toks = [(t - origin, k) for tr in rep.instances if tr.role != "prefill" for t, k in tr.tokens]
    tt, kk = np.array([x[0] for x in toks]), np.array([x[1] for x in toks], float)
    shifted = []
    for phi in np.round(np.arange(-0.9, 0.95, 0.3), 1):
        s = np.zeros(n + 5)
        idx = np.minimum(np.maximum(np.ceil(tt - phi - 1e-12), 0).astype(int), n + 4)
        np.add.at(s, idx, kk)
        shifted.append(f"{phi:+.1f} s: {tick_mape(real, s[:n]):.3f}")
    print("  MAPE with the twin's ticks shifted by " + ", ".join(shifted))
    full = real[np.nonzero(real > 0)[0][-3:-1]]  # the last tick is partial
    steps = []
    for tr in rep.instances:
        if tr.role == "prefill" or len(tr.state) < 2:
            continue
        st = np.array([(s[0], s[1]) for s in tr.state])
        dt = np.diff(st[:, 0])
        for running in (1, 2):
            m = st[1:, 1] == running
            if m.any():
                steps.append(f"{running} running {1e3 * np.median(dt[m]):.1f} ms")
    print(f"  tail: real last full ticks {full.tolist()} tok/s -> real step >= "
          f"{1e3 / full.max():.1f} ms at one request; twin step " + ", ".join(steps))  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for name in sys.argv[2:]:
        diagnose(sys.argv[1], name)
