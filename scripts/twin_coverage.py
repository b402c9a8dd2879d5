"""Coverage of the twin's 95% intervals on every real run we have: is the real value inside?

    python scripts/twin_coverage.py [--data ../shared/data] [--db runs.duckdb] [--json]

Imports into one database (`--db`, else a scratch one) every real run of the data
directory: each `real_runs/<run>/` benchmark run with its operator profile
(`profiles/llmservingsim_<run without _vllm>`, its `tp<N>/` bundle when the run served TP N)
and model config (`models/<meta.json model>.json`), and the six A6000 setups of
`lss_ispass26_a6000/` (toolkit.samples.lss_a6000); then runs `pdlab validate` on it (toolkit.validate.run.
validate_runs, the same call) and prints, per run and relative metric (mean TTFT, TPOT,
E2E where the run has them; span and output-token throughput; mean KV in use): real, twin,
error, the 95% interval of the error, covered, the half-width; each source's share (its
(down, up) in % of the metric); then the count covered of the rows with a known interval,
the rows whose interval is "not known", and the median half-width of the known ones; and
the per-tick rows with the share of ticks inside the twin's band. Markdown by default,
`--json` for one object. The command it equals is printed with `--db`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cluster.hardware.model_shape import ModelShape  # noqa: E402
from cluster.hardware.operator_profile import build_profile  # noqa: E402
from toolkit.importers import read_vllm_bench, write_runs  # noqa: E402
from toolkit.samples.lss_a6000 import import_lss_a6000  # noqa: E402
from toolkit.validate.run import validate_runs  # noqa: E402

HEADLINE = ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "span_s", "throughput_tok_s")


def _bench_runs(data: Path) -> tuple[list[tuple[Path, Path, Path, int]], list[str]]:
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


def import_all(data: Path, db: Path, work: Path) -> tuple[dict[str, Path], list[str]]:
    """Import every real run into `db`; the benchmark runs' profiles are written to `work`."""
    runs, skipped = _bench_runs(data)
    profiles = {}
    for run_dir, prof_dir, model, tp in runs:
        run = read_vllm_bench(run_dir, run_id=run_dir.name, model_config=model)
        write_runs(db, [run], replace=True)
        measured = int(prof_dir.name[2:]) if prof_dir.name.startswith("tp") else 1
        prof = build_profile(prof_dir, ModelShape.load(model), tp=tp, profiled_tp=measured)
        path = work / f"{run.run_id}.profile.json"
        path.write_text(json.dumps(prof.to_json()))
        profiles[run.run_id] = path
    lss = data / "lss_ispass26_a6000"
    if lss.is_dir():
        import_lss_a6000(db, lss, replace=True)
    else:
        skipped.append(f"{lss}: not found")
    return profiles, skipped


def coverage(db: Path, profiles: dict[str, Path], skipped: list[str]) -> dict[str, Any]:
    table = validate_runs(db, profiles={k: str(v) for k, v in profiles.items()})
    rows = [r.to_json() for r in table.rows]
    relative = [r for r in rows if r["kind"] == "relative"]
    head = [r for r in relative if r["metric"] in HEADLINE]

    def count(sel: list[dict[str, Any]]) -> dict[str, Any]:
        known = [r for r in sel if r["known"]]
        return {
            "rows": len(sel),
            "covered": sum(r["covered"] for r in sel),
            "not_known": len(sel) - len(known),
            "median_half_width": float(np.median([r["half_width"] for r in known]))
            if known
            else None,
        }

    return {
        "rows": rows,
        "headline": count(head),
        "relative": count(relative),
        "skipped": skipped + [f"{r}: {w}" for r, w in table.skipped],
    }


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "not known"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def _markdown(doc: dict[str, Any]) -> str:
    rel = [r for r in doc["rows"] if r["kind"] == "relative"]
    out = [
        "| run | metric | real | twin | error | 95% interval of the error | covered | half-width |",
        "|---|---|---:|---:|---:|---|---|---:|",
    ]
    for r in rel:
        lo, hi = r["ci95"]
        ci = f"[{_pct(lo)}, {_pct(hi)}]" if r["known"] else "not known"
        cov = "yes" if r["covered"] else ("not known" if not r["known"] else "**no**")
        out.append(
            f"| {r['run']} | {r['metric']} | {r['real']:.4g} | {r['twin']:.4g} | "
            f"{_pct(r['error'])} | {ci} | {cov} | {_pct(r['half_width'], False)} |"
        )
    for name, c in (
        ("TTFT/TPOT/E2E, span, throughput", doc["headline"]),
        ("every relative row", doc["relative"]),
    ):
        out.append("")
        out.append(
            f"{name}: covered {c['covered']} of {c['rows']} ({c['not_known']} not known); "
            f"median half-width of the known {_pct(c['median_half_width'], False)}"
        )
    names: list[str] = []
    for r in rel:
        names += [s for s in r["sources"] or {} if s not in names]
    out += ["", "each source's (down / up) in % of the metric (log spread x 100):", ""]
    out.append("| run | metric | " + " | ".join(names) + " |")
    out.append("|---|---|" + "---|" * len(names))
    for r in rel:
        cells = []
        for s in names:
            v = (r["sources"] or {}).get(s)
            if v is None:
                cells.append("-")
                continue
            d, u = v
            cells.append(
                "not known" if d is None or u is None else f"-{100 * d:.1f} / +{100 * u:.1f}"
            )
        out.append(f"| {r['run']} | {r['metric']} | " + " | ".join(cells) + " |")
    out += ["", "per-tick rows: error, and the share of ticks inside the twin's 95% band:", ""]
    out.append("| run | metric | error | ticks in band | covered (>= 95%) |")
    out.append("|---|---|---:|---:|---|")
    for r in doc["rows"]:
        if r["kind"] == "relative":
            continue
        e = f"{r['error']:.2f} pt" if r["kind"] == "points" else _pct(r["error"], False)
        t = "not known" if r["ticks_covered"] is None else _pct(r["ticks_covered"], False)
        out.append(
            f"| {r['run']} | {r['metric']} | {e} | {t} | {'yes' if r['covered'] else 'no'} |"
        )
    out += [f"skipped: {s}" for s in doc["skipped"]]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--db", type=Path, default=None, help="Keep the database here.")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.duckdb"
        work = db.parent if args.db else Path(tmp)
        profiles, skipped = import_all(args.data, db, work)
        doc = coverage(db, profiles, skipped)
        if args.db:
            cmd = " ".join(
                ["pdlab validate", str(db), *(f"--profile {k}={v}" for k, v in profiles.items())]
            )
            doc["command"] = cmd
    print(
        json.dumps(doc)
        if args.json
        else _markdown(doc) + (f"\n\n`{doc['command']}`" if args.db else "")
    )


if __name__ == "__main__":
    main()
