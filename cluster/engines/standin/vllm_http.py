"""The stand-in speaking vLLM: its HTTP routes, P/D hand-off and per-step stream (SPEC §6).

`StandinEngine(wire="vllm")` serves what `vllm serve` serves to the outside — /health,
/version, /v1/models, /metrics (vLLM's Prometheus names, `shell.serving_metrics`),
/tokenize, /v1/completions and /v1/chat/completions — and none of SGLang's routes
(/server_info, /generate, /pd_role_switch answer 404, as on vLLM). Its KV events are vLLM's
wire format (a map batch, vLLM-style replay replies), and instead of SGLang's forward-pass
metrics it publishes what pdlab's vLLM stat-logger plugin publishes (`VLLMStep`s on the
topic `pdlab.vllm.steps`, with a replay socket), as if the server ran the plugin with
`--cudagraph-metrics` (the stand-in knows each pass's scheduled tokens exactly).

P/D follows vLLM's NIXL connector proxy (`tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py`): the proxy sends the request to a prefill instance with
`kv_transfer_params: {"do_remote_decode": true}` and max_tokens 1, which answers with
`kv_transfer_params` naming where the KV waits (`remote_host`, `remote_port`,
`remote_request_id`, ...); the proxy sends those to a decode instance, which fetches the
KV and streams the answer. Underneath, the stand-in's bootstrap rooms carry the hand-off.
"""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cluster.engines.shell.http_input import BadRequest, openai_input, read_json
from cluster.engines.shell.sglang_http import (
    metrics_response,
    openai_error,
    respond_openai,
)
from cluster.sglang.fpm import decode_fpm
from cluster.wire import toy_tokenizer
from cluster.wire.publisher import ZmqBatchPublisher
from cluster.wire.vllm_steps import STEPS_TOPIC, VLLMStep, encode_step

if TYPE_CHECKING:
    from cluster.engines.standin.server import StandinEngine

VLLM_STANDIN_VERSION = "0.11.0-pdlab-standin"


class StepsPublisher:
    """Takes the scheduler's per-pass ForwardPassMetrics and publishes `VLLMStep`s instead
    (heartbeats dropped), with vLLM-style replay."""

    def __init__(self, endpoint: str, engine: StandinEngine) -> None:
        self.engine = engine
        self._pub = ZmqBatchPublisher(
            endpoint,
            replay_endpoint=f"tcp://{engine.host}:0",
            topic=STEPS_TOPIC,
            replay_style="vllm",
        )
        self.endpoint = self._pub.endpoint
        self.replay_endpoint = self._pub.replay_endpoint

    @property
    def next_seq(self) -> int:
        return self._pub.next_seq

    def publish(self, payload: bytes) -> int:
        m = decode_fpm(payload)
        if m.is_heartbeat:
            return self._pub.next_seq
        e = self.engine
        s, sched, cfg = m.scheduled_requests, e.sched, e.config
        n_dec = s.num_decode_requests
        step = VLLMStep(
            t_wall=time.time(),
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_usage=min(e.kv_usage(), 1.0),
            generation_tokens=n_dec,
            decoders=n_dec,
            itl_min_s=m.wall_time if n_dec else None,
            ttft_min_s=None if n_dec else m.wall_time,
            scheduled_tokens=s.sum_prefill_tokens + n_dec,
            budget_tokens=cfg.chunk_tokens,
            kv_capacity_tokens=cfg.capacity_pages * cfg.page_size,
        )
        return self._pub.publish(encode_step(step))

    def close(self) -> None:
        self._pub.close()


def vllm_app(engine: StandinEngine) -> FastAPI:
    """vLLM's routes over the stand-in (module docstring)."""
    app = FastAPI(title="vLLM stand-in")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.healthy() else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VLLM_STANDIN_VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = engine.served_model
        return {"object": "list", "data": [
            {"id": model, "object": "model", "created": int(engine.started_at), "owned_by": "vllm",
             "root": model, "parent": None, "max_model_len": engine.max_model_len,
             "permission": []}]}  # fmt: skip

    @app.get("/metrics")
    async def metrics() -> Response:
        return metrics_response(engine)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return openai_error("prompt must be a string")
        tokens = toy_tokenizer.encode(prompt)
        return JSONResponse(
            {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await read_json(request)
            req = openai_input(body, chat=False, max_fields=("max_tokens",), default_max=16)
        except BadRequest as e:
            return openai_error(str(e))
        body["_route"] = "/v1/completions"
        role = engine.serving_role
        params = body.get("kv_transfer_params") or {}
        if role == "prefill":
            body["bootstrap_room"] = random.getrandbits(62)
        elif role == "decode":
            if not params.get("do_remote_prefill"):
                return openai_error(
                    "this decode instance takes requests with kv_transfer_params from a "
                    "prefill instance (do_remote_prefill)"
                )
            body["bootstrap_host"] = params.get("remote_host")
            body["bootstrap_port"] = params.get("remote_port")
            body["bootstrap_room"] = int(params.get("remote_request_id", -1))
        resp = await respond_openai(engine, request, req, body, chat=False)
        if role != "prefill" or resp.status_code != 200 or body.get("stream"):
            return resp
        doc = json.loads(bytes(resp.body))
        doc["kv_transfer_params"] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"standin-{engine.port}",
            "remote_block_ids": [],
            "remote_host": engine.host,
            "remote_port": engine.bootstrap_port,
            "remote_request_id": str(body["bootstrap_room"]),
            "tp_size": 1,
        }
        return JSONResponse(doc)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await read_json(request)
            fields = ("max_completion_tokens", "max_tokens")
            req = openai_input(body, chat=True, max_fields=fields, default_max=128)
        except BadRequest as e:
            return openai_error(str(e))
        if engine.serving_role != "null":
            return openai_error("P/D instances take /v1/completions through the proxy")
        body["_route"] = "/v1/chat/completions"
        return await respond_openai(engine, request, req, body, chat=True)

    return app
