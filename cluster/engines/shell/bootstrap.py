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

import asyncio
import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from cluster.engines.shell.guard import guard_app
from cluster.engines.shell.http_input import BadRequest, opt_int, opt_str, read_json

R = TypeVar("R")
MAX_LONG_POLL_S = 600.0
MAX_BOOTSTRAP_BODY_BYTES = 64 << 10  # rank registrations and room lists are small
MAX_RANK = 1 << 20


class RoomRegistry(Generic[R]):
    """Finished prefills by bootstrap room, bounded by count and by bytes (oldest forgotten
    first; the newest room always stays) and, with `max_age_s`, by age: a room whose decode
    side never came (its client went away) is forgotten then, as SGLang's prefill gives up
    a transfer after its bootstrap timeout."""

    def __init__(
        self,
        *,
        max_rooms: int | None = None,
        max_bytes: int | None = None,
        nbytes: Callable[[R], int] = lambda _: 0,
        max_age_s: float | None = None,
    ) -> None:
        self._rooms: OrderedDict[int, R] = OrderedDict()
        self._finished_at: dict[int, float] = {}
        self.max_age_s = max_age_s
        self._cond = threading.Condition()
        self.max_rooms = max_rooms
        self.max_bytes = max_bytes
        self._nbytes = nbytes
        self._bytes = 0
        self.num_forgotten = 0
        self._wakers: dict[int, list[Callable[[], None]]] = {}
        self._closed = False

    def finish(self, room: int, result: R) -> None:
        with self._cond:
            old = self._rooms.pop(room, None)
            if old is not None:
                self._bytes -= self._nbytes(old)
            self._rooms[room] = result
            self._finished_at[room] = time.monotonic()
            self._bytes += self._nbytes(result)
            while len(self._rooms) > 1 and (self._over_bound() or self._expired()):
                self._forget_oldest()
            self._cond.notify_all()
            for wake in self._wakers.get(room, ()):
                wake()

    def wait(self, room: int, timeout_s: float) -> R | None:
        """Wait for `room` and keep it; None when it did not finish in time."""
        return self._wait(room, timeout_s, remove=False)

    def take(self, room: int, timeout_s: float) -> R | None:
        """Wait for `room` and remove it; None when it did not finish in time."""
        return self._wait(room, timeout_s, remove=True)

    def close(self) -> None:
        """The engine is stopping: every wait, now or later, ends with None at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for wakers in self._wakers.values():
                for wake in wakers:
                    wake()

    async def take_async(self, room: int, timeout_s: float) -> R | None:
        """`take` for an event loop: waits without holding a thread (a cancelled wait,
        its client gone, takes nothing)."""
        return await self._wait_async(room, timeout_s, remove=True)

    async def wait_async(self, room: int, timeout_s: float) -> R | None:
        """`wait` for an event loop (see `take_async`)."""
        return await self._wait_async(room, timeout_s, remove=False)

    def __len__(self) -> int:
        return len(self._rooms)

    async def _wait_async(self, room: int, timeout_s: float, *, remove: bool) -> R | None:
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def wake() -> None:  # on the thread that finished the room
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(arrived.set)

        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._wakers.setdefault(room, []).append(wake)
        try:
            while True:
                found = self._wait(room, 0.0, remove=remove)
                left = deadline - time.monotonic()
                if found is not None or left <= 0 or self._closed:
                    return found
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), left)
                arrived.clear()
        finally:
            with self._cond:
                wakers = self._wakers.get(room, [])
                if wake in wakers:
                    wakers.remove(wake)
                if not wakers:
                    self._wakers.pop(room, None)

    def _expired(self) -> bool:
        """Whether the oldest room is past `max_age_s` (call under `_cond`)."""
        if self.max_age_s is None or not self._rooms:
            return False
        oldest = next(iter(self._rooms))
        return time.monotonic() - self._finished_at[oldest] > self.max_age_s

    def _forget_oldest(self) -> None:
        room, gone = self._rooms.popitem(last=False)
        self._finished_at.pop(room, None)
        self._bytes -= self._nbytes(gone)
        self.num_forgotten += 1

    def _over_bound(self) -> bool:
        return (self.max_rooms is not None and len(self._rooms) > self.max_rooms) or (
            self.max_bytes is not None and self._bytes > self.max_bytes
        )

    def _wait(self, room: int, timeout_s: float, *, remove: bool) -> R | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._expired():
                self._forget_oldest()
            while room not in self._rooms:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)
            if not remove:
                return self._rooms[room]
            out = self._rooms.pop(room)
            self._finished_at.pop(room, None)
            self._bytes -= self._nbytes(out)
            return out


def bootstrap_app(
    *,
    title: str,
    page_size: int,
    http_port: int,
    layout_extra: Mapping[str, Any] = {},
    token: str | None = None,
) -> FastAPI:
    """The routes of SGLang's CommonKVBootstrapServer; `layout_extra` joins the layout that
    GET /route answers for -1 ranks. The caller adds its transfer route. Registrations
    (PUT /route, POST /register_dp_rank) are mutations behind the engine's guard."""
    app = guard_app(FastAPI(title=title), token=token, max_body_bytes=MAX_BOOTSTRAP_BODY_BYTES)
    app.state.mutations.update({"/route", "/register_dp_rank"})
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

    async def body_of(request: Request) -> dict[str, Any] | Response:
        try:
            return await read_json(request)
        except BadRequest as e:
            return PlainTextResponse(str(e), status_code=400)
        except ClientDisconnect:
            return Response(status_code=499)

    def rank(data: Mapping[str, Any], key: str, default: int = 0) -> int:
        v = opt_int(data, key, 0, MAX_RANK)
        return default if v is None else v

    @app.get("/health")
    def health() -> PlainTextResponse:
        return PlainTextResponse("OK")

    @app.put("/route")
    async def route_put(request: Request) -> Response:
        data = await body_of(request)
        if isinstance(data, Response):
            return data
        try:
            dp = rank(data, "system_dp_rank", rank(data, "attn_dp_rank"))
            key = (dp, rank(data, "attn_cp_rank"), rank(data, "attn_tp_rank"),
                   rank(data, "pp_rank"))  # fmt: skip
            ip, port = opt_str(data, "rank_ip", 255), opt_int(data, "rank_port", 1, 65535)
            if ip is None or port is None:
                raise BadRequest("rank_ip and rank_port are required")
        except BadRequest as e:
            return PlainTextResponse(str(e), status_code=400)
        if key not in ranks and len(ranks) >= MAX_RANK:
            return PlainTextResponse("too many ranks registered", status_code=400)
        ranks[key] = {"rank_ip": ip, "rank_port": port}
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
        try:
            key = tuple(int(x) for x in q)  # type: ignore[arg-type]
        except ValueError:
            return PlainTextResponse("ranks must be integers", status_code=400)
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
    async def register_dp_rank(request: Request) -> Response:
        data = await body_of(request)
        if isinstance(data, Response):
            return data
        try:
            room = opt_int(data, "bootstrap_room", 0, (1 << 63) - 1)
            dp_rank = opt_int(data, "dp_rank", 0, MAX_RANK)
            if room is None or dp_rank is None:
                raise BadRequest("bootstrap_room and dp_rank are required")
        except BadRequest as e:
            return PlainTextResponse(str(e), status_code=400)
        dp_rank_of_room[room] = dp_rank
        while len(dp_rank_of_room) > MAX_RANK:  # oldest first (dicts keep insertion order)
            dp_rank_of_room.pop(next(iter(dp_rank_of_room)))
        return PlainTextResponse("OK")

    @app.post("/query_dp_ranks")
    async def query_dp_ranks(request: Request) -> Response:
        data = await body_of(request)
        if isinstance(data, Response):
            return data
        rooms = data.get("bootstrap_rooms")
        if not isinstance(rooms, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in rooms
        ):
            return PlainTextResponse("bootstrap_rooms must be a list of integers", 400)
        return JSONResponse({str(r): dp_rank_of_room[r] for r in rooms if r in dp_rank_of_room})

    return app


def long_poll_s(timeout_s: float) -> float:
    """The wait a transfer route grants a poll asking for `timeout_s` (0 to 600 s; NaN: 0)."""
    if math.isnan(timeout_s):
        return 0.0
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
