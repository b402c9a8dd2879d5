"""The HTTP front end of a torch engine group: one engine's API over DP ranks (SPEC §6).

It serves the routes of a single torch engine (`cluster.engines.shell.sglang_http` and the
torch engine's own), so a client, an agent loop or `pdlab serve` drives a DP×EP group like
one node:

- generation (/generate, /v1/completions, /v1/chat/completions) goes to the rank the
  balancer picks (`dp_coordinator.Balancer`, vLLM's least-loaded rule), with a request id
  (`rid`, SGLang's field) set when the client gave none, and is relayed as it comes
  (SSE streams unchanged); the answer carries `X-data-parallel-rank`;
- /server_info is rank 0's with `dp_size`, `ep_size`, one `internal_states` entry per
  rank (as SGLang lists its DP ranks) and every rank's publishers: the `kv_events`
  descriptor as SGLang's with DP (rank r publishes on port base + r, `dp_size` ranks; the
  group binds them so) and `forward_pass_metrics_endpoints`, one per rank;
  /model_info, GET /kv_eviction and /v1/tokenize are rank 0's;
- /health, /health_generate and the mutations POST /flush_cache, /kv_eviction and
  /pd_role_switch go to every rank (success only if every rank succeeds);
- GET /pdlab/dp_state: the coordinator's counts and waves, and the ranks' URLs.

It takes the same door as a single engine (`shell.guard`): bodies of at most
`max_body_bytes` (413), mutations POST only, JSON only (415) and with the engine token
(401) when the group has one; the ranks hold the same token and the front end sends it
on when it relays a mutation.

In a PD role the group's bootstrap server (`dp_bootstrap`) relays KV fetches to the rank
that prefilled each room; /server_info names its port.

Each request's rank, arrival and end (monotonic clock) go to `frontend.jsonl` in the log
directory (table `assign`), beside the ranks' own logs (`rank_log`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from cluster.engines.shell.guard import guard_app, mutation_route
from cluster.engines.torch.dp_bootstrap import RoomRanks
from cluster.engines.torch.dp_coordinator import Balancer, Coordinator

RANK_HEADER = "X-data-parallel-rank"
GENERATE_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


class FrontendLog:
    """Request assignments as JSON lines (written as requests end)."""

    def __init__(self, directory: str | Path | None) -> None:
        self.path = None if directory is None else Path(directory) / "frontend.jsonl"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def add(self, **row: Any) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"table": "assign", **row}, separators=(",", ":")) + "\n")


def create_frontend_app(
    rank_urls: list[str],
    balancer: Balancer,
    coordinator: Coordinator,
    flog: FrontendLog,
    rooms: RoomRanks | None = None,
    info_overrides: dict[str, Any] | None = None,
    *,
    token: str | None = None,
    max_body_bytes: int,
) -> FastAPI:
    app = guard_app(FastAPI(title="pdlab torch engine group"), token=token,
                    max_body_bytes=max_body_bytes)  # fmt: skip
    state: dict[str, httpx.AsyncClient] = {}
    auth = {} if token is None else {"authorization": f"Bearer {token}"}

    def client() -> httpx.AsyncClient:
        c = state.get("client")
        if c is None or c.is_closed:  # created on the server's own loop
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            c = state["client"] = httpx.AsyncClient(timeout=None, limits=limits)
        return c

    async def each(
        method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> list[httpx.Response]:
        calls = [client().request(method, u + path, json=body, headers=headers, timeout=600.0)
                 for u in rank_urls]  # fmt: skip
        return list(await asyncio.gather(*calls))

    def first_failure(answers: list[httpx.Response]) -> Response:
        bad = next((a for a in answers if a.status_code >= 400), answers[0])
        ctype = bad.headers.get("content-type", "application/json")
        return Response(bad.content, status_code=bad.status_code, media_type=ctype)

    @app.get("/health")
    async def health() -> Response:
        try:
            answers = await each("GET", "/health")
        except httpx.HTTPError:
            return Response(status_code=503)
        return Response(status_code=200 if all(a.status_code == 200 for a in answers) else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        answers = await each("GET", "/health_generate")
        return Response(status_code=200 if all(a.status_code == 200 for a in answers) else 503)

    async def server_info() -> JSONResponse:
        infos = [a.json() for a in await each("GET", "/server_info")]
        info = dict(infos[0])
        info["internal_states"] = [s for i in infos for s in i.get("internal_states", [])]
        info |= {"dp_size": len(rank_urls), "ep_size": infos[0].get("ep_size", 1),
                 "dp_rank_urls": rank_urls, "load_balance_method": "vllm-least-loaded"}  # fmt: skip
        info |= publishers(infos)
        info.pop("dp_rank", None)
        info |= info_overrides or {}
        return JSONResponse(info)

    async def from_rank0(request: Request) -> Response:
        body = await request.body()
        r = await client().request(
            request.method, rank_urls[0] + request.url.path, content=body or None,
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )  # fmt: skip
        ctype = r.headers.get("content-type", "application/json")
        return Response(r.content, status_code=r.status_code, media_type=ctype)

    for path in ("/server_info", "/get_server_info"):
        app.get(path)(server_info)
    for path in ("/model_info", "/get_model_info", "/kv_eviction"):
        app.get(path)(from_rank0)
    for path in ("/v1/tokenize", "/tokenize"):
        app.post(path)(from_rank0)

    async def broadcast(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return JSONResponse({"detail": "the body must be JSON"}, status_code=400)
        answers = await each(request.method, request.url.path, body, auth)
        if all(a.status_code < 400 for a in answers):
            ctype = answers[0].headers.get("content-type", "application/json")
            return Response(
                answers[0].content, status_code=answers[0].status_code, media_type=ctype
            )
        return first_failure(answers)

    for path in ("/flush_cache", "/kv_eviction", "/pd_role_switch"):
        mutation_route(app, path)(broadcast)

    @app.get("/pdlab/dp_state")
    async def dp_state() -> dict[str, Any]:
        return {"ranks": rank_urls, **coordinator.state()}

    async def generate(request: Request) -> Response:
        t_arrival = time.monotonic()
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "the body must be JSON"}}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "the body must be an object"}}, 400)
        asked = request.headers.get(RANK_HEADER, body.pop("data_parallel_rank", None))
        named = _rank(asked, len(rank_urls))
        if asked is not None and named is None:
            msg = f"data-parallel rank must be an integer in [0, {len(rank_urls)}), got {asked!r}"
            return JSONResponse({"error": {"message": msg}}, status_code=400)
        rank = balancer.choose(named)
        rid = body["rid"] = str(body.get("rid") or uuid.uuid4().hex)
        room = body.get("bootstrap_room")
        if rooms is not None and isinstance(room, int):
            rooms.put(room, rank)  # a decode engine fetches this room's KV through us
        req = client().build_request("POST", rank_urls[rank] + request.url.path, json=body)
        try:
            r = await client().send(req, stream=True)
        except httpx.HTTPError as e:
            msg = f"DP rank {rank} did not answer: {type(e).__name__}"
            return JSONResponse({"error": {"message": msg}}, status_code=503)
        headers = {RANK_HEADER: str(rank)}
        ctype = r.headers.get("content-type", "application/json")

        async def done() -> None:
            await r.aclose()
            flog.add(rid=rid, rank=rank, route=request.url.path, t_arrival=t_arrival,
                     t_end=time.monotonic(), status=r.status_code)  # fmt: skip

        if ctype.startswith("text/event-stream"):
            return StreamingResponse(r.aiter_raw(), status_code=r.status_code, media_type=ctype,
                                     headers=headers, background=BackgroundTask(done))  # fmt: skip
        content = await r.aread()
        await done()
        return Response(content, status_code=r.status_code, media_type=ctype, headers=headers)

    for path in GENERATE_ROUTES:
        app.api_route(path, methods=["POST", "PUT"] if path == "/generate" else ["POST"])(generate)
    return app


def publishers(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's KV-event and forward-pass publishers, from the ranks' /server_info in
    rank order: SGLang's DP descriptor (rank r on port base + r) when the ranks' ports run
    so, each rank's endpoints (`kv_events_endpoints`, `forward_pass_metrics_endpoints`)."""
    out: dict[str, Any] = {}
    kv = [i.get("kv_events") for i in infos]
    if all(isinstance(k, dict) for k in kv):
        first = dict(kv[0])  # type: ignore[arg-type]
        base = int(first["endpoint_port_base"])
        runs = all(int(k["endpoint_port_base"]) == base + r for r, k in enumerate(kv))  # type: ignore[index]
        if runs:
            first["dp_size"] = len(infos)
        out["kv_events"] = first
        out["kv_events_endpoints"] = [
            f"tcp://{k['endpoint_host']}:{k['endpoint_port_base']}"  # type: ignore[index]
            for k in kv
        ]
    fpm = [i.get("forward_pass_metrics_endpoint") for i in infos]
    if any(fpm):
        out["forward_pass_metrics_endpoints"] = fpm
    return out


def _rank(asked: object, n: int) -> int | None:
    """A named rank in [0, n), or None (absent or invalid)."""
    try:
        rank = int(str(asked)) if asked is not None else None
    except ValueError:
        return None
    return rank if rank is not None and 0 <= rank < n else None
