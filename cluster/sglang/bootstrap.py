"""PD bootstrap of the SGLang stand-in: the prefill side's bootstrap server and the decode wait.

Real SGLang (`disaggregation/common/conn.py`, `CommonKVBootstrapServer`): the prefill
server runs an HTTP bootstrap server on `--disaggregation-bootstrap-port` (default 8998)
with PUT /route (prefill ranks register rank_ip/rank_port), GET /route (with
prefill_dp_rank = prefill_cp_rank = target_tp_rank = target_pp_rank = -1: the prefill
server's parallel layout; otherwise one rank's {rank_ip, rank_port}), POST
/register_dp_rank, POST /query_dp_ranks and GET /health. The router sends the same request
body with bootstrap_host, bootstrap_port and bootstrap_room to a prefill and a decode
server; the decode server looks the prefill up through this server and receives the KV of
that room over the transfer engine (RDMA) once prefill is done.

The stand-in serves the same routes and replaces the RDMA transfer with one stand-in-only
route, GET /standin/kv_transfer/{room}?timeout_s=S, a long poll that answers when the
prefill of `room` has finished ({bootstrap_room, prompt_tokens, first_token_id}) or 504
when it has not within S seconds. `RoomRegistry` is what prefill writes and that route reads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


@dataclass(frozen=True, slots=True)
class RoomResult:
    """What the decode side needs from a finished prefill of one bootstrap room."""

    bootstrap_room: int
    prompt_tokens: int
    first_token_id: int


class RoomRegistry:
    """Finished prefills by bootstrap room (bounded; oldest forgotten first)."""

    def __init__(self, max_rooms: int = 100_000) -> None:
        self._rooms: dict[int, RoomResult] = {}
        self._cond = threading.Condition()
        self._max = max_rooms

    def finish(self, result: RoomResult) -> None:
        with self._cond:
            self._rooms[result.bootstrap_room] = result
            while len(self._rooms) > self._max:
                self._rooms.pop(next(iter(self._rooms)))
            self._cond.notify_all()

    def wait(self, room: int, timeout_s: float) -> RoomResult | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while room not in self._rooms:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._rooms[room]


def bootstrap_app(registry: RoomRegistry, *, page_size: int, http_port: int) -> FastAPI:
    """The prefill stand-in's bootstrap server (routes of SGLang's CommonKVBootstrapServer)."""
    app = FastAPI(title="SGLang stand-in bootstrap server")
    ranks: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    dp_rank_of_room: dict[int, int] = {}

    @app.get("/health")
    def health() -> PlainTextResponse:
        return PlainTextResponse("OK")

    @app.put("/route")
    async def route_put(request: Request) -> PlainTextResponse:
        data = await request.json()
        key = (
            int(data.get("system_dp_rank", data.get("attn_dp_rank", 0))),
            int(data.get("attn_cp_rank", 0)),
            int(data.get("attn_tp_rank", 0)),
            int(data.get("pp_rank", 0)),
        )
        ranks[key] = {"rank_ip": data["rank_ip"], "rank_port": int(data["rank_port"])}
        return PlainTextResponse("OK")

    @app.get("/route")
    def route_get(
        prefill_dp_rank: str | None = None,
        prefill_cp_rank: str | None = None,
        target_tp_rank: str | None = None,
        target_pp_rank: str | None = None,
    ) -> Any:
        q = (prefill_dp_rank, prefill_cp_rank, target_tp_rank, target_pp_rank)
        if not all(q):
            return PlainTextResponse("Missing inputs for bootstrap server.", status_code=400)
        key = tuple(int(x) for x in q)  # type: ignore[arg-type]
        if key == (-1, -1, -1, -1):
            return {
                "attn_tp_size": 1,
                "attn_cp_size": 1,
                "dp_size": 1,
                "pp_size": 1,
                "page_size": page_size,
                "kv_cache_dtype": "auto",
                "follow_bootstrap_room": True,
                "enable_dsa_cache_layer_split": False,
                "enable_kv_cache_sharding": False,
                "prefill_http_port": http_port,
                "decode_allocation_policy": "early",
            }
        info = ranks.get(key)  # type: ignore[arg-type]
        if info is None:
            return PlainTextResponse(
                f"Bootstrap info not found for dp_rank={q[0]} cp_rank={q[1]} "
                f"tp_rank={q[2]} pp_rank={q[3]}",
                status_code=404,
            )
        return info

    @app.post("/register_dp_rank")
    async def register_dp_rank(request: Request) -> PlainTextResponse:
        data = await request.json()
        dp_rank_of_room[int(data["bootstrap_room"])] = int(data["dp_rank"])
        return PlainTextResponse("OK")

    @app.post("/query_dp_ranks")
    async def query_dp_ranks(request: Request) -> dict[str, int]:
        data = await request.json()
        rooms = (int(r) for r in data["bootstrap_rooms"])
        return {str(r): dp_rank_of_room[r] for r in rooms if r in dp_rank_of_room}

    @app.get("/standin/kv_transfer/{room}")
    def kv_transfer(room: int, timeout_s: float = 30.0) -> Any:
        # A sync route: FastAPI runs it on a worker thread, so the long poll blocks no loop.
        result = registry.wait(room, min(max(timeout_s, 0.0), 600.0))
        if result is None:
            return JSONResponse(
                {"error": f"prefill of bootstrap_room={room} not finished within {timeout_s} s"},
                status_code=504,
            )
        return {
            "bootstrap_room": result.bootstrap_room,
            "prompt_tokens": result.prompt_tokens,
            "first_token_id": result.first_token_id,
        }

    return app


async def wait_for_prefill(
    client: httpx.AsyncClient, host: str, port: int, room: int, timeout_s: float
) -> RoomResult:
    """Decode side: look the prefill up like SGLang does, then wait for its room's KV."""
    base = f"http://{host}:{port}"
    r = await client.get(
        f"{base}/route",
        params={
            "prefill_dp_rank": -1,
            "prefill_cp_rank": -1,
            "target_tp_rank": -1,
            "target_pp_rank": -1,
        },
        timeout=10.0,
    )
    if r.status_code != 200:
        raise RuntimeError(f"bootstrap server {base} answered {r.status_code}: {r.text}")
    r = await client.get(
        f"{base}/standin/kv_transfer/{room}",
        params={"timeout_s": timeout_s},
        timeout=timeout_s + 10.0,
    )
    if r.status_code != 200:
        raise TimeoutError(f"KV transfer of bootstrap_room={room} failed: {r.text}")
    d = r.json()
    return RoomResult(int(d["bootstrap_room"]), int(d["prompt_tokens"]), int(d["first_token_id"]))
