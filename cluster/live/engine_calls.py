"""One PD attempt against two SGLang engines, the way SGLang's routers do it (SPEC §6).

The same body, plus bootstrap_host, bootstrap_port (the prefill server's bootstrap server)
and a random 63-bit bootstrap_room, goes to the prefill and the decode server concurrently.
The attempt commits when the decode side produced its first SSE event (stream) or its whole
answer; an engine failing before that is an `EngineFailure` (retryable on a 5xx or a broken
connection, `down` when the engine looks dead). `EngineCalls` owns the HTTP clients (one per
event loop), the engines' auth headers and the timeouts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import httpx

from cluster.live.cluster_file import EngineSpec
from cluster.live.live_request import EngineFailure, LiveRequest
from cluster.sglang.payloads import cached_tokens, event_error, sse_events
from cluster.sglang.stamps import EMITTED, stamps

# A decode answer whose failure may be the prefill's death: wait this long for the prefill
# call to tell (both sockets break at once when an engine host dies).
BLAME_GRACE_S = 1.0
# Idle connections to engines are dropped after this long, well before the engines' HTTP
# servers close them (uvicorn's keep-alive timeout, 5 s in SGLang and here; httpx's own
# default is 5 s too): a request sent on a connection the server is closing fails with a
# read error, which would mark a healthy engine down.
KEEPALIVE_EXPIRY_S = 2.0
DOWN_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)

PrefillDone = Callable[[LiveRequest, int, int | None], None]  # (request, node, engine cached)


class Plan(NamedTuple):
    prefill: EngineSpec
    decode: EngineSpec
    bootstrap_host: str
    bootstrap_port: int
    room: int


class Committed(NamedTuple):
    """The decode side produced its first event (stream) or its whole answer."""

    response: httpx.Response
    head: bytes
    chunks: AsyncIterator[bytes] | None
    prefill: asyncio.Task[dict[str, Any] | None]


class EngineCalls:
    """See module docstring."""

    def __init__(self, api_key: str | None, timeout: httpx.Timeout) -> None:
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self._clients: dict[int, httpx.AsyncClient] = {}

    def client(self) -> httpx.AsyncClient:
        """One client per event loop (the server's loop; a test's loop)."""
        loop = asyncio.get_running_loop()
        c = self._clients.get(id(loop))
        if c is None or c.is_closed:
            c = httpx.AsyncClient(
                timeout=self.timeout,
                limits=httpx.Limits(
                    max_connections=None,
                    max_keepalive_connections=256,
                    keepalive_expiry=KEEPALIVE_EXPIRY_S,
                ),
            )
            self._clients[id(loop)] = c
        return c

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        c = self._clients.pop(id(loop), None)
        if c is not None:
            await c.aclose()

    async def attempt(
        self, rec: LiveRequest, plan: Plan, body: dict[str, Any], on_prefill_done: PrefillDone
    ) -> Committed | EngineFailure:
        sent = {
            **body,
            "bootstrap_host": plan.bootstrap_host,
            "bootstrap_port": plan.bootstrap_port,
            "bootstrap_room": plan.room,
        }
        p_task = asyncio.create_task(self._prefill_call(rec, plan.prefill, sent, on_prefill_done))
        d_task = asyncio.create_task(self._decode_open(rec, plan.decode, sent))
        waiting: set[asyncio.Task[Any]] = {p_task, d_task}
        handed = False
        try:
            while True:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if p_task in done and p_task.exception() is not None:
                    return self.failure(p_task.exception(), plan.prefill)
                if d_task in done:
                    exc = d_task.exception()
                    if exc is None:
                        resp, head, chunks = d_task.result()
                        handed = True
                        return Committed(resp, head, chunks, p_task)
                    if isinstance(exc, EngineFailure) and exc.retryable and not p_task.done():
                        # A decode 5xx may be the prefill's death seen through the bootstrap.
                        await asyncio.wait({p_task}, timeout=BLAME_GRACE_S)
                    if p_task.done() and p_task.exception() is not None:
                        return self.failure(p_task.exception(), plan.prefill)
                    return self.failure(exc, plan.decode)
                waiting = {d_task}
        finally:
            if not handed:
                # The client gets nothing from this attempt (it failed, or the client went
                # away): closing both connections makes the engines abort what they hold.
                d_task.cancel()
                p_task.cancel()
                await asyncio.gather(d_task, p_task, return_exceptions=True)
                if not d_task.cancelled() and d_task.exception() is None:
                    await d_task.result()[0].aclose()  # opened just before the cancel

    @staticmethod
    def failure(exc: BaseException | None, spec: EngineSpec) -> EngineFailure:
        if isinstance(exc, EngineFailure):
            return exc
        if isinstance(exc, httpx.HTTPError):
            return EngineFailure(
                spec.node_id,
                spec.http_url,
                f"{type(exc).__name__}: {exc or 'connection failed'}",
                status=502,
                down=isinstance(exc, DOWN_ERRORS),
                retryable=True,
            )
        return EngineFailure(
            spec.node_id, spec.http_url, repr(exc), status=500, down=False, retryable=False
        )

    async def _prefill_call(
        self, rec: LiveRequest, spec: EngineSpec, body: dict[str, Any], on_done: PrefillDone
    ) -> dict[str, Any] | None:
        """POST to the prefill server and read its whole answer; the last payload is kept."""
        url = spec.http_url + rec.route
        async with self.client().stream(
            "POST", url, json=body, headers=self.headers, timeout=self.timeout
        ) as resp:
            raw = await resp.aread()
        if resp.status_code != 200:
            raise _refused(spec, "prefill", resp.status_code, raw)
        if rec.stream:
            events, _ = sse_events(raw if raw.endswith(b"\n\n") else raw + b"\n\n")
            last = next((e for e in reversed(events) if isinstance(e, dict)), None)
        else:
            try:
                last = json.loads(raw)
            except ValueError:
                last = None
        problem = event_error(last)
        if problem is not None:
            raise _aborted(spec, "prefill", *problem)
        rec.prefill_stamps = stamps(last)
        on_done(rec, spec.node_id, cached_tokens(last))
        return last if isinstance(last, dict) else None

    async def _decode_open(
        self, rec: LiveRequest, spec: EngineSpec, body: dict[str, Any]
    ) -> tuple[httpx.Response, bytes, AsyncIterator[bytes] | None]:
        """POST to the decode server; return at its first SSE event (stream) or its answer."""
        client = self.client()
        req = client.build_request(
            "POST", spec.http_url + rec.route, json=body, headers=self.headers, timeout=self.timeout
        )
        resp = await client.send(req, stream=True)
        try:
            if resp.status_code != 200:
                raw = await resp.aread()
                raise _refused(spec, "decode", resp.status_code, raw)
            if not rec.stream:
                raw = await resp.aread()
                try:
                    problem = event_error(json.loads(raw))
                except ValueError:
                    problem = None
                if problem is not None:
                    raise _aborted(spec, "decode", *problem)
                try:
                    got = stamps(json.loads(raw))
                except ValueError:
                    got = {}
                # one answer: its emitted_ts is the last token's; the first's is unknown
                rec.last_emit_ts = got.pop(EMITTED, None)
                rec.decode_stamps = got
                return resp, raw, None
            chunks = resp.aiter_raw()
            head = b""
            async for chunk in chunks:
                head += chunk
                events, _ = sse_events(head)
                if events:
                    problem = event_error(events[0])
                    if problem is not None:
                        raise _aborted(spec, "decode", *problem)
                    rec.decode_stamps = stamps(events[0])
                    return resp, head, chunks
            raise EngineFailure(
                spec.node_id,
                spec.http_url,
                "decode stream ended before its first event",
                status=502,
                down=False,
                retryable=True,
            )
        except BaseException:
            await resp.aclose()
            raise


def _refused(spec: EngineSpec, phase: str, status: int, raw: bytes) -> EngineFailure:
    """The engine answered `status`, not 200 (its body's start quoted)."""
    text = raw[:300].decode("utf-8", "replace")
    return _answered(spec, f"{phase} answered {status}: {text}", status)


def _aborted(spec: EngineSpec, phase: str, message: str, status: int) -> EngineFailure:
    """The engine answered with an abort as the request's finish reason."""
    return _answered(spec, f"{phase} aborted the request ({status}): {message}", status)


def _answered(spec: EngineSpec, message: str, status: int) -> EngineFailure:
    # The engine is up (it answered); a server error may pass on another engine.
    return EngineFailure(
        spec.node_id, spec.http_url, message, status=status, down=False, retryable=status >= 500
    )
