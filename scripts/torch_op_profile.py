"""Measure an operator profile of the torch engine on this machine and import it (issue 22).

Times the engine's own operators (cluster.engines.torch.op_profile: dense ops, paged
attention, the MoE experts of one EP rank, lm_head and sampler), its scheduler loop and,
with `--ep N`, one MoE layer's all-to-all between N processes — all in N processes at
once, as the group's ranks contend for the CPU (loop_profile.profile_group) — writes them
in LLMServingSim's bundle layout with the model's config.json, then runs `pdlab profile
import` on it with the measured link, so `pdlab twin DB --run R --profile OUT.json`
prices the group's iterations from the engine itself.

    python scripts/torch_op_profile.py -o profiles/torch_tiny_moe_ep2 --ep 2 --dp 2

`--calibrate DB RUN --from DIR` measures nothing: it calibrates the bundle DIR in situ on
a recorded group run (toolkit.profiles.torch_calibration: operator times scaled by the
run's measured / priced compute, the link fitted on its lockstep steps) into `-o` and
imports that ("fitted on run RUN" in the profile). Calibrate on a run kept for it; compare
the twin on other runs. `--import-only` imports the bundle `-o` as it is.

    python scripts/torch_op_profile.py -o toolkit/data/torch_ep_group/profile_calibrated \
        --calibrate runs.duckdb ep2-fit --from toolkit/data/torch_ep_group/profile
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("-o", "--out", type=Path, required=True, help="bundle directory")
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--calibrate", nargs=2, metavar=("DB", "RUN"), default=None)
    p.add_argument("--from", dest="src", type=Path, default=None, help="bundle to calibrate")
    p.add_argument("--import-only", action="store_true", help="import the bundle -o as it is")
    a = p.parse_args(argv)
    from cluster.engines.torch.config import preset
    from cluster.engines.torch.loop_profile import profile_group

    t0 = time.monotonic()
    if a.import_only:
        pass
    elif a.calibrate is not None:
        from toolkit.profiles.torch_calibration import calibrate

        if a.src is None:
            p.error("--calibrate needs --from BUNDLE (the measured profile directory)")
        doc = calibrate(a.src, a.calibrate[0], a.calibrate[1], a.out)
        print(json.dumps(doc, indent=1), file=sys.stderr)
    else:
        print(f"measuring in {a.ep} process(es) at once ...", file=sys.stderr)
        profile_group(preset(a.model), a.out, a.ep, threads=a.threads, reps=a.reps)
    link = json.loads((a.out / "link.json").read_text())
    out_json = a.out.with_suffix(".json")
    cmd = [sys.executable, "-m", "toolkit.cli", "profile", "import", str(a.out),
           "--model-config", str(a.out / "config.json"), "-o", str(out_json),
           "--dp", str(a.dp), "--ep", str(a.ep), "--link-gbps", f"{link['link_gbps']:.6g}",
           "--link-latency-us", f"{link['link_latency_s'] * 1e6:.6g}",
           "--max-num-seqs", str(a.max_num_seqs),
           "--max-num-batched-tokens", str(a.max_num_batched_tokens),
           "--hardware", f"cpu, {a.threads} torch thread(s) per rank", "--name", a.out.name]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f"{a.out} and {out_json} in {time.monotonic() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
