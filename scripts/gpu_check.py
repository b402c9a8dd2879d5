"""GPU check: two real SGLang engines (prefill + decode) under pdlab's live control plane.

Run on a machine with NVIDIA GPUs and SGLang installed (`pip install 'pdlab[sglang]'`); it is
not part of CI. It launches

    python -m sglang.launch_server --model-path MODEL --disaggregation-mode prefill|decode
        --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:P", ...}'
        --enable-forward-pass-metrics --enable-pd-role-switch --page-size 16 ...

then pdlab's `SGLangCluster` over them (collectors, directory, the PD proxy), plays a short
agent workload from `cluster.workloads` through the proxy (token-id requests with branch
headers: appends, forks, sub-agents, compaction, branch finishes), stops, and fits the
logged iterations with `pdlab fit`'s code. It prints one JSON summary and exits 0 when every
turn succeeded, the KV directory saw the prefill engine's blocks, prefix reuse happened and
both fits converged; 1 otherwise; 2 when SGLang or a GPU is missing (with the reason).

    python scripts/gpu_check.py --model Qwen/Qwen2.5-0.5B-Instruct --db gpu_check.duckdb

Both engines may share one GPU (`--gpus 0,0`, each with `--mem-fraction-static 0.35`).
The KV transfer backend defaults to mooncake_tcp (no RDMA needed on one host).
`--standin` runs the same check on CPU against the SGLang stand-in (no GPU, no SGLang).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fail(code: int, message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr)
    sys.exit(code)


def preflight() -> None:
    if importlib.util.find_spec("sglang") is None:
        fail(2, "sglang is not installed: pip install 'pdlab[sglang]' (sglang==0.5.23)")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        fail(2, "no NVIDIA driver (nvidia-smi not found): this check needs NVIDIA GPUs")
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or "GPU" not in out.stdout:
        fail(2, f"nvidia-smi lists no GPU: {(out.stdout + out.stderr).strip()[:300]}")


def launch(
    role: str, a: argparse.Namespace, gpu: int, port: int, kv_port: int, boot: int, logdir: Path
) -> subprocess.Popen[bytes]:
    kv = {
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{kv_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{kv_port + 1}",
        "bind": True,
        "topic": "",
    }
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", a.model,
        "--host", "127.0.0.1", "--port", str(port),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", a.transfer_backend,
        "--disaggregation-bootstrap-port", str(boot),
        "--kv-events-config", json.dumps(kv),
        "--enable-forward-pass-metrics",
        "--enable-pd-role-switch",
        "--enable-cache-report",
        "--page-size", str(a.page_size),
        "--mem-fraction-static", str(a.mem_fraction_static),
        "--base-gpu-id", str(gpu),
        *a.extra_args,
    ]  # fmt: skip
    if a.standin:  # dry run on CPU: the SGLang stand-in with the same endpoints
        cmd = [
            sys.executable, "-m", "cluster.sglang.standin", "--role", role, "--port", str(port),
            "--kv-events-endpoint", kv["endpoint"], "--kv-replay-endpoint", kv["replay_endpoint"],
            "--bootstrap-port", str(boot), "--page-size", str(a.page_size),
            "--enable-pd-role-switch",
        ]  # fmt: skip
    log = open(logdir / f"{role}.log", "wb")  # noqa: SIM115 - the child writes it
    print(f"gpu_check: launching {role}: {' '.join(cmd)}", file=sys.stderr)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            fail(1, f"engine {url} exited with {proc.returncode}; log tail:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    fail(1, f"engine {url} not healthy within {timeout_s:.0f} s (log {log})")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def run(a: argparse.Namespace) -> dict[str, Any]:
    from cluster.sglang.agent_client import TokenMap, play_programs
    from cluster.sglang.backend import SGLangCluster
    from cluster.sglang.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
    from cluster.sglang.serving import ServerThread, create_sglang_app
    from cluster.workloads import make_workload
    from telemetry import open_reader
    from toolkit.fitting import fit_run

    gpus = [int(g) for g in a.gpus.split(",")]
    if len(gpus) != 2:
        fail(2, f"--gpus needs two ids (prefill,decode), got {a.gpus!r}")
    logdir = Path(tempfile.mkdtemp(prefix="pdlab-gpu-check-"))
    ports = {"prefill": a.base_port, "decode": a.base_port + 1}
    procs = [
        launch(
            role, a, gpus[i], ports[role], a.base_port + 10 + 10 * i, a.base_port + 90 + i, logdir
        )
        for i, role in enumerate(("prefill", "decode"))
    ]
    try:
        urls = {role: f"http://127.0.0.1:{p}" for role, p in ports.items()}
        for (role, url), proc in zip(urls.items(), procs, strict=True):
            wait_ready(url, proc, logdir / f"{role}.log", a.startup_timeout_s)
        cfg = ClusterConfig(
            (EngineSpec(node_id=0, http_url=urls["prefill"]),
             EngineSpec(node_id=1, http_url=urls["decode"])),
            ClusterSettings(
                tokenizer="engine",
                hardware=a.hardware,
                moe_top_k=a.moe_top_k,
                moe_experts=a.moe_experts,
                request_timeout_s=a.request_timeout_s,
            ),
        )  # fmt: skip
        db = Path(a.db)
        cluster = SGLangCluster(cfg, db_path=db)
        src = make_workload(a.workload, seed=a.seed)
        programs = [src.next_program(0.0) for _ in range(a.programs)]
        tokens = TokenMap(vocab_lo=1000, vocab_hi=a.vocab_hi, token_scale=a.token_scale)
        t0 = time.monotonic()
        with ServerThread(create_sglang_app(cluster, "gpu-check")) as server:
            results = asyncio.run(
                play_programs(server.url, programs, tokens, max_output_tokens=a.max_output_tokens)
            )
            with cluster.lock:
                blocks_seen = cluster.cp.directory.stats()["events"]
                state = cluster.cluster()
        wall = time.monotonic() - t0
        summary = cluster.summary or {}
        reader = open_reader(db)
        req = reader.table("requests").filter(reader.table("requests")["run_id"] == cluster.run_id)
        fit = fit_run(db, run_id=cluster.run_id, bootstrap=0)
        fits = {
            n.node_id: {
                phase: {
                    "coef": getattr(n, phase).coef,
                    "mape": getattr(n, phase).mape,
                    "samples": getattr(n, phase).samples,
                    "message": getattr(n, phase).message,
                }
                for phase in ("prefill", "decode")
            }
            for n in fit.nodes
        }
        ok_turns = sum(r.status == 200 for r in results)
        out = {
            "run_id": cluster.run_id,
            "db": str(db),
            "model": a.model,
            "workload": a.workload,
            "turns": len(results),
            "turns_ok": ok_turns,
            "wall_s": round(wall, 1),
            "kv_events_applied": blocks_seen,
            "requests_with_cached_prefix": int((req["t_c"] > 0).sum()) if req.height else 0,
            "mean_ttft_s": state["latency"]["ttft_mean_s"],
            "summary": summary,
            "fits": fits,
            "engine_logs": str(logdir),
        }
        problems = []
        if ok_turns != len(results):
            errs = [r.error for r in results if r.status != 200][:3]
            problems.append(f"{len(results) - ok_turns} turns failed: {errs}")
        if not blocks_seen:
            problems.append("no KV events reached the directory")
        if not out["requests_with_cached_prefix"]:
            problems.append("no request found its prefix cached")
        if fits.get(0, {}).get("prefill", {}).get("coef") is None:
            problems.append(f"prefill fit failed: {fits.get(0, {}).get('prefill')}")
        if fits.get(1, {}).get("decode", {}).get("coef") is None:
            problems.append(f"decode fit failed: {fits.get(1, {}).get('decode')}")
        out["problems"] = problems
        return out
    finally:
        stop(procs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    p.add_argument("--gpus", default="0,0", help="GPU ids of the prefill and decode engines")
    p.add_argument("--base-port", type=int, default=31000)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--mem-fraction-static", type=float, default=0.35)
    p.add_argument("--transfer-backend", default="mooncake_tcp",
                   help="mooncake | mooncake_tcp | nixl | ... (SGLang's choices)")  # fmt: skip
    p.add_argument("--workload", default="cc", help="putnam | cc | osworld | shift")
    p.add_argument("--programs", type=int, default=3)
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--token-scale", type=float, default=0.05)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--vocab-hi", type=int, default=30_000, help="token ids drawn below this")
    p.add_argument("--hardware", default="unknown")
    p.add_argument("--moe-top-k", type=int, default=0, help="0 with --moe-experts 0: dense")
    p.add_argument("--moe-experts", type=int, default=0)
    p.add_argument("--db", default="gpu_check.duckdb")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("extra_args", nargs="*", help="more sglang.launch_server args (after --)")
    p.add_argument(
        "--standin",
        action="store_true",
        help="dry run on CPU: launch SGLang stand-ins instead of SGLang (checks this script)",
    )
    a = p.parse_args(argv)
    if not a.standin:
        preflight()
    out = run(a)
    print(json.dumps(out, indent=2, default=str))
    sys.exit(1 if out["problems"] else 0)


if __name__ == "__main__":
    main()
