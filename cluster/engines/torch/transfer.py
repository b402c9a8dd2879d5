"""PD bootstrap and KV transfer between torch engine processes (paper 000 §4.1; SPEC §6).

The prefill engine serves the routes of SGLang's bootstrap server (`CommonKVBootstrapServer`:
GET/PUT /route, POST /register_dp_rank, POST /query_dp_ranks, GET /health;
`cluster.engines.shell.bootstrap`) on its bootstrap port. The router sends the same request, with bootstrap_host, bootstrap_port and
bootstrap_room, to a prefill and a decode engine. When the prefill of a room finishes, the
prefill engine copies the room's KV pages to host memory (`RoomRegistry.finish`); the decode
engine looks the prefill up through GET /route like SGLang, then long-polls
GET /pdlab/kv_transfer/{room}, whose body is the room's KV bytes in place of SGLang's RDMA:

    8-byte big-endian length n | n bytes of JSON meta | raw KV bytes

meta = {bootstrap_room, prompt_tokens, first_token_id, cached_tokens, dtype, shape}, shape
[layers, 2, pages, page_size, kv_heads, head_dim]. The bytes are the pool's own, so the
decode engine's pages equal the prefill's byte for byte. A room is handed out once; rooms
nobody fetches (their client went away) are forgotten oldest first past `max_bytes`, or
`ROOM_MAX_AGE_S` after they finished.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response

from cluster.engines.shell import bootstrap as shell
from cluster.engines.shell.http_input import until_disconnected
from cluster.engines.torch.request import TransferredKV

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)}


@dataclass(frozen=True, slots=True)
class Room:
    """A finished prefill: its KV pages (CPU) and what the decode side continues from."""

    bootstrap_room: int
    prompt_tokens: int
    first_token_id: int
    cached_tokens: int
    kv: torch.Tensor

    def encode(self) -> bytes:
        meta = {
            "bootstrap_room": self.bootstrap_room,
            "prompt_tokens": self.prompt_tokens,
            "first_token_id": self.first_token_id,
            "cached_tokens": self.cached_tokens,
            "dtype": str(self.kv.dtype).removeprefix("torch."),
            "shape": list(self.kv.shape),
        }
        head = json.dumps(meta).encode()
        raw = self.kv.contiguous().view(torch.uint8).numpy().tobytes()
        return len(head).to_bytes(8, "big") + head + raw


def decode_room(payload: bytes) -> Room:
    n = int.from_bytes(payload[:8], "big")
    meta = json.loads(payload[8 : 8 + n])
    dtype = _DTYPES[meta["dtype"]]
    raw = bytearray(payload[8 + n :])
    kv = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(meta["shape"])
    return Room(
        int(meta["bootstrap_room"]),
        int(meta["prompt_tokens"]),
        int(meta["first_token_id"]),
        int(meta["cached_tokens"]),
        kv,
    )


ROOM_MAX_AGE_S = 300.0  # SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT default


class RoomRegistry(shell.RoomRegistry[Room]):
    """Finished prefills by bootstrap room, until fetched (bounded by bytes, and by age: a
    room nobody fetched within `max_age_s` is forgotten, its KV copy freed)."""

    def __init__(self, max_bytes: int = 1 << 30, max_age_s: float = ROOM_MAX_AGE_S) -> None:
        super().__init__(
            max_bytes=max_bytes, nbytes=lambda room: room.kv.nbytes, max_age_s=max_age_s
        )


TRANSFER_PATH = "/pdlab/kv_transfer"


def bootstrap_app(
    registry: RoomRegistry, *, page_size: int, http_port: int, token: str | None = None
) -> FastAPI:
    """The prefill engine's bootstrap server (SGLang's routes plus the KV transfer)."""
    app = shell.bootstrap_app(
        title="pdlab torch engine bootstrap server", page_size=page_size, http_port=http_port,
        token=token,
    )  # fmt: skip

    @app.get(TRANSFER_PATH + "/{room}")
    async def kv_transfer(room: int, request: Request, timeout_s: float = 30.0) -> Response:
        # Waits on the loop, not a worker thread; a decode side that gives up (its client
        # went away) stops the wait, and the room stays for nobody (forgotten by bytes).
        wait = registry.take_async(room, shell.long_poll_s(timeout_s))
        answered, found = await until_disconnected(request, wait)
        if not answered:
            return Response(status_code=499)
        if found is None:
            return shell.not_finished(room, timeout_s)
        return Response(found.encode(), media_type="application/octet-stream")

    return app


async def fetch_room(
    client: httpx.AsyncClient, host: str, port: int, room: int, timeout_s: float
) -> TransferredKV:
    """Decode side: look the prefill up like SGLang, then receive the room's KV bytes."""
    r = await shell.poll_prefill(
        client, host, port, TRANSFER_PATH, room, timeout_s, max_error_chars=200
    )
    got = decode_room(r.content)
    return TransferredKV(got.kv, got.first_token_id, got.cached_tokens)
