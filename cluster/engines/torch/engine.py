"""One torch engine node: model, scheduler, ZMQ publishers and HTTP servers (SPEC §6, §9).

`TorchEngine` is what `pdlab engine` runs, one per process. It publishes KV events over a
ZMQ PUB with SGLang's replay ROUTER (`cluster.wire.publisher`) and forward-pass
metrics over a second PUB, serves SGLang's HTTP API (`http_api`) and, in a PD role, the
bootstrap server with the KV transfer (`transfer`). `/server_info` describes it the way
SGLang 0.5.23 does — plus `pd_role_switch_keeps_cache: true`: a role switch keeps the
prefix cache and publishes no AllBlocksCleared (paper 000 §4.1) — so pdlab's cluster-file
discovery, proxy and role switcher drive it unchanged.

    engine = TorchEngine(EngineConfig(model=preset("tiny-moe")), role="prefill")
    endpoints = engine.start()     # EngineEndpoints(http_url, kv_events, ...)
    ...
    engine.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, Unpack

import torch
from fastapi import FastAPI

from cluster.engines.shell.lifecycle import EngineEndpoints, EngineShell, ShellOptions, Update
from cluster.engines.shell.scheduling import OnUpdate, Role
from cluster.engines.shell.stamps import KV_RECEIVED, QUEUED, Stamps, stamp
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.request import EngineRequest
from cluster.engines.torch.runner import ModelRunner
from cluster.engines.torch.scheduler import Scheduler
from cluster.engines.torch.transfer import RoomRegistry, bootstrap_app, fetch_room
from cluster.kv.hashing import token_block_hashes

ENGINE_VERSION = "0.5.23-pdlab-torch"
__all__ = ["ENGINE_VERSION", "EngineEndpoints", "TorchEngine", "Update"]


class TorchEngine(EngineShell[Scheduler]):
    """One engine node (see module docstring); `options` say where it listens and what it
    publishes (`ShellOptions`)."""

    server_name = "torch engine's HTTP server"
    fpm_default = "tcp"  # engines on other hosts subscribe to it

    def __init__(
        self,
        config: EngineConfig | None = None,
        role: Role = "null",
        *,
        transfer_timeout_s: float = 60.0,
        **options: Unpack[ShellOptions],
    ) -> None:
        super().__init__(role, transfer_timeout_s=transfer_timeout_s, **options)
        self.config = config or EngineConfig()
        self.rooms = RoomRegistry()
        self.runner = ModelRunner(self.config)

    # ---- the shell's hooks ------------------------------------------------------------------
    def _build_scheduler(self) -> Scheduler:
        self.config = replace(self.config, worker_id=self.config.worker_id or f"torch-{self.port}")
        return Scheduler(
            self.config, self.role, self.runner, rooms=self.rooms,
            kv_publisher=self.kv_publisher, fpm_publisher=self.fpm_publisher,
        )  # fmt: skip

    def _http_app(self) -> FastAPI:
        from cluster.engines.torch.http_api import create_app

        return create_app(self)

    def _registry(self) -> RoomRegistry:
        return self.rooms

    def _bootstrap_app(self) -> FastAPI:
        return bootstrap_app(
            self.rooms, page_size=self.config.page_size, http_port=self.port, token=self.token
        )

    # ---- state ------------------------------------------------------------------------------
    @property
    def served_model(self) -> str:
        return f"pdlab/{self.config.model.name}"

    @property
    def max_model_len(self) -> int:
        return self.config.model.max_context_tokens

    @property
    def serving_role(self) -> str:
        return self.sched.role

    def kv_usage(self) -> float:
        pages = self.config.gpu_pages
        return self.sched.cache.gpu_used_pages / pages if pages else 0.0

    def model_info(self) -> dict[str, Any]:
        m = self.config.model
        return {
            "model_path": f"pdlab/{m.name}", "served_model_name": f"pdlab/{m.name}",
            "tokenizer_path": "pdlab/toy-bytes", "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "load_format": "random", "disaggregation_mode": self.sched.role,
            "model_type": "pdlab-torch", "architectures": ["PdlabTorchForCausalLM"],
            "vocab_size": m.vocab_size, "num_parameters": m.num_parameters(),
        }  # fmt: skip

    async def call(self, fn: Any) -> Any:
        """Run `fn` on the scheduler thread between passes and await its result."""
        return await asyncio.wrap_future(self.sched.call(fn))

    def server_info(self) -> dict[str, Any]:
        """SGLang's /server_info: resolved args, the `kv_events` descriptor and state."""
        cfg, m, sched = self.config, self.config.model, self.sched
        cache = sched.cache
        kv_cfg, descriptor = self.kv_events_info(cfg.page_size)
        fpm = self.fpm_publisher.endpoint if self.fpm_publisher else None
        ps = cfg.page_size
        return {
            "model_path": f"pdlab/{m.name}",
            "served_model_name": f"pdlab/{m.name}",
            "tokenizer_path": "pdlab/toy-bytes",
            "host": self.host,
            "port": self.port,
            "page_size": ps,
            "chunked_prefill_size": cfg.chunk_tokens,
            "max_running_requests": cfg.max_running,
            "max_total_num_tokens": cfg.gpu_pages * ps,
            "dp_size": 1,
            "tp_size": 1,
            "device": cfg.device,
            "dtype": cfg.dtype,
            "random_seed": cfg.seed,
            "disaggregation_mode": sched.role,
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "disaggregation_transfer_backend": "pdlab-http",
            "disaggregation_decode_enable_radix_cache": True,
            "enable_pd_role_switch": self.enable_pd_role_switch,
            "pd_role_switch_keeps_cache": True,
            "kv_events_config": kv_cfg,
            "enable_forward_pass_metrics": fpm is not None,
            "forward_pass_metrics_worker_id": cfg.worker_id,
            "forward_pass_metrics_endpoint": fpm,
            "forward_pass_metrics_detail": "pdlab",  # exact ΣA, t_rst, experts per layer
            "kv_events": descriptor,
            "kv_eviction_policy": cache.policy.name,
            "hicache_write_policy": "write_through",
            "host_kv_capacity_tokens": cfg.host_pages * ps,
            "vocab_size": m.vocab_size,
            "eos_token_id": m.eos_token_id,
            "context_length": m.max_context_tokens,
            "moe_top_k": m.top_k,
            "moe_experts": m.num_experts,
            "num_parameters": m.num_parameters(),
            "launch_command": f"pdlab engine --model {m.name} --role {sched.role}",
            "startup_time": self._started_at,
            "internal_states": [
                {
                    "disaggregation_mode": sched.role,
                    "num_running_reqs": len(sched.running),
                    "num_waiting_reqs": len(sched.waiting),
                    "num_forward_passes": sched.num_passes,
                    "num_cached_pages": cache.cached_gpu_blocks,
                    "kv_gpu_used_tokens": cache.gpu_used_pages * ps,
                    "kv_host_used_tokens": cache.host_used_pages * ps,
                    "kv_gpu_evicted_pages": cache.num_evicted["GPU"],
                    "kv_host_evicted_pages": cache.num_evicted["CPU_PINNED"],
                    "kv_restored_pages": cache.num_restored,
                    "kv_written_through_pages": cache.num_written_through,
                    "pending_transfer_rooms": len(self.rooms),
                }
            ],
            "version": ENGINE_VERSION,
            "frontend": "python",
        }

    def kv_digests(self, ids: list[int]) -> list[dict[str, Any]]:
        """Per full page of `ids`: its block hash and the SHA-256 of its K/V bytes in each
        tier (None where not cached). Runs on the scheduler thread (via `call`)."""
        cache, pool = self.sched.cache, self.runner.pool
        out = []
        for h in token_block_hashes(ids, self.config.page_size):
            b = cache.blocks.get(h)
            gpu = None if b is None or b.page is None else _digest(pool.gpu[:, :, b.page])
            host = (
                None if b is None or b.host_page is None else _digest(pool.host[:, :, b.host_page])
            )
            out.append({"hash": h, "gpu": gpu, "host": host})
        return out

    # ---- generation -------------------------------------------------------------------------
    def check_prompt(self, ids: list[int], max_new: int) -> str | None:
        """Why the model cannot take `ids` and `max_new` more tokens (None: it can)."""
        m = self.config.model
        bad = next((t for t in ids if not 0 <= t < m.vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary [0, {m.vocab_size})"
        if len(ids) + max_new > m.max_context_tokens:
            return (
                f"{len(ids)} prompt tokens + max_new_tokens {max_new} exceed the context "
                f"length {m.max_context_tokens}"
            )
        return None

    async def generate(
        self, ids: list[int], sampling: dict[str, Any], rid: str, body: dict[str, Any]
    ) -> AsyncGenerator[Update, None]:
        """Yield (output ids so far, finish reason or None, cached tokens, stage stamps)."""
        max_new = int(sampling.get("max_new_tokens", 128))
        problem = self.check_prompt(ids, max_new)
        if problem is not None:
            yield [], {"type": "abort", "message": problem, "status_code": 400}, 0, {}
            return
        room = body.get("bootstrap_room")
        transfer, refused = await self.pd_handoff(self.sched.role, rid, body, fetch_room)
        if refused is not None:
            yield [], refused, 0, {}
            return
        stamps: Stamps = {}
        if transfer is not None:
            stamp(stamps, KV_RECEIVED)

        def submit(on_update: OnUpdate) -> EngineRequest:
            req = EngineRequest(
                rid=rid,
                input_ids=list(ids),
                max_new_tokens=max_new,
                on_update=on_update,
                ignore_eos=bool(sampling.get("ignore_eos", False)),
                temperature=float(sampling.get("temperature") or 0.0),
                bootstrap_room=None if room is None else int(room),
                transfer=transfer,
                stamps=stamps,
            )
            stamp(stamps, QUEUED)
            self.sched.submit(req)
            return req

        async with contextlib.aclosing(self.updates(submit)) as updates:
            async for update in updates:
                yield update


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
