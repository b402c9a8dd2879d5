"""The data-plane router of a live SGLang PD cluster (paper 000 Fig. 1, Alg. E.1–E.3; SPEC §6).

An HTTP proxy in front of SGLang prefill and decode servers for /generate,
/v1/completions and /v1/chat/completions. Per request it:

1. reads the branch identity from headers (`live_request.branch_identity`: `X-Branch-Id`,
   `X-Branch-Kind`, `X-Parent-Branch-Id`, `X-Program-Id`);
2. takes the prompt's token ids (`cluster.live.tokens`) and hashes their full pages into
   the request's path, the key the KV directory indexes the engines' blocks by;
3. under the control-plane lock, admits it (`ControlPlane.admit`: branch update, routing by
   the control plane's router, counts) and binds the decode node at once (SGLang's PD
   protocol needs both ends before prefill starts, so the binding of Alg. E.3 l.13 happens at
   admission);
4. implements the PD bootstrap protocol as SGLang's routers do (`engine_calls`): the same
   body, plus bootstrap_host, bootstrap_port and a random 63-bit bootstrap_room, goes to the
   prefill and the decode server concurrently; the client gets the decode server's
   response, streamed through (SSE) unchanged;
5. retries on another engine when an engine fails before the first token reaches the
   client (connection refused or reset: the node is also marked down; a 5xx answer); after
   that point a failure ends the stream with an SSE error event naming the engine; a client
   that goes away, before its answer or mid-stream, closes both engine connections, so the
   engines abort the request and free its KV (SGLang aborts a disconnected request);
6. reports progress to the control plane: prefill done (`on_prefill_done`), KV arrived at
   decode (`on_transfer_done`, at the first decode token), request done (`on_request_done`
   with t_c from the engine's cached_tokens), one `requests` row per request.

Answers carry X-PD-Request-Id, X-PD-Prefill-Node, X-PD-Decode-Node, X-PD-Bootstrap-Room
and X-PD-Attempts. `POST /v1/branches/{id}/finish` ends a branch (releases its counts, Alg.
E.2). The proxy's own accounting of requests in flight per engine (`inflight.InFlight`) is
what the phase switch drains and what the node reports carry as queues; a failed attempt is
undone in the control plane with `ControlPlane.release_placement`. `GET /health` answers 200 while at least one prefill and
one decode engine are available.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from cluster.control import QueuedWork
from cluster.core import ConfigError
from cluster.kv.hashing import TokenPathCache
from cluster.live.cluster_file import ClusterSettings, EngineSpec
from cluster.live.engine_calls import DOWN_ERRORS, Committed, EngineCalls, Plan
from cluster.live.inflight import InFlight
from cluster.live.live_request import (
    Branch,
    EngineFailure,
    LiveRequest,
    branch_identity,
)
from cluster.live.tokens import (
    TokenizeError,
    estimate_tokens,
    make_tokenizer,
    max_new_tokens,
    prompt_of,
)
from cluster.sglang.payloads import error_json, output_tokens, sse_events
from cluster.sglang.stamps import emitted

if TYPE_CHECKING:
    from cluster.control import ControlPlane

log = logging.getLogger(__name__)
T = TypeVar("T")


class ProxyHost(Protocol):
    """What the proxy needs from the live cluster that owns it (`SGLangCluster`)."""

    cp: ControlPlane
    settings: ClusterSettings

    def now(self) -> float: ...

    def engine(self, node: int) -> EngineSpec: ...

    def tokenizer_url(self) -> str | None: ...

    def mark_down(self, node: int, reason: str) -> None: ...

    def refresh_report(self, node: int) -> None: ...

    def record_request(self, rec: LiveRequest) -> None: ...


class PDProxy:
    """See module docstring. `handle`, `finish_branch` and `health` serve the routes
    (`serving.add_data_plane` mounts them)."""

    def __init__(self, host: ProxyHost) -> None:
        self.host = host
        s = host.settings
        timeout = httpx.Timeout(s.request_timeout_s, connect=s.connect_timeout_s)
        self.calls = EngineCalls(s.api_key, timeout)
        self.headers = self.calls.headers
        self.tokenizer = make_tokenizer(s.tokenizer, self.calls.client, self.headers)
        self.inflight = InFlight()
        # Block hashes per branch: a request hashes only the blocks its new tokens complete.
        self.paths = TokenPathCache(host.cp.config.block_tokens)
        self.num_requests = 0
        self.num_errors = 0
        self.num_retries = 0
        self._rng = random.SystemRandom()

    # ---- accounting (read under cp.lock) --------------------------------------------
    def outstanding(self, node: int) -> int:
        """Requests sent to `node` and not yet answered (the drain of a phase switch)."""
        return self.inflight.outstanding(node)

    def prefill_queue(self, node: int) -> list[QueuedWork]:
        return self.inflight.prefill_queue(node)

    def decode_running(self, node: int) -> int:
        return self.inflight.decode_running(node)

    async def aclose(self) -> None:
        await self.calls.aclose()

    # ---- routes -------------------------------------------------------------------------
    async def health(self) -> Response:
        cp = self.host.cp
        with cp.lock:
            p, d = cp.available("prefill"), cp.available("decode")
        body = {"prefill": p, "decode": d}
        return JSONResponse(body, status_code=200 if p and d else 503)

    async def finish_branch(self, branch_id: str) -> JSONResponse:
        cp = self.host.cp
        with cp.lock:
            b = cp.branch(branch_id)
            if b is None:
                return JSONResponse(
                    {
                        "detail": f"unknown branch {branch_id!r}: not active (never seen or finished)"
                    },
                    status_code=404,
                )
            nodes = b.nodes
            cp.on_branch_finish(branch_id, self.host.now())
            self.paths.forget(branch_id)
        return JSONResponse({"branch_id": branch_id, "finished": True, "released_nodes": nodes})

    async def handle(self, route: str, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_json("the request body must be JSON", 400), 400)
        except ClientDisconnect:  # gone before its body arrived: nothing to route
            return Response(status_code=499)
        if not isinstance(body, dict):
            return JSONResponse(error_json("the request body must be a JSON object", 400), 400)
        rid = str(body.get("rid") or uuid.uuid4().hex) if route == "/generate" else uuid.uuid4().hex
        try:
            branch = branch_identity(request.headers, rid)
            prompt = prompt_of(route, body)
            ids = await self.tokenizer.encode(prompt, self.host.tokenizer_url())
        except (ValueError, TokenizeError) as e:
            status = getattr(e, "status", 400)
            return JSONResponse(error_json(str(e), status), status)
        host, cp = self.host, self.host.cp
        with cp.lock:
            path = self.paths.path(branch.branch_id, ids) if ids else []
        t_in = len(ids) if ids else estimate_tokens(prompt)
        with cp.lock:
            program = branch.program_id
            if program is None and branch.parent_id is not None:
                parent = cp.branch(branch.parent_id)
                program = parent.program_id if parent is not None else None
            rec = LiveRequest(
                request_id=rid,
                program_id=program or branch.branch_id,
                branch_id=branch.branch_id,
                route=route,
                stream=bool(body.get("stream")),
                t_arrival=host.now(),
                t_in=t_in,
                path=path,
                anonymous=branch.anonymous,
                kv_tokens=t_in + max_new_tokens(route, body),
            )
            self.num_requests += 1
        answered, response = await _until_disconnected(request, self._attempts(rec, branch, body))
        if answered and response is not None:
            return response
        # The client went away before its answer: the attempt in flight was cancelled,
        # which closed both engine connections, so the engines abort the request and free
        # its KV and seat, as SGLang's do (and its routers, on a client disconnect).
        self._finish(rec, ok=False, error="the client disconnected before its answer")
        return Response(status_code=499)

    async def _attempts(self, rec: LiveRequest, branch: Branch, body: dict[str, Any]) -> Response:
        """Place and send `rec` until an engine answers or the retries run out."""
        host, rid = self.host, rec.request_id
        failure: EngineFailure | None = None
        for attempt in range(host.settings.max_retries + 1):
            try:
                plan = self._place(rec, branch, first=attempt == 0)
            except ConfigError as e:
                self._release(rec)
                self._finish(rec, ok=False, error=str(e))
                return JSONResponse(error_json(f"cannot route: {e}", 503), 503)
            rec.attempts = attempt + 1
            outcome = await self.calls.attempt(rec, plan, body, self._on_prefill_done)
            if isinstance(outcome, Committed):
                return await self._respond(rec, outcome)
            failure = outcome
            self._release(rec)
            if failure.down:
                host.mark_down(failure.node, str(failure))
            if not failure.retryable or attempt == host.settings.max_retries:
                break
            self.num_retries += 1
            log.warning(
                "request %s attempt %d failed: %s; retrying on another engine",
                rid,
                attempt + 1,
                failure,
            )
        assert failure is not None
        msg = f"request failed after {rec.attempts} attempt(s): {failure}"
        log.error("request %s: %s", rid, msg)
        self._finish(rec, ok=False, error=msg)
        status = failure.status if not failure.down else 502
        return JSONResponse(error_json(msg, status), status)

    # ---- placement --------------------------------------------------------------------
    def _place(self, rec: LiveRequest, branch: Branch, first: bool) -> Plan:
        """Route prefill, bind decode and count the request in flight (one lock section)."""
        host, cp = self.host, self.host.cp
        with cp.lock:
            now = host.now()
            req = rec.route_request(now)
            if first:
                decision = cp.admit(req, branch_kind=branch.kind, parent_id=branch.parent_id)  # type: ignore[arg-type]
                rec.admitted = True
            else:
                decision = cp.reroute(req)
            p = decision.node_id
            try:
                d = cp.bind_decode(req, p, rec.kv_tokens)
            except ConfigError:
                cp.release_placement(rec.request_id, p)
                raise
            rec.prefill_node, rec.decode_node = p, d
            rec.cached_tokens, rec.engine_cached = decision.cached_tokens, False
            rec.fetch_tokens = decision.fetch_tokens
            rec.t_prefill_start = now
            rec.t_prefill_done = rec.t_first_token = None
            rec.bootstrap_room = self._rng.randrange(1 << 63)
            self.inflight.add(rec, {p, d})
            rec.placed = True
            ps, ds = host.engine(p), host.engine(d)
        if ps.bootstrap_port is None:
            raise ConfigError(
                f"prefill engine {p} ({ps.http_url}) has no bootstrap port (start SGLang with "
                "--disaggregation-mode prefill, or set bootstrap_port in the cluster file)"
            )
        bhost = ps.bootstrap_host or urlsplit(ps.http_url).hostname or "127.0.0.1"
        return Plan(ps, ds, bhost, ps.bootstrap_port, rec.bootstrap_room)

    def _release(self, rec: LiveRequest) -> None:
        """Undo one attempt's placement: in-flight entries, router, pending work, decode."""
        cp = self.host.cp
        with cp.lock:
            if not rec.placed:
                return
            rec.placed = False
            self.inflight.drop(rec)
            if rec.prefill_node is not None:
                cp.release_placement(rec.request_id, rec.prefill_node, rec.decode_node)

    # ---- progress ---------------------------------------------------------------------
    def _on_prefill_done(self, rec: LiveRequest, node: int, cached: int | None) -> None:
        host, cp = self.host, self.host.cp
        with cp.lock:
            now = host.now()
            rec.t_prefill_done = now
            if cached is not None:
                rec.cached_tokens, rec.engine_cached = min(cached, rec.t_in), True
            cp.on_prefill_done(rec.route_request(now), node, now)
            if rec.decode_node != node:
                self.inflight.drop(rec, node)
            host.refresh_report(node)

    # ---- the answer -------------------------------------------------------------------
    def _first_token(self, rec: LiveRequest) -> None:
        host, cp = self.host, self.host.cp
        with cp.lock:
            now = host.now()
            rec.t_first_token = now
            assert rec.decode_node is not None
            cp.on_transfer_done(rec.branch_id, rec.decode_node, now)

    async def _respond(self, rec: LiveRequest, c: Committed) -> Response:
        headers = {
            "X-PD-Request-Id": rec.request_id,
            "X-PD-Prefill-Node": str(rec.prefill_node),
            "X-PD-Decode-Node": str(rec.decode_node),
            "X-PD-Bootstrap-Room": str(rec.bootstrap_room),
            "X-PD-Attempts": str(rec.attempts),
        }
        self._first_token(rec)
        if c.chunks is None:
            try:
                answer = json.loads(c.head)
            except ValueError:  # not JSON: passed through as is, output length unknown
                answer = None
            rec.t_out = output_tokens(answer, 0)
            try:
                await c.response.aclose()
                await self._settle_prefill(rec, c.prefill)
            except BaseException:  # the client went away meanwhile
                c.prefill.cancel()
                raise
            self._finish(rec, ok=True)
            media = c.response.headers.get("content-type", "application/json")
            return Response(c.head, status_code=200, media_type=media, headers=headers)
        return StreamingResponse(
            self._stream(rec, c), media_type="text/event-stream", headers=headers
        )

    async def _stream(self, rec: LiveRequest, c: Committed) -> AsyncIterator[bytes]:
        assert c.chunks is not None
        pending = b""
        ok = False
        error: str | None = None
        try:
            events, pending = sse_events(c.head)
            for ev in events:
                rec.t_out = output_tokens(ev, rec.t_out)
                rec.last_emit_ts = emitted(ev) or rec.last_emit_ts
            yield c.head
            try:
                async for data in c.chunks:
                    events, pending = sse_events(pending + data)
                    for ev in events:
                        rec.t_out = output_tokens(ev, rec.t_out)
                        rec.last_emit_ts = emitted(ev) or rec.last_emit_ts
                    yield data
                ok = True
            except httpx.HTTPError as e:
                spec = self.host.engine(rec.decode_node)  # type: ignore[arg-type]
                error = (
                    f"decode engine {spec.node_id} ({spec.http_url}) failed mid-stream after "
                    f"{rec.t_out} tokens: {type(e).__name__}: {e or 'connection lost'}"
                )
                log.error("request %s: %s", rec.request_id, error)
                if isinstance(e, DOWN_ERRORS):
                    self.host.mark_down(spec.node_id, error)
                yield b"data: " + json.dumps(error_json(error, 502)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
        finally:
            if not ok and error is None:
                error = "the client disconnected mid-stream"
            # Starlette cancels a stream whose client left, and keeps cancelling every await
            # of its scope: shielded, the decode connection closes (the engine aborts the
            # request), the prefill settles and the request is recorded.
            with anyio.CancelScope(shield=True):
                await c.response.aclose()
                await self._settle_prefill(rec, c.prefill)
            self._finish(rec, ok=ok, error=error)

    async def _settle_prefill(self, rec: LiveRequest, task: asyncio.Task[Any]) -> None:
        """The prefill answer normally arrived before the first token; bound the wait."""
        if not task.done():
            await asyncio.wait({task}, timeout=5.0)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def _finish(self, rec: LiveRequest, *, ok: bool, error: str | None = None) -> None:
        host, cp = self.host, self.host.cp
        with cp.lock:
            if rec.recorded:  # once per request, however it ended
                return
            rec.recorded = True
            now = host.now()
            p, d = rec.prefill_node, rec.decode_node
            self.inflight.drop(rec)
            if ok and rec.placed and p is not None and d is not None:
                rec.placed = False
                rec.t_done = now
                t_c = min(rec.cached_tokens, rec.t_in)
                t_uc = max(rec.t_in - t_c, 0)
                cp.on_request_done(
                    rec.request_id,
                    p,
                    d,
                    now,
                    t_uc=t_uc,
                    t_c=t_c,
                    attn_pairs=t_uc * t_c + t_uc * (t_uc + 1) / 2,
                    t_out=max(rec.t_out, 1),
                    t_acc=host.settings.t_acc,
                )
            else:
                self._release(rec)
                if rec.admitted:
                    cp.on_request_abandoned(now)
            if not ok:
                rec.error = error
                self.num_errors += 1
            if rec.anonymous:
                cp.on_branch_finish(rec.branch_id, now)
                self.paths.forget(rec.branch_id)
            host.record_request(rec)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _until_disconnected(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, `work`'s result), or (False, None) when the client disconnected first (then
    `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            t.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        return False, None
    return True, task.result()
