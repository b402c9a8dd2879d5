"""Coverage of the twin's 95% intervals on the real runs: is the real value inside?

    python scripts/twin_coverage.py [--data ../shared/data] [--json]

For every run directory under `<data>/real_runs/` with a matching operator profile
(`<data>/profiles/llmservingsim_<run without _vllm>`, its `tp<N>/` bundle when the run
served TP N) and model config (`<data>/models/<meta.json model>.json`), imports the run
and the profile into a scratch database, runs `pdlab twin` (toolkit.twin.run_twin) and
prints per run and metric (mean TTFT, TPOT, E2E): real, twin, error, the 95% interval of
the error, whether it holds 0 (the real value), the interval's half-width in % of the real
value, and what each source adds; then the count covered and the median half-width.
Runs without a profile are listed as skipped. Markdown by default, `--json` for one object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cluster.hardware.model_shape import ModelShape  # noqa: E402
from cluster.hardware.operator_profile import build_profile  # noqa: E402
from toolkit.importers import read_vllm_bench, write_runs  # noqa: E402
from toolkit.twin import run_twin  # noqa: E402

MEANS = ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s")


def _pairs(data: Path) -> tuple[list[tuple[Path, Path, Path, int]], list[str]]:
    found, skipped = [], []
    for run in sorted((data / "real_runs").iterdir()):
        meta = json.loads((run / "meta.json").read_text())
        tp = int(meta.get("engine_kwargs", {}).get("tensor_parallel_size") or 1)
        prof = data / "profiles" / ("llmservingsim_" + run.name.removesuffix("_vllm"))
        if (prof / f"tp{tp}").is_dir():
            prof = prof / f"tp{tp}"
        model = data / "models" / f"{meta.get('model', '')}.json"
        if not (prof / "dense.csv").is_file() or not model.is_file():
            skipped.append(f"{run.name}: no profile {prof.name} or model config")
            continue
        found.append((run, prof, model, tp))
    return found, skipped


def coverage(data: Path) -> dict[str, object]:
    pairs, skipped = _pairs(data)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.duckdb"
        for run_dir, prof_dir, model, tp in pairs:
            run = read_vllm_bench(run_dir, model_config=model)
            write_runs(db, [run])
            shape = ModelShape.load(model)
            measured = int(prof_dir.name[2:]) if prof_dir.name.startswith("tp") else 1
            prof = build_profile(prof_dir, shape, tp=tp, profiled_tp=measured)
            path = Path(tmp) / f"{run.run_id}.json"
            path.write_text(json.dumps(prof.to_json()))
            t0 = time.perf_counter()
            res = run_twin(db, run.run_id, path, store=False)
            wall = time.perf_counter() - t0
            for k in MEANS:
                m = res.metrics[k]
                rows.append(
                    {
                        "run": run.run_id,
                        "metric": k,
                        "real": m.real,
                        "twin": m.sim,
                        "error": m.error,
                        "ci95": list(m.ci95),
                        "covered": m.covered,
                        "half_width": m.half_width,
                        "sources": m.sources,
                        "wall_s": wall,
                        "extrapolating": res.inputs.guards.extrapolating
                        if res.inputs.guards
                        else [],
                    }
                )
    covered = sum(r["covered"] for r in rows)
    return {
        "rows": rows,
        "covered": covered,
        "total": len(rows),
        "median_half_width": float(np.median([r["half_width"] for r in rows])) if rows else None,
        "skipped": skipped,
    }


def _markdown(doc: dict[str, object]) -> str:
    out = [
        "| run | metric | real | twin | error | 95% interval of the error | covered | half-width |",
        "|---|---|---:|---:|---:|---|---|---:|",
    ]
    for r in doc["rows"]:  # type: ignore[attr-defined]
        lo, hi = r["ci95"]
        out.append(
            f"| {r['run']} | {r['metric']} | {r['real']:.4g} | {r['twin']:.4g} | "
            f"{100 * r['error']:+.1f}% | [{100 * lo:+.1f}%, {100 * hi:+.1f}%] | "
            f"{'yes' if r['covered'] else 'no'} | {100 * r['half_width']:.1f}% |"
        )
    out.append("")
    out.append(
        f"covered {doc['covered']} of {doc['total']}; median half-width "
        f"{100 * doc['median_half_width']:.1f}%"  # type: ignore[operator]
    )
    out.append("")
    out.append("| run | metric | " + " | ".join(_sources(doc)) + " |")
    out.append("|---|---|" + "---|" * len(_sources(doc)))
    for r in doc["rows"]:  # type: ignore[attr-defined]
        cells = []
        for s in _sources(doc):
            if s not in r["sources"]:
                cells.append("-")  # the run has no such parameter (exact, or none)
                continue
            d, u = r["sources"][s]
            cells.append(f"-{100 * d:.1f} / +{100 * u:.1f}")
        out.append(f"| {r['run']} | {r['metric']} | " + " | ".join(cells) + " |")
    for s in doc["skipped"]:  # type: ignore[attr-defined]
        out.append(f"skipped: {s}")
    return "\n".join(out)


def _sources(doc: dict[str, object]) -> list[str]:
    names: list[str] = []
    for r in doc["rows"]:  # type: ignore[attr-defined]
        for s in r["sources"]:
            if s not in names:
                names.append(s)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    doc = coverage(args.data)
    print(json.dumps(doc) if args.json else _markdown(doc))


if __name__ == "__main__":
    main()
