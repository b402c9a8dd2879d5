"""The PD bootstrap server of a torch engine group in a prefill role (SPEC §6).

A decode engine finds a prefill through SGLang's bootstrap routes at the bootstrap port the
router names, then fetches the room's KV (`cluster.engines.torch.transfer`). For a group,
that port is the front end's: it serves SGLang's routes (`shell.bootstrap.bootstrap_app`)
and relays each KV fetch to the bootstrap server of the rank that prefilled the room — the
front end notes the rank of every request with a `bootstrap_room` it forwards
(`RoomRanks`); a fetch that comes before its request waits for it within its long poll.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import httpx
from fastapi import FastAPI
from fastapi.responses import Response

from cluster.engines.shell import bootstrap as shell

TRANSFER_PATH = "/pdlab/kv_transfer"  # = cluster.engines.torch.transfer.TRANSFER_PATH
MAX_ROOMS = 100_000


class RoomRanks:
    """Which rank got each bootstrap room (the newest MAX_ROOMS); thread-safe."""

    def __init__(self) -> None:
        self._ranks: OrderedDict[int, int] = OrderedDict()
        self._cond = threading.Condition()

    def put(self, room: int, rank: int) -> None:
        with self._cond:
            self._ranks[room] = rank
            while len(self._ranks) > MAX_ROOMS:
                self._ranks.popitem(last=False)
            self._cond.notify_all()

    def wait(self, room: int, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while room not in self._ranks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._ranks[room]


def group_bootstrap_app(
    rooms: RoomRanks, rank_bootstrap_urls: list[str], *, page_size: int, http_port: int,
    token: str | None = None,
) -> FastAPI:  # fmt: skip
    """SGLang's bootstrap routes plus the KV fetch, relayed to the room's rank; its
    registrations need the group's `token` (`shell.bootstrap.bootstrap_app`)."""
    app = shell.bootstrap_app(
        title="pdlab torch engine group bootstrap server", page_size=page_size,
        http_port=http_port, token=token,
    )  # fmt: skip
    client = httpx.Client()

    @app.get(TRANSFER_PATH + "/{room}")
    def kv_transfer(room: int, timeout_s: float = 30.0) -> Response:
        # A sync route: FastAPI runs it on a worker thread, so the waits block no loop.
        t0 = time.monotonic()
        wait = shell.long_poll_s(timeout_s)
        rank = rooms.wait(room, wait)
        if rank is None:
            return shell.not_finished(room, timeout_s)
        left = max(wait - (time.monotonic() - t0), 0.0)
        r = client.get(f"{rank_bootstrap_urls[rank]}{TRANSFER_PATH}/{room}",
                       params={"timeout_s": left}, timeout=left + 10.0)  # fmt: skip
        ctype = r.headers.get("content-type", "application/octet-stream")
        return Response(r.content, status_code=r.status_code, media_type=ctype)

    return app
