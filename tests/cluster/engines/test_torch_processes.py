"""Two `pdlab engine` processes in PD roles on loopback (paper 000 §4.1–4.2; SPEC §9).

The prefill engine's KV reaches the decode engine byte for byte, the decode engine continues
the generation exactly where a collocated engine would, and a role switch of both engines
keeps their prefix caches: the next turn, prefilled on the former decode engine, finds its
context cached there and computes only the new tokens. SIGTERM stops each process with
exit status 0.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import zmq

from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine
from cluster.sglang.fpm import decode_fpm

ROOT = Path(__file__).resolve().parents[3]
ARGS = ["--kv-gpu-tokens", "4096", "--kv-host-tokens", "8192", "--seed", "3"]
TOKEN = "engine-test-token"  # passed as pdlab serve passes it: in the environment
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class EngineProcess:
    """`python -m toolkit.cli engine ...` with the endpoints of its ready line."""

    def __init__(self, role: str) -> None:
        cmd = [sys.executable, "-m", "toolkit.cli", "engine", "--role", role, "--port", "0",
               "--bootstrap-port", "0", "--enable-pd-role-switch", *ARGS]  # fmt: skip
        env = {**os.environ, "PDLAB_ENGINE_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.ep: dict[str, Any] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("pdlab engine ready:"):
                self.ep = json.loads(line.split("ready:", 1)[1])
                self._ready.set()

    def wait(self, timeout_s: float = 120.0) -> EngineProcess:
        if not self._ready.wait(timeout_s):
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"engine process did not start: {err[-2000:]}")
        return self

    @property
    def url(self) -> str:
        return str(self.ep["http_url"])

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def exit_code(self) -> int | None:
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def _pd_generate(prefill: EngineProcess, decode: EngineProcess, ids: list[int], room: int):  # type: ignore[no-untyped-def]
    """What a PD router does: the same body, with bootstrap fields, to both engines."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.ep["bootstrap_port"],
        "bootstrap_room": room,
    }
    with ThreadPoolExecutor(2) as pool:
        p = pool.submit(httpx.post, f"{prefill.url}/generate", json=body, timeout=60)
        d = pool.submit(httpx.post, f"{decode.url}/generate", json=body, timeout=60)
        pr, dr = p.result(), d.result()
    assert pr.status_code == 200 and dr.status_code == 200, (pr.text, dr.text)
    return pr.json(), dr.json()


def _digests(engine: EngineProcess, ids: list[int]) -> list[dict[str, Any]]:
    r = httpx.post(f"{engine.url}/pdlab/kv_digest", json={"input_ids": ids}, timeout=30)
    return list(r.json()["blocks"])


def _switch(engine: EngineProcess, role: str) -> dict[str, Any]:
    r = httpx.post(f"{engine.url}/pd_role_switch", json={"new_role": role}, timeout=30)
    assert r.status_code == 401, r.text  # a mutation needs the engine's token
    r = httpx.post(
        f"{engine.url}/pd_role_switch", json={"new_role": role}, headers=AUTH, timeout=30
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_pd_transfer_is_byte_exact_and_a_role_switch_keeps_the_cache() -> None:
    a, b = EngineProcess("prefill"), EngineProcess("decode")
    try:
        a.wait(), b.wait()
        rng = random.Random(0)
        prompt = [rng.randrange(256) for _ in range(90)]  # 5 full pages and 10 tokens
        pre, dec = _pd_generate(a, b, prompt, room=11)
        assert pre["output_ids"] == dec["output_ids"][:1] and len(dec["output_ids"]) == 8
        # A collocated engine with the same weights generates the same tokens.
        cfg = EngineConfig(seed=3, gpu_pages=256, host_pages=0)
        with TorchEngine(cfg, "null", kv_events=False, forward_metrics=False) as ref:
            body = {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
            }
            alone = httpx.post(f"{ref.endpoints.http_url}/generate", json=body, timeout=60).json()  # type: ignore[union-attr]
        assert dec["output_ids"] == alone["output_ids"]
        # The prompt's pages on both engines: equal bytes, and their host copies too.
        da, db = _digests(a, prompt), _digests(b, prompt)
        assert len(da) == 5 and all(x["gpu"] is not None for x in da + db)
        assert [x["gpu"] for x in da] == [x["gpu"] for x in db]
        assert all(x["host"] == x["gpu"] for x in da + db)

        # Watch b's streams across the switch and the next turn.
        ctx = zmq.Context()
        kv_sub, fpm_sub = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
        for s, endpoint in ((kv_sub, b.ep["kv_events"]), (fpm_sub, b.ep["forward_metrics"])):
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(endpoint)
        time.sleep(0.3)
        assert _switch(b, "prefill")["kept_prefix_cache"] is True
        assert _switch(a, "decode")["success"] is True
        info = httpx.get(f"{b.url}/server_info", timeout=10).json()
        assert info["disaggregation_mode"] == "prefill" and info["pd_role_switch_keeps_cache"]
        assert info["internal_states"][0]["kv_gpu_used_tokens"] > 0
        turn = prompt + dec["output_ids"] + [rng.randrange(256) for _ in range(20)]
        pre2, dec2 = _pd_generate(b, a, turn, room=12)
        # b computed K/V for 90 + 7 tokens while decoding: 6 full pages are cached there.
        assert pre2["meta_info"]["cached_tokens"] == 96
        assert dec2["meta_info"]["cached_tokens"] == 96 and len(dec2["output_ids"]) == 8
        kinds, passes = [], []
        while kv_sub.poll(300):
            batch = msgspec.msgpack.decode(kv_sub.recv_multipart()[2])
            kinds += [e["type"] for e in batch[1]]
        while fpm_sub.poll(300):
            passes.append(decode_fpm(fpm_sub.recv_multipart()[2]))
        for s in (kv_sub, fpm_sub):
            s.close(linger=0)
        ctx.term()
        assert "AllBlocksCleared" not in kinds and "BlockStored" in kinds
        work = [m.scheduled_requests for m in passes if m.wall_time > 0]
        # No recompute of the cached blocks: one prefill pass of the 22 new tokens.
        assert [(s.sum_prefill_tokens, s.sum_prefill_kv_tokens) for s in work] == [(22, 96)]
    finally:
        a.terminate(), b.terminate()
        codes = [a.exit_code(), b.exit_code()]
    assert codes == [0, 0]
