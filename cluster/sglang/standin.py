"""The SGLang stand-in: a protocol-faithful fake SGLang 0.5.23 server on loopback (SPEC §6).

It lets pdlab's live-cluster code (collectors, router, role switch, `pdlab serve --sglang`)
be developed and tested without GPUs. It serves SGLang's HTTP API with FastAPI + uvicorn —
/health, /health_generate, /server_info, /model_info, /get_model_info, /generate,
/v1/completions, /v1/chat/completions, /v1/tokenize, /flush_cache, /pd_role_switch — with SGLang's
request fields, response shapes and error messages; publishes KV events and forward-pass
metrics over ZMQ in SGLang's wire format (with the replay ROUTER); and runs PD
disaggregation (prefill/decode/null) with the bootstrap protocol (`cluster.sglang.bootstrap`).
Tokens come from a toy byte tokenizer (`toy_tokenizer`); forward passes last as long as the
iteration-time models say (`cluster.sglang.scheduler`). What is not modelled: sampling,
stop strings, logprobs, batch (list) inputs, LoRA, multimodal, host-memory (HiCache) tiers,
RDMA (the decode side fetches a finished room from the prefill's bootstrap server). Role
switch mirrors SGLang's checks, including the decode-CUDA-graph headroom required on the
first flip to decode (`free_gpu_memory_gb` stands for the free device memory).
One stand-in-only route, GET /standin/requests, lists the generation requests received
(rid, route, role, bootstrap fields) so tests can check what a router sent.

    engine = StandinEngine("prefill", enable_pd_role_switch=True)
    urls = engine.start()            # StandinEndpoints(http_url, kv_events, kv_replay, ...)
    ...
    engine.stop()

or `python -m cluster.sglang.standin --role prefill --port 30000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from cluster.sglang import toy_tokenizer
from cluster.sglang.bootstrap import RoomRegistry, bootstrap_app, wait_for_prefill
from cluster.sglang.publisher import ZmqBatchPublisher
from cluster.sglang.scheduler import ROLES, Role, SchedulerConfig, StandinRequest, StandinScheduler

STANDIN_VERSION = "0.5.23-pdlab-standin"
DEFAULT_MODEL = "pdlab/standin-toy"


class StandinEndpoints(NamedTuple):
    """Where a started stand-in listens (ports resolved)."""

    http_url: str
    kv_events: str | None
    kv_replay: str | None
    forward_metrics: str | None
    bootstrap_port: int | None


class _Uvicorn:
    """A uvicorn server on a pre-bound loopback socket, run on its own thread."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
        # and without it every keep-alive response waits ~40 ms for a delayed ACK.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10.0
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the SGLang stand-in's HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5.0)
        self.sock.close()


class StandinEngine:
    """One SGLang stand-in server: HTTP API, ZMQ publishers, scheduler, bootstrap server."""

    def __init__(
        self,
        role: Role = "null",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: SchedulerConfig | None = None,
        model_path: str = DEFAULT_MODEL,
        kv_events: bool = True,
        kv_events_endpoint: str | None = None,
        kv_replay_endpoint: str | None = None,
        kv_topic: str = "",
        forward_metrics: bool = True,
        forward_metrics_endpoint: str | None = None,
        bootstrap_port: int = 0,
        enable_pd_role_switch: bool = False,
        transfer_timeout_s: float = 30.0,
        free_gpu_memory_gb: float = 80.0,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.role: Role = role
        self.host = host
        self.port = port
        self.config = config or SchedulerConfig()
        self.model_path = model_path
        self.kv_events = kv_events
        self.kv_events_endpoint = kv_events_endpoint or f"tcp://{host}:0"
        self.kv_replay_endpoint = kv_replay_endpoint or f"tcp://{host}:0"
        self.kv_topic = kv_topic
        self.forward_metrics = forward_metrics
        self._fpm_dir: tempfile.TemporaryDirectory[str] | None = None
        self.forward_metrics_endpoint = forward_metrics_endpoint
        self.bootstrap_port = bootstrap_port
        self.enable_pd_role_switch = enable_pd_role_switch
        self.transfer_timeout_s = transfer_timeout_s
        self.free_gpu_memory_gb = free_gpu_memory_gb  # what a decode-graph capture may use
        self._decode_graphs_captured = role == "decode"
        self.rooms = RoomRegistry()
        self.kv_publisher: ZmqBatchPublisher | None = None
        self.fpm_publisher: ZmqBatchPublisher | None = None
        self.scheduler: StandinScheduler | None = None
        self._http: _Uvicorn | None = None
        self._bootstrap: _Uvicorn | None = None
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        # What generation requests carried (introspection for router tests): bounded.
        self.received: deque[dict[str, Any]] = deque(maxlen=10_000)
        self._client: httpx.AsyncClient | None = None  # used on the HTTP server's loop only
        self._started_at = 0.0
        self.endpoints: StandinEndpoints | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> StandinEndpoints:
        if self.kv_events:
            self.kv_publisher = ZmqBatchPublisher(
                self.kv_events_endpoint,
                replay_endpoint=self.kv_replay_endpoint,
                topic=self.kv_topic,
            )
        if self.forward_metrics:
            endpoint = self.forward_metrics_endpoint
            if endpoint is None:  # SGLang's default: an IPC socket "{ipc_name}.{dp_rank}"
                self._fpm_dir = tempfile.TemporaryDirectory(prefix="pdlab-fpm-")
                endpoint = f"ipc://{Path(self._fpm_dir.name) / 'fpm'}.0"
            self.fpm_publisher = ZmqBatchPublisher(endpoint)
        self._http = _Uvicorn(self._app(), self.host, self.port)
        self.port = self._http.port
        cfg = replace(self.config, worker_id=self.config.worker_id or f"standin-{self.port}")
        self.config = cfg
        self.scheduler = StandinScheduler(
            cfg,
            self.role,
            kv_publisher=self.kv_publisher,
            fpm_publisher=self.fpm_publisher,
            rooms=self.rooms,
        )
        if self.role == "prefill" or (self.role != "null" and self.enable_pd_role_switch):
            app = bootstrap_app(self.rooms, page_size=cfg.page_size, http_port=self.port)
            self._bootstrap = _Uvicorn(app, self.host, self.bootstrap_port)
            self.bootstrap_port = self._bootstrap.port
            self._bootstrap.start()
        self.scheduler.start()
        self._http.start()
        self._started_at = time.time()
        self.endpoints = StandinEndpoints(
            f"http://{self.host}:{self.port}",
            self.kv_publisher.endpoint if self.kv_publisher else None,
            self.kv_publisher.replay_endpoint if self.kv_publisher else None,
            self.fpm_publisher.endpoint if self.fpm_publisher else None,
            self.bootstrap_port if self._bootstrap else None,
        )
        return self.endpoints

    def stop(self) -> None:
        for server in (self._http, self._bootstrap):
            if server is not None:
                server.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        for pub in (self.kv_publisher, self.fpm_publisher):
            if pub is not None:
                pub.close()
        if self._fpm_dir is not None:
            self._fpm_dir.cleanup()

    def __enter__(self) -> StandinEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- state ------------------------------------------------------------------------------

    def is_fully_idle(self) -> bool:
        assert self.scheduler is not None
        return self._inflight == 0 and self.scheduler.is_idle()

    def server_info(self) -> dict[str, Any]:
        """SGLang's /server_info: resolved server args + `kv_events` descriptor + state."""
        cfg = self.config
        kv_cfg = None
        descriptor = None
        if self.kv_publisher is not None:
            kv_cfg = json.dumps(
                {
                    "publisher": "zmq",
                    "endpoint": self.kv_publisher.endpoint,
                    "replay_endpoint": self.kv_publisher.replay_endpoint,
                    "topic": self.kv_topic,
                    "bind": True,
                }
            )
            host, port = _host_port(self.kv_publisher.endpoint)
            descriptor = {
                "publisher": "zmq",
                "endpoint_host": host,
                "endpoint_port_base": port,
                "topic": self.kv_topic,
                "block_size": cfg.page_size,
                "dp_size": 1,
            }
            if self.kv_publisher.replay_endpoint:
                descriptor["replay_endpoint_port_base"] = _host_port(
                    self.kv_publisher.replay_endpoint
                )[1]
        fpm_name = None
        if self.fpm_publisher is not None:
            fpm_name = self.fpm_publisher.endpoint.rsplit(".", 1)[0]
        assert self.scheduler is not None
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
            "enable_forward_pass_metrics": self.fpm_publisher is not None,
            "forward_pass_metrics_worker_id": cfg.worker_id,
            "forward_pass_metrics_ipc_name": fpm_name,
            "forward_pass_metrics_endpoint": self.fpm_publisher.endpoint
            if self.fpm_publisher
            else None,
            "kv_events": descriptor,
            "launch_command": f"python -m cluster.sglang.standin --role {self.role}",
            "startup_time": self._started_at,
            "internal_states": [
                {
                    "num_running_reqs": len(self.scheduler.running),
                    "num_waiting_reqs": len(self.scheduler.waiting),
                    "num_cached_pages": self.scheduler.cache.num_pages,
                    "num_forward_passes": self.scheduler.num_passes,
                }
            ],
            "version": STANDIN_VERSION,
            "frontend": "python",
            "standin": True,
        }

    # --- requests ---------------------------------------------------------------------------

    async def _generate(
        self, input_ids: list[int], max_new_tokens: int, rid: str, body: dict[str, Any]
    ) -> AsyncIterator[tuple[list[int], dict | None, int]]:
        """Yield (output ids so far, finish reason or None, cached tokens) updates."""
        assert self.scheduler is not None
        room = body.get("bootstrap_room")
        role = self.scheduler.role
        if not rid.startswith("HEALTH_CHECK_"):
            self.received.append(
                {
                    "rid": rid,
                    "role": role,
                    "route": body.get("_standin_route", "/generate"),
                    "num_input_tokens": len(input_ids),
                    "bootstrap_host": body.get("bootstrap_host"),
                    "bootstrap_port": body.get("bootstrap_port"),
                    "bootstrap_room": room,
                    "t": time.time(),
                }
            )
        if role != "null" and room is None:
            msg = (
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid={rid!r}"
            )
            yield [], {"type": "abort", "message": msg, "status_code": 400}, 0
            return
        first_token = None
        if role == "decode":
            try:
                res = await wait_for_prefill(
                    self._bootstrap_client(),
                    str(body.get("bootstrap_host") or "127.0.0.1"),
                    int(body.get("bootstrap_port") or 8998),
                    int(room),  # type: ignore[arg-type]
                    self.transfer_timeout_s,
                )
            except (httpx.HTTPError, RuntimeError, TimeoutError) as e:
                yield [], {"type": "abort", "message": str(e), "status_code": 500}, 0
                return
            first_token = res.first_token_id
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[list[int], dict | None]] = asyncio.Queue()

        def on_update(ids: list[int], fin: dict | None) -> None:
            # Called on the scheduler thread: hand the update to this request's event loop.
            loop.call_soon_threadsafe(queue.put_nowait, (ids, fin))

        req = StandinRequest(
            rid=rid,
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            on_update=on_update,
            bootstrap_room=None if room is None else int(room),
            first_token_id=first_token,
        )
        self.scheduler.submit(req)
        while True:
            ids, fin = await queue.get()
            yield ids, fin, req.cached_tokens
            if fin is not None:
                return

    def _bootstrap_client(self) -> httpx.AsyncClient:
        """One client for the decode side's bootstrap calls (building one costs ~40 ms)."""
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient()
        return self._client

    def _track(self, delta: int) -> None:
        with self._inflight_lock:
            self._inflight += delta

    # --- HTTP app ---------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI(title="SGLang stand-in")
        engine = self

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/health_generate")
        async def health_generate() -> Response:
            # Like SGLang: skipped while busy; in PD mode the stand-in checks its scheduler
            # thread instead of faking a bootstrap room.
            assert engine.scheduler is not None
            if engine.scheduler.role != "null" or not engine.is_fully_idle():
                alive = engine.scheduler._thread.is_alive()
                return Response(status_code=200 if alive else 503)
            rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
            async for _ids, fin, _c in engine._generate([0], 1, rid, {}):
                if fin is not None and fin.get("type") == "abort":
                    return Response(status_code=503)
            return Response(status_code=200)

        @app.get("/server_info")
        async def server_info() -> dict[str, Any]:
            return engine.server_info()

        @app.get("/get_server_info")
        async def get_server_info() -> dict[str, Any]:
            return engine.server_info()

        async def model_info() -> dict[str, Any]:
            return {
                "model_path": engine.model_path,
                "served_model_name": engine.model_path,
                "tokenizer_path": engine.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "dummy",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": engine.scheduler.role if engine.scheduler else engine.role,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "standin",
                "architectures": ["StandinForCausalLM"],
            }

        app.get("/model_info")(model_info)
        app.get("/get_model_info")(model_info)

        async def tokenize(request: Request) -> JSONResponse:
            # SGLang's /v1/tokenize (TokenizeRequest -> TokenizeResponse): a prompt string,
            # a list of them, or chat messages rendered with the chat template.
            body = await request.json()
            prompt, messages = body.get("prompt"), body.get("messages")
            if messages is not None:
                if not isinstance(messages, list) or not messages:
                    return _openai_error("messages must be a non-empty list")
                tokens: Any = toy_tokenizer.encode(toy_tokenizer.chat_template(messages))
                count: Any = len(tokens)
            elif isinstance(prompt, str):
                tokens = toy_tokenizer.encode(prompt)
                count = len(tokens)
            elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
                tokens = [toy_tokenizer.encode(p) for p in prompt]
                count = [len(t) for t in tokens]
            else:
                return _openai_error(
                    f"Invalid prompt type: {type(prompt)}. Expected str or List[str]."
                )
            max_len = engine.config.capacity_pages * engine.config.page_size
            return JSONResponse({"tokens": tokens, "count": count, "max_model_len": max_len})

        app.post("/v1/tokenize")(tokenize)
        app.post("/tokenize")(tokenize)

        @app.get("/standin/requests")
        async def standin_requests(limit: int = 1000) -> dict[str, Any]:
            items = list(engine.received)
            return {"requests": items[-limit:] if limit > 0 else []}

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> Response:
            assert engine.scheduler is not None
            sched = engine.scheduler

            def flush() -> bool:
                if engine._inflight or sched.waiting or sched.running:
                    return False
                sched.cache.reset()
                return True

            if sched.run_exclusive(flush):
                return PlainTextResponse(
                    "Cache flushed.\nPlease check backend logs for more details. (When there "
                    "are running or waiting requests, the operation will not be performed.)\n"
                )
            return PlainTextResponse("Flush cache failed.\n", status_code=400)

        @app.post("/pd_role_switch")
        async def pd_role_switch(request: Request) -> JSONResponse:
            body = await request.json()
            return engine._role_switch(body)

        @app.api_route("/generate", methods=["POST", "PUT"])
        async def generate(request: Request) -> Response:
            body = await request.json()
            err = _check_generate(body)
            if err is not None:
                return JSONResponse({"error": {"message": err}}, status_code=400)
            ids = (
                body["input_ids"]
                if body.get("input_ids") is not None
                else toy_tokenizer.encode(body["text"])
            )
            sp = body.get("sampling_params") or {}
            max_new = int(sp.get("max_new_tokens", 128))
            rid = str(body.get("rid") or uuid.uuid4().hex)
            return await engine._respond_native(ids, max_new, rid, body, bool(body.get("stream")))

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                ids = toy_tokenizer.encode(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = list(prompt)
            else:
                return _openai_error("prompt must be a non-empty string or a list of token ids")
            max_new = int(body.get("max_tokens") or 16)
            body["_standin_route"] = "/v1/completions"
            return await engine._respond_openai(ids, max_new, body, chat=False)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body = await request.json()
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _openai_error("messages must be a non-empty list")
            ids = toy_tokenizer.encode(toy_tokenizer.chat_template(messages))
            max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
            body["_standin_route"] = "/v1/chat/completions"
            return await engine._respond_openai(ids, max_new, body, chat=True)

        return app

    def _role_switch(self, body: dict[str, Any]) -> JSONResponse:
        """SGLang's /pd_role_switch: same preconditions, messages and reply fields."""
        assert self.scheduler is not None
        sched = self.scheduler
        new_role = str(body.get("new_role") or "").lower()
        old_role = sched.role

        def reply(success: bool, message: str, safe: bool = False) -> JSONResponse:
            out = {
                "rid": None,
                "http_worker_ipc": None,
                "success": success,
                "message": message,
                "old_role": old_role,
                "new_role": new_role,
                "safe_to_restore": safe,
            }
            return JSONResponse(out, status_code=200 if success else 400)

        if not self.enable_pd_role_switch:
            return reply(False, "--enable-pd-role-switch is not set on this server", True)
        if new_role not in ("prefill", "decode"):
            return reply(False, f"invalid new_role={new_role!r}", True)
        if old_role == "null":
            return reply(False, "instance is not running in PD disaggregation mode", True)
        if new_role == old_role:
            return reply(True, "already in target role")

        def switch() -> str | None:
            if self._inflight or sched.waiting or sched.running:
                return "instance is not idle; drain all requests before switching"
            # An instance that never ran decode has no decode CUDA graphs: SGLang needs the
            # graph footprint of a decode peer before capturing them on the flip.
            if new_role == "decode" and not self._decode_graphs_captured:
                need = body.get("decode_cuda_graph_memory_gb")
                if need is None:
                    return "decode_cuda_graph_memory_gb is required before capturing decode graphs"
                if float(need) < 0:
                    return "decode_cuda_graph_memory_gb must be non-negative"
                if self.free_gpu_memory_gb < float(need):
                    return (
                        "insufficient decode CUDA graph headroom: "
                        f"required={float(need):.3f} GB, available={self.free_gpu_memory_gb:.3f} GB"
                    )
            if body.get("prepare_only"):
                return "ready"
            sched.cache.reset()  # releases the prefix cache -> AllBlocksCleared
            sched.role = new_role  # type: ignore[assignment]
            if new_role == "decode":
                self._decode_graphs_captured = True
            return None

        problem = sched.run_exclusive(switch)
        if problem == "ready":
            return reply(True, "ready", True)
        if problem is not None:
            return reply(False, str(problem), True)
        self.role = new_role  # type: ignore[assignment]
        return reply(True, "ok")

    async def _respond_native(
        self, ids: list[int], max_new: int, rid: str, body: dict[str, Any], stream: bool
    ) -> Response:
        t0 = time.monotonic()

        def out(out_ids: list[int], fin: dict | None, cached: int) -> dict[str, Any]:
            return {
                "text": toy_tokenizer.decode(out_ids),
                "output_ids": out_ids,
                "meta_info": {
                    "id": rid,
                    "finish_reason": fin,
                    "prompt_tokens": len(ids),
                    "weight_version": "default",
                    "num_retractions": 0,
                    "reasoning_tokens": 0,
                    "completion_tokens": len(out_ids),
                    "cached_tokens": cached,
                    "e2e_latency": time.monotonic() - t0,
                },
            }

        if stream:

            async def sse() -> AsyncIterator[bytes]:
                self._track(+1)
                try:
                    async for out_ids, fin, cached in self._generate(ids, max_new, rid, body):
                        yield b"data: " + json.dumps(out(out_ids, fin, cached)).encode() + b"\n\n"
                finally:
                    self._track(-1)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        self._track(+1)
        try:
            last: tuple[list[int], dict | None, int] = ([], None, 0)
            async for item in self._generate(ids, max_new, rid, body):
                last = item
        finally:
            self._track(-1)
        fin = last[1] or {}
        if fin.get("type") == "abort":
            return JSONResponse(
                {"error": {"message": fin["message"]}}, status_code=fin.get("status_code", 400)
            )
        return JSONResponse(out(*last))

    async def _respond_openai(
        self, ids: list[int], max_new: int, body: dict[str, Any], chat: bool
    ) -> Response:
        rid = uuid.uuid4().hex
        created = int(time.time())
        model = str(body.get("model") or self.model_path)
        kind = "chat.completion" if chat else "text_completion"
        stream = bool(body.get("stream"))

        def usage(n_out: int, cached: int) -> dict[str, Any]:
            return {
                "prompt_tokens": len(ids),
                "completion_tokens": n_out,
                "total_tokens": len(ids) + n_out,
                "prompt_tokens_details": {"cached_tokens": cached},
            }

        def choice(text: str, fin: str | None, delta: bool) -> dict[str, Any]:
            if chat:
                key = "delta" if delta else "message"
                msg = {"role": "assistant", "content": text} if not delta else {"content": text}
                return {
                    "index": 0,
                    key: msg,
                    "logprobs": None,
                    "finish_reason": fin,
                    "matched_stop": None,
                }
            return {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": fin,
                "matched_stop": None,
            }

        if stream:

            async def sse() -> AsyncIterator[bytes]:
                self._track(+1)
                sent = 0
                try:
                    async for out_ids, fin, cached in self._generate(ids, max_new, rid, body):
                        if fin is not None and fin.get("type") == "abort":
                            err = {
                                "error": {
                                    "message": fin["message"],
                                    "type": "BadRequestError",
                                    "code": fin.get("status_code", 400),
                                }
                            }
                            yield b"data: " + json.dumps(err).encode() + b"\n\n"
                            break
                        text = toy_tokenizer.decode(out_ids[sent:])
                        sent = len(out_ids)
                        chunk = {
                            "id": rid,
                            "object": f"{kind}.chunk" if chat else kind,
                            "created": created,
                            "model": model,
                            "choices": [choice(text, None if fin is None else "length", True)],
                        }
                        if fin is not None:
                            chunk["usage"] = usage(len(out_ids), cached)
                        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                finally:
                    self._track(-1)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        self._track(+1)
        try:
            last: tuple[list[int], dict | None, int] = ([], None, 0)
            async for item in self._generate(ids, max_new, rid, body):
                last = item
        finally:
            self._track(-1)
        out_ids, fin, cached = last
        if fin is not None and fin.get("type") == "abort":
            return _openai_error(fin["message"], fin.get("status_code", 400))
        return JSONResponse(
            {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [choice(toy_tokenizer.decode(out_ids), "length", False)],
                "usage": usage(len(out_ids), cached),
            }
        )


def _check_generate(body: dict[str, Any]) -> str | None:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        return "Either text or input_ids should be provided."
    if text is not None and not isinstance(text, str):
        return "The SGLang stand-in accepts one prompt per request: text must be a string."
    if ids is not None and not (
        isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)
    ):
        return "input_ids must be a non-empty list of token ids (one prompt per request)."
    sp = body.get("sampling_params") or {}
    mnt = sp.get("max_new_tokens", 128)
    if not isinstance(mnt, int) or mnt < 1:
        return f"sampling_params.max_new_tokens must be an int >= 1, got {mnt!r}"
    return None


def _openai_error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(
        {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": status,
        },
        status_code=status,
    )


def _host_port(endpoint: str) -> tuple[str, int]:
    hostport = endpoint.split("://", 1)[1]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


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
    a = p.parse_args(argv)
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
