"""PD bootstrap of the SGLang stand-in: the prefill side's transfer route and the decode wait.

The stand-in serves SGLang's bootstrap routes (`cluster.engines.shell.bootstrap`) and
replaces the RDMA transfer with one stand-in-only route, GET /standin/kv_transfer/{room}
?timeout_s=S, a long poll that answers when the prefill of `room` has finished
({bootstrap_room, prompt_tokens, first_token_id}) or 504 when it has not within S seconds.
There are no KV bytes to move: the decode side continues from the first token. A
`RoomRegistry` of `RoomResult`s is what prefill writes and that route reads (rooms stay
until 100,000 newer ones push them out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from cluster.engines.shell import bootstrap as shell
from cluster.engines.shell.http_input import until_disconnected


@dataclass(frozen=True, slots=True)
class RoomResult:
    """What the decode side needs from a finished prefill of one bootstrap room."""

    bootstrap_room: int
    prompt_tokens: int
    first_token_id: int


class RoomRegistry(shell.RoomRegistry[RoomResult]):
    """Finished prefills by bootstrap room (bounded; oldest forgotten first)."""

    def __init__(self, max_rooms: int = 100_000) -> None:
        super().__init__(max_rooms=max_rooms)


TRANSFER_PATH = "/standin/kv_transfer"


def bootstrap_app(
    registry: RoomRegistry, *, page_size: int, http_port: int, token: str | None = None
) -> FastAPI:
    """The prefill stand-in's bootstrap server (SGLang's routes plus the transfer poll)."""
    app = shell.bootstrap_app(
        title="SGLang stand-in bootstrap server",
        page_size=page_size,
        http_port=http_port,
        layout_extra={"enable_dsa_cache_layer_split": False, "enable_kv_cache_sharding": False},
        token=token,
    )

    @app.get(TRANSFER_PATH + "/{room}")
    async def kv_transfer(room: int, request: Request, timeout_s: float = 30.0) -> Any:
        # Waits on the loop, not a worker thread; stops when the decode side gives up.
        wait = registry.wait_async(room, shell.long_poll_s(timeout_s))
        answered, result = await until_disconnected(request, wait)
        if not answered:
            return Response(status_code=499)
        if result is None:
            return shell.not_finished(room, timeout_s)
        return {
            "bootstrap_room": result.bootstrap_room,
            "prompt_tokens": result.prompt_tokens,
            "first_token_id": result.first_token_id,
        }

    return app


async def wait_for_prefill(
    client: httpx.AsyncClient, host: str, port: int, room: int, timeout_s: float
) -> RoomResult:
    """Decode side: look the prefill up like SGLang does, then wait for its room's result."""
    r = await shell.poll_prefill(client, host, port, TRANSFER_PATH, room, timeout_s)
    d = r.json()
    return RoomResult(int(d["bootstrap_room"]), int(d["prompt_tokens"]), int(d["first_token_id"]))
