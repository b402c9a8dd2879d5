"""PD bootstrap shared by pdlab's engines: SGLang's bootstrap server and the room registry.

Real SGLang (`disaggregation/common/conn.py`, `CommonKVBootstrapServer`): the prefill
server runs an HTTP bootstrap server on `--disaggregation-bootstrap-port` (default 8998)
with PUT /route (prefill ranks register rank_ip/rank_port), GET /route (with
prefill_dp_rank = prefill_cp_rank = target_tp_rank = target_pp_rank = -1: the prefill
server's parallel layout; otherwise one rank's {rank_ip, rank_port}), POST
/register_dp_rank, POST /query_dp_ranks and GET /health. The router sends the same request
body with bootstrap_host, bootstrap_port and bootstrap_room to a prefill and a decode
server; the decode server looks the prefill up through this server and receives the KV of
that room over the transfer engine (RDMA) once prefill is done.

pdlab's engines serve those routes (`bootstrap_app`) and replace the RDMA transfer with one
long-poll route of their own, added by each engine to the app: the decode side looks the
prefill up like SGLang and then polls that route (`poll_prefill`). What a finished prefill
leaves for decode waits in a `RoomRegistry` until the route reads it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

R = TypeVar("R")
MAX_LONG_POLL_S = 600.0


class RoomRegistry(Generic[R]):
    """Finished prefills by bootstrap room, bounded by count and by bytes (oldest forgotten
    first; the newest room always stays)."""

    def __init__(
        self,
        *,
        max_rooms: int | None = None,
        max_bytes: int | None = None,
        nbytes: Callable[[R], int] = lambda _: 0,
    ) -> None:
        self._rooms: OrderedDict[int, R] = OrderedDict()
        self._cond = threading.Condition()
        self.max_rooms = max_rooms
        self.max_bytes = max_bytes
        self._nbytes = nbytes
        self._bytes = 0
        self.num_forgotten = 0

    def finish(self, room: int, result: R) -> None:
        with self._cond:
            old = self._rooms.pop(room, None)
            if old is not None:
                self._bytes -= self._nbytes(old)
            self._rooms[room] = result
            self._bytes += self._nbytes(result)
            while len(self._rooms) > 1 and self._over_bound():
                _, gone = self._rooms.popitem(last=False)
                self._bytes -= self._nbytes(gone)
                self.num_forgotten += 1
            self._cond.notify_all()

    def wait(self, room: int, timeout_s: float) -> R | None:
        """Wait for `room` and keep it; None when it did not finish in time."""
        return self._wait(room, timeout_s, remove=False)

    def take(self, room: int, timeout_s: float) -> R | None:
        """Wait for `room` and remove it; None when it did not finish in time."""
        return self._wait(room, timeout_s, remove=True)

    def __len__(self) -> int:
        return len(self._rooms)

    def _over_bound(self) -> bool:
        return (self.max_rooms is not None and len(self._rooms) > self.max_rooms) or (
            self.max_bytes is not None and self._bytes > self.max_bytes
        )

    def _wait(self, room: int, timeout_s: float, *, remove: bool) -> R | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while room not in self._rooms:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if not remove:
                return self._rooms[room]
            out = self._rooms.pop(room)
            self._bytes -= self._nbytes(out)
            return out


def bootstrap_app(
    *, title: str, page_size: int, http_port: int, layout_extra: Mapping[str, Any] = {}
) -> FastAPI:
    """The routes of SGLang's CommonKVBootstrapServer; `layout_extra` joins the layout that
    GET /route answers for -1 ranks. The caller adds its transfer route."""
    app = FastAPI(title=title)
    ranks: dict[tuple[int, ...], dict[str, Any]] = {}
    dp_rank_of_room: dict[int, int] = {}
    layout = {
        "attn_tp_size": 1,
        "attn_cp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "page_size": page_size,
        "kv_cache_dtype": "auto",
        "follow_bootstrap_room": True,
        **layout_extra,
        "prefill_http_port": http_port,
        "decode_allocation_policy": "early",
    }

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
            return layout
        info = ranks.get(key)
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

    return app


def long_poll_s(timeout_s: float) -> float:
    """The wait a transfer route grants a poll asking for `timeout_s` (0 to 600 s)."""
    return min(max(timeout_s, 0.0), MAX_LONG_POLL_S)


def not_finished(room: int, timeout_s: float) -> JSONResponse:
    """A transfer route's 504: the room's prefill did not finish within the poll."""
    return JSONResponse(
        {"error": f"prefill of bootstrap_room={room} not finished within {timeout_s} s"},
        status_code=504,
    )


async def poll_prefill(
    client: httpx.AsyncClient,
    host: str,
    port: int,
    path: str,
    room: int,
    timeout_s: float,
    *,
    max_error_chars: int | None = None,
) -> httpx.Response:
    """Decode side: look the prefill up like SGLang does (GET /route with -1 ranks), then
    long-poll its transfer route `path`/{room}; the 200 answer. Raises RuntimeError when the
    bootstrap server refuses, TimeoutError when the room does not arrive (error bodies cut
    to `max_error_chars`)."""
    base = f"http://{host}:{port}"
    minus = {k: -1 for k in ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
                             "target_pp_rank")}  # fmt: skip
    r = await client.get(f"{base}/route", params=minus, timeout=10.0)
    if r.status_code != 200:
        text = r.text[:max_error_chars]
        raise RuntimeError(f"bootstrap server {base} answered {r.status_code}: {text}")
    r = await client.get(
        f"{base}{path}/{room}",
        params={"timeout_s": timeout_s},
        timeout=timeout_s + 10.0,
    )
    if r.status_code != 200:
        raise TimeoutError(
            f"KV transfer of bootstrap_room={room} failed: {r.text[:max_error_chars]}"
        )
    return r
