"""The SGLang stand-in: a protocol-faithful fake SGLang 0.5.23 server on loopback (SPEC §6).

It lets pdlab's live-cluster code (collectors, router, role switch, `pdlab serve --sglang`)
be developed and tested without GPUs. `StandinEngine` (this module) is one engine on the
shared shell (`cluster.engines.shell.lifecycle`: publishers of KV events and forward-pass
metrics over ZMQ in SGLang's wire format, the HTTP and bootstrap servers on loopback): its
scheduler (`scheduler`: forward passes last as long as the iteration-time models say), its
PD role (prefill/decode/null) with the transfer route (`bootstrap`), `/server_info`, and the
generation of one request. Its HTTP API (`http_api`) is SGLang's routes, request fields,
answers and errors (`cluster.engines.shell.sglang_http`) and switches roles with SGLang's
checks (`role_switch`). Tokens come from a toy byte tokenizer (`toy_tokenizer`). What is not
modelled: sampling, stop strings, logprobs, batch (list) inputs, LoRA, multimodal,
host-memory (HiCache) tiers, RDMA (the decode side fetches a finished room from the
prefill's bootstrap server).

    engine = StandinEngine("prefill", enable_pd_role_switch=True)
    urls = engine.start()            # StandinEndpoints(http_url, kv_events, kv_replay, ...)
    ...
    engine.stop()

or `python -m cluster.engines.standin.server --role prefill --port 30000`. With
`wire="vllm"` (`--wire vllm`) it speaks vLLM instead (`vllm_http`: vLLM's routes, /metrics
names, KV event format, NIXL-style P/D hand-off, pdlab's vLLM step stream).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, Literal, Unpack

from fastapi import FastAPI

from cluster.engines.shell.guard import TOKEN_ENV
from cluster.engines.shell.lifecycle import EngineEndpoints, EngineShell, ShellOptions, Update
from cluster.engines.shell.scheduling import ROLES, OnUpdate, Role
from cluster.engines.shell.serving_metrics import ServingMetrics
from cluster.engines.shell.stamps import KV_RECEIVED, QUEUED, Stamps, stamp
from cluster.engines.standin.bootstrap import RoomRegistry, bootstrap_app, wait_for_prefill
from cluster.engines.standin.http_api import standin_app
from cluster.engines.standin.scheduler import SchedulerConfig, StandinRequest, StandinScheduler

STANDIN_VERSION = "0.5.23-pdlab-standin"
DEFAULT_MODEL = "pdlab/standin-toy"
StandinEndpoints = EngineEndpoints


class StandinEngine(EngineShell[StandinScheduler]):
    """One SGLang stand-in server: HTTP API, ZMQ publishers, scheduler, bootstrap server.

    `options` say where it listens and what it publishes (`ShellOptions`)."""

    server_name = "SGLang stand-in's HTTP server"

    def __init__(
        self,
        role: Role = "null",
        *,
        config: SchedulerConfig | None = None,
        model_path: str = DEFAULT_MODEL,
        transfer_timeout_s: float = 30.0,
        free_gpu_memory_gb: float = 80.0,
        wire: Literal["sglang", "vllm"] = "sglang",
        **options: Unpack[ShellOptions],
    ) -> None:
        if wire not in ("sglang", "vllm"):
            raise ValueError(f"wire must be sglang or vllm, got {wire!r}")
        self.wire = wire
        self.metrics_style = wire  # GET /metrics under SGLang's or vLLM's names
        super().__init__(role, transfer_timeout_s=transfer_timeout_s, **options)
        self.config = config or SchedulerConfig()
        if wire == "vllm":
            self.config = replace(self.config, kv_wire_format="vllm")
        self.model_path = model_path
        self.free_gpu_memory_gb = free_gpu_memory_gb  # what a decode-graph capture may use
        self.decode_graphs_captured = role == "decode"
        self.rooms = RoomRegistry()
        # What generation requests carried (introspection for router tests): bounded.
        self.received: deque[dict[str, Any]] = deque(maxlen=10_000)

    # --- the shell's hooks ------------------------------------------------------------------

    def _build_scheduler(self) -> StandinScheduler:
        self.config = replace(
            self.config, worker_id=self.config.worker_id or f"standin-{self.port}"
        )
        return StandinScheduler(
            self.config,
            self.role,
            kv_publisher=self.kv_publisher,
            fpm_publisher=self.fpm_publisher,
            rooms=self.rooms,
        )

    def _http_app(self) -> FastAPI:
        if self.wire == "vllm":
            from cluster.engines.standin.vllm_http import vllm_app

            return vllm_app(self)
        return standin_app(self)

    def _registry(self) -> RoomRegistry:
        return self.rooms

    def _fpm_publisher(self, endpoint: str) -> Any:
        if self.wire == "vllm":  # pdlab's vLLM stat-logger stream instead of SGLang's FPM
            from cluster.engines.standin.vllm_http import StepsPublisher

            return StepsPublisher(endpoint, self)
        return super()._fpm_publisher(endpoint)

    def _serving_metrics(self) -> ServingMetrics:
        cfg = self.config
        return ServingMetrics(
            self.metrics_style, self.served_model, self.load,
            block_size=cfg.page_size, num_gpu_blocks=cfg.capacity_pages,
        )  # fmt: skip

    def _bootstrap_app(self) -> FastAPI:
        return bootstrap_app(
            self.rooms, page_size=self.config.page_size, http_port=self.port, token=self.token
        )

    # --- state ------------------------------------------------------------------------------

    @property
    def served_model(self) -> str:
        return self.model_path

    @property
    def max_model_len(self) -> int:
        return self.config.capacity_pages * self.config.page_size

    @property
    def serving_role(self) -> str:
        return self.sched.role

    def kv_usage(self) -> float:
        cache = self.sched.cache
        return (cache.num_pages + cache.reserved_pages) / cache.capacity_pages

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "served_model_name": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "dummy",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": self.scheduler.role if self.scheduler else self.role,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "standin",
            "architectures": ["StandinForCausalLM"],
        }

    def server_info(self) -> dict[str, Any]:
        """SGLang's /server_info: resolved server args + `kv_events` descriptor + state."""
        cfg, sched = self.config, self.sched
        kv_cfg, descriptor = self.kv_events_info(cfg.page_size)
        fpm = self.fpm_publisher.endpoint if self.fpm_publisher else None
        return {
            "model_path": self.model_path,
            "served_model_name": self.model_path,
            "tokenizer_path": self.model_path,
            "host": self.host,
            "port": self.port,
            "page_size": cfg.page_size,
            "chunked_prefill_size": cfg.chunk_tokens,
            "max_running_requests": cfg.max_running,
            "max_total_num_tokens": cfg.capacity_pages * cfg.page_size,
            "dp_size": 1,
            "tp_size": 1,
            "disaggregation_mode": self.role,
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "disaggregation_transfer_backend": "standin",
            "disaggregation_decode_enable_radix_cache": cfg.decode_radix_cache,
            "enable_pd_role_switch": self.enable_pd_role_switch,
            "kv_events_config": kv_cfg,
            "enable_forward_pass_metrics": fpm is not None,
            "forward_pass_metrics_worker_id": cfg.worker_id,
            "forward_pass_metrics_ipc_name": None if fpm is None else fpm.rsplit(".", 1)[0],
            "forward_pass_metrics_endpoint": fpm,
            "kv_events": descriptor,
            "launch_command": f"python -m cluster.engines.standin.server --role {self.role}",
            "startup_time": self._started_at,
            "internal_states": [
                {
                    "num_running_reqs": len(sched.running),
                    "num_waiting_reqs": len(sched.waiting),
                    "num_cached_pages": sched.cache.num_pages,
                    "num_forward_passes": sched.num_passes,
                }
            ],
            "version": STANDIN_VERSION,
            "frontend": "python",
            "standin": True,
        }

    # --- requests ---------------------------------------------------------------------------

    def check_prompt(self, ids: list[int], max_new_tokens: int) -> str | None:
        """Token ids must fit SGLang's uint32 block hashing (the pool is checked when the
        scheduler admits the request, as SGLang's does)."""
        bad = next((t for t in ids if not 0 <= t < 1 << 32), None)
        return None if bad is None else f"token id {bad} is outside [0, 2**32)"

    async def generate(
        self, input_ids: list[int], sampling: dict[str, Any], rid: str, body: dict[str, Any]
    ) -> AsyncGenerator[Update, None]:
        """Yield (output ids so far, finish reason or None, cached tokens, stage stamps).

        A decode-role engine first fetches the prefill's result for the request's bootstrap
        room; an abort is a finish reason {"type": "abort", "message", "status_code"}."""
        room = body.get("bootstrap_room")
        role = self.sched.role
        if not rid.startswith("HEALTH_CHECK_"):
            self.received.append(
                {
                    "rid": rid,
                    "role": role,
                    "route": body.get("_route", "/generate"),
                    "num_input_tokens": len(input_ids),
                    "bootstrap_host": body.get("bootstrap_host"),
                    "bootstrap_port": body.get("bootstrap_port"),
                    "bootstrap_room": room,
                    "t": time.time(),
                }
            )
        handoff, refused = await self.pd_handoff(role, rid, body, wait_for_prefill)
        if refused is not None:
            yield [], refused, 0, {}
            return
        first_token = None if handoff is None else handoff.first_token_id
        stamps: Stamps = {}
        if handoff is not None:
            stamp(stamps, KV_RECEIVED)

        def submit(on_update: OnUpdate) -> StandinRequest:
            req = StandinRequest(
                rid=rid,
                input_ids=input_ids,
                max_new_tokens=int(sampling.get("max_new_tokens", 128)),
                on_update=on_update,
                bootstrap_room=None if room is None else int(room),
                first_token_id=first_token,
                stamps=stamps,
            )
            stamp(stamps, QUEUED)
            self.sched.submit(req)
            return req

        async with contextlib.aclosing(self.updates(submit)) as updates:
            async for update in updates:
                yield update


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Run one SGLang stand-in server (no GPU).")
    p.add_argument("--role", choices=ROLES, default="null")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--kv-events-endpoint", default=None, help="e.g. tcp://127.0.0.1:5557")
    p.add_argument("--kv-replay-endpoint", default=None, help="e.g. tcp://127.0.0.1:5558")
    p.add_argument("--forward-metrics-endpoint", default=None, help="default: an ipc:// socket")
    p.add_argument("--bootstrap-port", type=int, default=8998)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--enable-pd-role-switch", action="store_true")
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token of the mutating routes (default ${TOKEN_ENV}; none: like SGLang "
        "without --api-key, mutations need only a JSON body)",
    )
    p.add_argument("--wire", choices=("sglang", "vllm"), default="sglang")
    a = p.parse_args(argv)
    if a.token is not None and not a.token.strip():
        p.error(f"the token is empty: pass --token or set ${TOKEN_ENV}")
    engine = StandinEngine(
        a.role,
        host=a.host,
        port=a.port,
        config=SchedulerConfig(page_size=a.page_size, time_scale=a.time_scale),
        kv_events_endpoint=a.kv_events_endpoint,
        kv_replay_endpoint=a.kv_replay_endpoint,
        forward_metrics_endpoint=a.forward_metrics_endpoint,
        bootstrap_port=a.bootstrap_port,
        enable_pd_role_switch=a.enable_pd_role_switch,
        token=a.token,
        wire=a.wire,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ep = engine.start()
    print(f"SGLang stand-in ({a.role}) ready: {json.dumps(ep._asdict())}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
