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

`--engines torch --device cuda` runs the live torch cluster of `pdlab serve --engines torch`
on the GPU instead (`--preset`, `--nodes`, `--split`; no SGLang needed): the engines serve
cc agents for `--duration` seconds, a decode node with KV is switched to prefill through the
REST API midway (it must keep its KV: 0 lost blocks), and the logged iterations are fitted
(held-out MAPE per node and phase, measured vs modelled phi(B)). It exits 2 without CUDA;
`--device cpu` runs the same check on this machine's CPU.

    python scripts/gpu_check.py --engines torch --device cuda --preset small-moe
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
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fail(code: int, message: str) -> NoReturn:
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
            sys.executable, "-m", "cluster.engines.standin.server", "--role", role, "--port", str(port),
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


def preflight_torch(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(2, f"no CUDA device (torch {torch.__version__}): --device cuda needs an NVIDIA GPU")


def run_torch(a: argparse.Namespace) -> dict[str, Any]:
    """The live torch cluster of `pdlab serve --engines torch` under load, then its fits."""
    import httpx

    from cluster.live.serving import ServerThread
    from telemetry import open_reader
    from toolkit.fit.run import fit_run
    from toolkit.serve.sglang import create_sglang_app
    from toolkit.serve.torch import TorchClusterOptions, build_agents, build_cluster

    opts = TorchClusterOptions(
        nodes=a.nodes, split=a.split, model=a.preset, device=a.device, workload=a.workload,
        agents=a.programs, token_scale=a.torch_token_scale, time_scale=0.1,
        max_output_tokens=a.max_output_tokens, seed=a.seed,
    )  # fmt: skip
    db = Path(a.db)
    cluster = build_cluster(opts, db, None)
    t0 = time.monotonic()
    switch: dict[str, Any] = {}
    try:
        cluster.prepare()
        with ServerThread(create_sglang_app(cluster, "gpu-check")) as server:
            http = httpx.Client(base_url=server.url, timeout=60)
            agents = build_agents(opts, server.url).start()
            time.sleep(a.duration / 2)
            nodes = http.get("/v1/cluster").json()["nodes"]
            held = [n for n in nodes if n["phase"] == "decode" and n["kv_gpu_used"]]
            if held and sum(n["phase"] == "decode" for n in nodes) > 1:
                node = held[0]["id"]
                auth = {"Authorization": "Bearer gpu-check"}
                http.post(f"/v1/nodes/{node}/phase", json={"phase": "prefill"}, headers=auth)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    st = next(n for n in http.get("/v1/cluster").json()["nodes"] if n["id"] == node)
                    if st["phase"] == "prefill" and st["switching"] is None:
                        switch = {"node": node, **(st["last_switch"] or {}),
                                  "kv_after": st["kv_gpu_used"] + st["kv_host_used"]}  # fmt: skip
                        break
                    time.sleep(0.5)
            time.sleep(a.duration / 2)
            stats = agents.stop()
            state = http.get("/v1/cluster").json()
            http.close()
    finally:
        cluster.stop()
    wall = time.monotonic() - t0
    reader = open_reader(db)
    req = reader.table("requests").filter(reader.table("requests")["run_id"] == cluster.run_id)
    dec = reader.sql(
        "SELECT batch_size AS b, avg(experts_active) AS active, count(*) AS n "
        "FROM decode_iterations WHERE run_id = ? GROUP BY 1 ORDER BY 1",
        [cluster.run_id],
    )
    from cluster.engines.torch.config import preset
    from models.iteration import phi

    m = preset(a.preset)
    phi_rows = [
        {"B": int(r["b"]), "iterations": int(r["n"]),
         "measured": None if r["active"] is None else r["active"] / m.num_experts,
         "model": float(phi(float(r["b"]), m.top_k, m.num_experts, 1.0)) if m.num_experts else 0.0}
        for r in dec.iter_rows(named=True)
    ]  # fmt: skip
    fit = fit_run(db, run_id=cluster.run_id, bootstrap=0)
    fits = {
        n.node_id: {
            phase: {
                "coef": getattr(n, phase).coef,
                "heldout_mape": getattr(n, phase).mape,
                "samples": getattr(n, phase).samples,
            }
            for phase in ("prefill", "decode")
        }
        for n in fit.nodes
    }
    out: dict[str, Any] = {
        "run_id": cluster.run_id,
        "db": str(db),
        "engines": "torch",
        "device": a.device,
        "preset": a.preset,
        "wall_s": round(wall, 1),
        "turns_ok": stats.turns_ok,
        "turns_failed": stats.turns_failed,
        "requests_with_cached_prefix": int((req["t_c"] > 0).sum()) if req.height else 0,
        "mean_ttft_s": state["latency"]["ttft_mean_s"],
        "switch": switch,
        "fits": fits,
        "phi": phi_rows,
        "engine_logs": str(cluster.log_dir),
    }
    problems = []
    if stats.turns_failed or not stats.turns_ok:
        problems.append(f"{stats.turns_failed} turns failed, {stats.turns_ok} ok: {stats.errors}")
    if not out["requests_with_cached_prefix"]:
        problems.append("no request found its prefix cached")
    if not switch or switch.get("lost_kv_blocks") != 0 or not switch.get("kv_after"):
        problems.append(f"the decode -> prefill switch did not keep the node's KV: {switch}")
    if not any(f["prefill"]["coef"] for f in fits.values()):
        problems.append("no prefill fit converged")
    if not any(f["decode"]["coef"] for f in fits.values()):
        problems.append("no decode fit converged")
    out["problems"] = problems
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    from cluster.live.agent_client import TokenMap, play_programs
    from cluster.live.cluster import SGLangCluster
    from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
    from cluster.live.serving import ServerThread
    from cluster.workloads import make_workload
    from telemetry import open_reader
    from toolkit.fit.run import fit_run
    from toolkit.serve.sglang import create_sglang_app

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
            import httpx

            with cluster.lock:
                blocks_seen = cluster.cp.directory_stats()["events"]
            state = httpx.get(f"{server.url}/v1/cluster", timeout=30).json()
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
    p.add_argument("--engines", default="sglang", choices=("sglang", "torch"))
    p.add_argument("--device", default="cuda", help="torch engines: cuda or cpu")
    p.add_argument("--preset", default="tiny-moe", help="torch engines: the model preset")
    p.add_argument("--nodes", type=int, default=3, help="torch engines")
    p.add_argument("--split", default="1P2D", help="torch engines")
    p.add_argument("--duration", type=float, default=60.0, help="torch engines: agent seconds")
    p.add_argument(
        "--torch-token-scale", type=float, default=0.02, help="torch engines: token counts x"
    )
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
    if a.engines == "torch":
        preflight_torch(a.device)
        out = run_torch(a)
    else:
        if not a.standin:
            preflight()
        out = run(a)
    print(json.dumps(out, indent=2, default=str))
    sys.exit(1 if out["problems"] else 0)


if __name__ == "__main__":
    main()
