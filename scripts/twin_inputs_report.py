"""The twin's inputs, checked against real data: a notebook-free analysis (SPEC §9).

    python scripts/twin_inputs_report.py [--data ../shared/data] [--fit-db pdlab.duckdb]

Prints, as Markdown tables:
1. each LLMServingSim operator profile's held-out MAPE per phase, paper form vs the form
   chosen by cross-validation (cluster.hardware.operator_profile);
2. the TP 1 bundle scaled to TP 2 against the bundle measured at TP 2;
3. the real vLLM runs' TTFT/TPOT/E2E read back from an imported database, beside the vLLM
   column of LLMServingSim's validation table;
4. KV capacity from GPU memory against the blocks vLLM allocated;
5. decode iteration times the engines achieved (1-s ticks of timeseries.csv without prefill:
   decoding requests / generated tokens per second) against the profile's price of the same
   batch (contexts from the requests' timestamps), and the gap as a + b * B;
6. with --fit-db (the README's main job), each decode node's d2 with row-hash intervals
   (Eq. 2) and with time-window intervals of the form chosen by cross-validation.
"""

from __future__ import annotations

import argparse
import csv
import re
import tempfile
from pathlib import Path

import numpy as np

from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import build_profile
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.queries.serving import serving_metrics

PROFILES = [
    ("llmservingsim_rtx4090_llama31_8b", "meta-llama/Llama-3.1-8B", 1),
    ("llmservingsim_rtxpro6000_qwen3_32b", "Qwen/Qwen3-32B", 1),
    ("llmservingsim_rtxpro6000_qwen3_32b/tp2", "Qwen/Qwen3-32B", 2),
    ("llmservingsim_rtxpro6000_qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B-Instruct-2507", 1),
]
RUNS = [
    ("rtx4090_llama31_8b_vllm", "llmservingsim_rtx4090_llama31_8b", "meta-llama/Llama-3.1-8B", 1),
    ("rtxpro6000_qwen3_32b_vllm", "llmservingsim_rtxpro6000_qwen3_32b/tp2", "Qwen/Qwen3-32B", 2),
]


def forms_table(data: Path) -> None:
    print("| profile | phase | points | paper MAPE | chosen form | chosen MAPE |")
    print("|---|---|---:|---:|---|---:|")
    for prof, model, tp in PROFILES:
        p = build_profile(
            data / "profiles" / prof, ModelShape.load(data / f"models/{model}.json"), tp=tp
        )
        for phase, f in p.fits.items():
            print(
                f"| {prof.removeprefix('llmservingsim_')} | {phase} | {f.points} | "
                f"{100 * f.paper.mape:.2f}% | {f.chosen} | {100 * f.best.mape:.2f}% |"
            )


def tp_scaling(data: Path) -> None:
    shape = ModelShape.load(data / "models/Qwen/Qwen3-32B.json")
    par = Parallelism(tp=2, link_gbps=1e12, link_latency_s=0.0)
    base = data / "profiles/llmservingsim_rtxpro6000_qwen3_32b"
    scaled = IterationPricer(OperatorTables.load(base, tp=2), shape, par)
    measured = IterationPricer(OperatorTables.load(base / "tp2", profiled_tp=2), shape, par)
    a = measured.tables.attention
    print("| phase | points | MAPE | bias | worst |")
    print("|---|---:|---:|---:|---:|")
    for phase, keep in (
        ("prefill", (a[:, 0] > 0) & (a[:, 2] == 0)),
        ("decode", (a[:, 0] == 0) & (a[:, 2] > 0)),
        ("mixed", (a[:, 0] > 0) & (a[:, 2] > 0) & (a[:, 0] + a[:, 2] <= 2048)),
    ):
        e = np.array(
            [
                scaled.time(*b) / measured.time(*b) - 1
                for b in (
                    ([(int(r[0]), int(r[1]))] if r[0] else [], [int(r[3])] * int(r[2]))
                    for r in a[keep]
                )
            ]
        )
        print(
            f"| {phase} | {len(e)} | {100 * np.mean(np.abs(e)):.2f}% | {100 * e.mean():+.2f}% | {100 * np.abs(e).max():.1f}% |"
        )


def _validation(path: Path) -> dict[str, float]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([\d.]+)", line)
        if m:
            out[f"{m[1]} {m[2]}"] = float(m[3])
    return out


def imported_metrics(data: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.duckdb"
        runs = [read_vllm_bench(data / "real_runs" / r) for r, *_ in RUNS]
        write_runs(db, runs)
        print("| run | metric | imported mean / P50 / P90 / P99 (ms) | vLLM column (ms) |")
        print("|---|---|---|---|")
        for run, (name, *_) in zip(runs, RUNS, strict=True):
            m = serving_metrics(db, run.run_id)
            want = _validation(data / "real_runs" / name / "llmservingsim_validation.txt")
            for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "Latency")):
                got = " / ".join(
                    f"{1000 * m.stats[metric][s]:.1f}" for s in ("mean", "p50", "p90", "p99")
                )
                ref = " / ".join(
                    f"{want[f'{label} {s}']:.1f}" for s in ("Mean", "Median", "P90", "P99")
                )
                print(f"| {name} | {metric.upper()} | {got} | {ref} |")


def kv_capacity(data: Path) -> None:
    run = read_vllm_bench(data / "real_runs/rtx4090_llama31_8b_vllm")
    e = EngineSettings.from_json(run.config["engine"])
    shape = ModelShape.load(data / "models/meta-llama/Llama-3.1-8B.json")
    rec = e.kv_capacity(shape)
    est = EngineSettings.from_json({**e.to_json(), "num_gpu_blocks": None}).kv_capacity(shape)
    print(
        f"RTX 4090 Llama-3.1-8B: recorded {rec.blocks} blocks ({rec.tokens} tokens); from GPU memory "
        f"{est.blocks} blocks ({100 * (est.blocks / rec.blocks - 1):+.1f}%), reserve "
        f"{e.non_kv_reserve_bytes(shape) / 2**30:.2f} GiB, weights {e.weight_bytes(shape) / 2**30:.2f} GiB"
    )


def decode_gap(data: Path) -> None:
    print("| run | pure-decode ticks | batch | achieved ms | profile ms | achieved/profile |")
    print("|---|---:|---|---:|---:|---:|")
    fits = []
    for name, prof, model, tp in RUNS:
        shape = ModelShape.load(data / f"models/{model}.json")
        tables = OperatorTables.load(data / "profiles" / prof, profiled_tp=tp)
        pricer = IterationPricer(
            tables, shape, Parallelism(tp=tp, link_gbps=1e12, link_latency_s=0.0)
        )
        run = read_vllm_bench(data / "real_runs" / name)
        q = {
            k: np.asarray(v, dtype=float)
            for k, v in run.requests.items()
            if k in ("t_first_token", "t_done", "t_in", "t_out")
        }
        rows = []
        for tick in csv.DictReader((data / "real_runs" / name / "timeseries.csv").open()):
            g, pr = float(tick["gen_throughput"]), float(tick["prompt_throughput"])
            tm = float(tick["t"]) - 0.5
            dec = (q["t_first_token"] <= tm) & (q["t_done"] >= tm)
            if pr > 0 or g <= 0 or dec.sum() < 4:
                continue
            frac = (tm - q["t_first_token"][dec]) / (q["t_done"][dec] - q["t_first_token"][dec])
            ctx = q["t_in"][dec] + frac * q["t_out"][dec]
            rows.append((dec.sum(), dec.sum() / g, pricer.time([], [int(c) for c in ctx])))
        a = np.asarray(rows, dtype=float)
        for lo, hi in ((0, 16), (16, 40), (40, 80), (80, 1000)):
            m = (a[:, 0] >= lo) & (a[:, 0] < hi)
            if m.any():
                print(
                    f"| {name} | {int(m.sum())} | {lo}-{min(hi, 256) - 1} | {1000 * np.median(a[m, 1]):.1f} | "
                    f"{1000 * np.median(a[m, 2]):.1f} | {np.median(a[m, 1] / a[m, 2]):.3f} |"
                )
        x = np.column_stack([np.ones(len(a)), a[:, 0]])
        coef = np.linalg.lstsq(x, a[:, 1] - a[:, 2], rcond=None)[0]
        fits.append(
            f"{name}: achieved - profile = {1000 * coef[0]:.2f} ms + {1000 * coef[1]:.3f} ms x B"
        )
    print()
    for line in fits:
        print(line)


def nine_nodes(db: Path) -> None:
    from toolkit.fit.forms import fit_run_forms
    from toolkit.fit.run import fit_run

    rows = fit_run(db)
    auto = fit_run_forms(db, form="auto", ci="time")
    print("| node | Eq. 2 d2 [row-hash 95%] | chosen form | d2 [time-window 95%] | d3 |")
    print("|---:|---|---|---|---|")
    for a, b in zip(rows.nodes, auto.nodes, strict=True):
        if not (a.decode.ok and b.decode.ok and a.decode.ci and b.decode.ci):
            continue
        d3 = f"{b.decode.coef[3]:.3e}" if len(b.decode.coef) > 3 else "-"
        print(
            f"| {a.node_id} | {a.decode.coef[2]:.3e} [{a.decode.ci[2][0]:.3e}, {a.decode.ci[2][1]:.3e}] | "
            f"{b.decode.form} | {b.decode.coef[2]:.3e} [{b.decode.ci[2][0]:.3e}, {b.decode.ci[2][1]:.3e}] | {d3} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
    ap.add_argument("--fit-db", type=Path, default=None)
    args = ap.parse_args()
    for title, fn in (
        ("Operator profiles: held-out MAPE, paper vs chosen form", forms_table),
        ("TP 1 profile scaled to TP 2 vs measured TP 2 (no communication)", tp_scaling),
        ("Imported real runs vs LLMServingSim's vLLM column", imported_metrics),
        ("KV capacity from GPU memory", kv_capacity),
        ("Decode iterations achieved vs the profile's price", decode_gap),
    ):
        print(f"\n## {title}\n")
        fn(args.data)
    if args.fit_db is not None:
        print("\n## Decode d2 of each node of the main job\n")
        nine_nodes(args.fit_db)


if __name__ == "__main__":
    main()
