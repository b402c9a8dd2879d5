"""The data-plane router of a live SGLang PD cluster (paper 000 Fig. 1, Alg. E.1–E.3; SPEC §6).

An HTTP proxy in front of SGLang prefill and decode servers for /generate,
/v1/completions and /v1/chat/completions. Per request it:

1. reads the branch identity from headers — `X-Branch-Id` (absent: a one-request branch),
   `X-Branch-Kind` (start | fork | subagent, for a new branch; a new branch with
   `X-Parent-Branch-Id` and no kind is a fork), `X-Parent-Branch-Id`, `X-Program-Id`
   (default: the parent's program, else the branch id);
2. takes the prompt's token ids (`cluster.sglang.tokens`) and hashes their full pages into
   the request's path, the key the KV directory indexes the engines' blocks by;
3. under the control-plane lock, admits it (`ControlPlane.admit`: branch update, routing by
   the control plane's router, counts) and binds the decode node at once (SGLang's PD
   protocol needs both ends before prefill starts, so the binding of Alg. E.3 l.13 happens at
   admission);
4. implements the PD bootstrap protocol as SGLang's routers do: the same body, plus
   bootstrap_host, bootstrap_port (the prefill server's bootstrap server) and a random
   63-bit bootstrap_room, goes to the prefill and the decode server concurrently; the
   client gets the decode server's response, streamed through (SSE) unchanged;
5. retries on another engine when an engine fails before the first token reaches the
   client (connection refused or reset: the node is also marked down; a 5xx answer); after
   that point a failure ends the stream with an SSE error event naming the engine;
6. reports progress to the control plane: prefill done (`on_prefill_done`), KV arrived at
   decode (`on_transfer_done`, at the first decode token), request done (`on_request_done`
   with t_c from the engine's cached_tokens), one `requests` row per request.

Answers carry X-PD-Request-Id, X-PD-Prefill-Node, X-PD-Decode-Node, X-PD-Bootstrap-Room
and X-PD-Attempts. `POST /v1/branches/{id}/finish` ends a branch (releases its counts, Alg. E.2). The proxy's
own accounting of requests in flight per engine is what the phase switch drains and what
the node reports carry as queues. `GET /health` answers 200 while at least one prefill and
one decode engine are available.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cluster.core import ConfigError
from cluster.hashing import TokenPathCache
from cluster.sglang.cluster_file import ClusterSettings, EngineSpec
from cluster.sglang.payloads import (
    cached_tokens,
    error_json,
    event_error,
    output_tokens,
    sse_events,
)
from cluster.sglang.tokens import (
    TokenizeError,
    estimate_tokens,
    make_tokenizer,
    max_new_tokens,
    prompt_of,
)
from cluster.state import QueuedWork, RouteRequest

if TYPE_CHECKING:
    from cluster.control_plane import ControlPlane

log = logging.getLogger(__name__)

BRANCH_KINDS = ("start", "fork", "subagent")
H_BRANCH, H_PARENT, H_KIND, H_PROGRAM = (
    "x-branch-id",
    "x-parent-branch-id",
    "x-branch-kind",
    "x-program-id",
)
# A decode answer whose failure may be the prefill's death: wait this long for the prefill
# call to tell (both sockets break at once when an engine host dies).
_BLAME_GRACE_S = 1.0
_DOWN_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


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


class Branch(NamedTuple):
    branch_id: str
    kind: str
    parent_id: str | None
    program_id: str | None
    anonymous: bool


def branch_identity(headers: Any, request_id: str) -> Branch:
    """The branch a request belongs to, from its headers; raises ValueError when invalid."""
    bid = (headers.get(H_BRANCH) or "").strip()
    parent = (headers.get(H_PARENT) or "").strip() or None
    kind = (headers.get(H_KIND) or "").strip().lower()
    if kind and kind not in BRANCH_KINDS:
        raise ValueError(
            f"{H_KIND} must be one of {', '.join(BRANCH_KINDS)}, got {headers.get(H_KIND)!r}"
        )
    if kind in ("fork", "subagent") and parent is None:
        raise ValueError(f"{H_KIND}: {kind} needs {H_PARENT}")
    if not kind:
        kind = "fork" if parent is not None else "start"
    program = (headers.get(H_PROGRAM) or "").strip() or None
    if not bid:
        return Branch(f"req-{request_id}", kind, parent, program, True)
    return Branch(bid, kind, parent, program, False)


@dataclass(slots=True)
class LiveRequest:
    """One proxied request (times are run seconds; names as in the `requests` table)."""

    request_id: str
    program_id: str
    branch_id: str
    route: str
    stream: bool
    t_arrival: float
    t_in: int
    path: list[int]
    anonymous: bool
    kv_tokens: int
    prefill_node: int | None = None
    decode_node: int | None = None
    bootstrap_room: int | None = None
    cached_tokens: int = 0  # router's estimate, replaced by the engine's count
    fetch_tokens: int = 0
    t_prefill_start: float | None = None
    t_prefill_done: float | None = None
    t_first_token: float | None = None
    t_done: float | None = None
    t_out: int = 0
    attempts: int = 0
    error: str | None = None
    engine_cached: bool = False  # cached_tokens came from the engine
    placed: bool = False  # an attempt holds router, in-flight and decode-load entries
    admitted: bool = False  # the control plane counts it in service (cp.admit ran)

    def route_request(self, now: float) -> RouteRequest:
        return RouteRequest(
            self.request_id, self.program_id, self.branch_id, self.path, self.t_in, now
        )


class EngineFailure(Exception):
    """One engine failed one attempt; `down` when the engine looks dead (connection)."""

    def __init__(
        self, node: int, url: str, message: str, *, status: int, down: bool, retryable: bool
    ) -> None:
        super().__init__(f"engine {node} ({url}): {message}")
        self.node = node
        self.status = status
        self.down = down
        self.retryable = retryable


class _Plan(NamedTuple):
    prefill: EngineSpec
    decode: EngineSpec
    bootstrap_host: str
    bootstrap_port: int
    room: int


class _Committed(NamedTuple):
    """The decode side produced its first event (stream) or its whole answer."""

    response: httpx.Response
    head: bytes
    chunks: AsyncIterator[bytes] | None
    prefill: asyncio.Task[dict[str, Any] | None]


class PDProxy:
    """See module docstring. `handle`, `finish_branch` and `health` serve the routes
    (`serving.create_sglang_app` mounts them)."""

    def __init__(self, host: ProxyHost) -> None:
        self.host = host
        s = host.settings
        self.headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        self.tokenizer = make_tokenizer(s.tokenizer, self.client, self.headers)
        self.timeout = httpx.Timeout(s.request_timeout_s, connect=s.connect_timeout_s)
        self.inflight: dict[int, dict[str, LiveRequest]] = {}
        # Block hashes per branch: a request hashes only the blocks its new tokens complete.
        self.paths = TokenPathCache(host.cp.config.block_tokens)
        self.num_requests = 0
        self.num_errors = 0
        self.num_retries = 0
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._rng = random.SystemRandom()

    # ---- accounting (read under cp.lock) --------------------------------------------
    def outstanding(self, node: int) -> int:
        """Requests sent to `node` and not yet answered (the drain of a phase switch)."""
        return len(self.inflight.get(node, {}))

    def prefill_queue(self, node: int) -> list[QueuedWork]:
        """Requests whose prefill `node` has not finished, oldest first (its queue)."""
        out = []
        for r in self.inflight.get(node, {}).values():
            if r.prefill_node == node and r.t_prefill_done is None:
                out.append(
                    QueuedWork(r.request_id, max(r.t_in - r.cached_tokens, 1), r.cached_tokens)
                )
        return out

    def decode_running(self, node: int) -> int:
        return sum(1 for r in self.inflight.get(node, {}).values() if r.decode_node == node)

    # ---- HTTP client --------------------------------------------------------------------
    def client(self) -> httpx.AsyncClient:
        """One client per event loop (the server's loop; a test's loop)."""
        loop = asyncio.get_running_loop()
        c = self._clients.get(id(loop))
        if c is None or c.is_closed:
            c = httpx.AsyncClient(
                timeout=self.timeout,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            )
            self._clients[id(loop)] = c
        return c

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        c = self._clients.pop(id(loop), None)
        if c is not None:
            await c.aclose()

    # ---- routes -------------------------------------------------------------------------
    async def health(self) -> Response:
        cp = self.host.cp
        with cp.lock:
            p, d = cp.view.nodes_in("prefill"), cp.view.nodes_in("decode")
        body = {"prefill": p, "decode": d}
        return JSONResponse(body, status_code=200 if p and d else 503)

    async def finish_branch(self, branch_id: str) -> JSONResponse:
        cp = self.host.cp
        with cp.lock:
            if branch_id not in cp.branches.branches:
                return JSONResponse(
                    {
                        "detail": f"unknown branch {branch_id!r}: not active (never seen or finished)"
                    },
                    status_code=404,
                )
            nodes = cp.branches.nodes_of(branch_id)
            cp.on_branch_finish(branch_id, self.host.now())
            self.paths.forget(branch_id)
        return JSONResponse({"branch_id": branch_id, "finished": True, "released_nodes": nodes})

    async def handle(self, route: str, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_json("the request body must be JSON", 400), 400)
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
                parent = cp.branches.branches.get(branch.parent_id)
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
        failure: EngineFailure | None = None
        for attempt in range(host.settings.max_retries + 1):
            try:
                plan = self._place(rec, branch, first=attempt == 0)
            except ConfigError as e:
                self._abandon(rec)
                self._finish(rec, ok=False, error=str(e))
                return JSONResponse(error_json(f"cannot route: {e}", 503), 503)
            rec.attempts = attempt + 1
            outcome = await self._attempt(rec, plan, body)
            if isinstance(outcome, _Committed):
                return await self._respond(rec, outcome)
            failure = outcome
            self._abandon(rec)
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
    def _place(self, rec: LiveRequest, branch: Branch, first: bool) -> _Plan:
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
                cp.router.on_done(rec.request_id, p)
                cp.state.sent.get(p, {}).pop(rec.request_id, None)
                raise
            rec.prefill_node, rec.decode_node = p, d
            rec.cached_tokens, rec.engine_cached = decision.cached_tokens, False
            rec.fetch_tokens = decision.fetch_tokens
            rec.t_prefill_start = now
            rec.t_prefill_done = rec.t_first_token = None
            rec.bootstrap_room = self._rng.randrange(1 << 63)
            for n in {p, d}:
                self.inflight.setdefault(n, {})[rec.request_id] = rec
            rec.placed = True
            ps, ds = host.engine(p), host.engine(d)
        if ps.bootstrap_port is None:
            raise ConfigError(
                f"prefill engine {p} ({ps.http_url}) has no bootstrap port (start SGLang with "
                "--disaggregation-mode prefill, or set bootstrap_port in the cluster file)"
            )
        bhost = ps.bootstrap_host or urlsplit(ps.http_url).hostname or "127.0.0.1"
        return _Plan(ps, ds, bhost, ps.bootstrap_port, rec.bootstrap_room)

    def _abandon(self, rec: LiveRequest) -> None:
        """Undo one failed attempt's placement: in-flight entries, router and decode load."""
        cp = self.host.cp
        with cp.lock:
            if not rec.placed:
                return
            rec.placed = False
            p, d = rec.prefill_node, rec.decode_node
            for n in {p, d}:
                if n is not None:
                    self.inflight.get(n, {}).pop(rec.request_id, None)
            if p is not None:
                cp.router.on_done(rec.request_id, p)
                cp.state.sent.get(p, {}).pop(rec.request_id, None)
            if d is not None:
                cp.state.decode_load[d] = max(cp.state.decode_load.get(d, 0) - 1, 0)

    # ---- one attempt ------------------------------------------------------------------
    async def _attempt(self, rec: LiveRequest, plan: _Plan, body: dict[str, Any]) -> Any:
        sent = {
            **body,
            "bootstrap_host": plan.bootstrap_host,
            "bootstrap_port": plan.bootstrap_port,
            "bootstrap_room": plan.room,
        }
        p_task = asyncio.create_task(self._prefill_call(rec, plan.prefill, sent))
        d_task = asyncio.create_task(self._decode_open(rec, plan.decode, sent))
        waiting: set[asyncio.Task[Any]] = {p_task, d_task}
        try:
            while True:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if p_task in done and p_task.exception() is not None:
                    return self._failure(p_task.exception(), plan.prefill)
                if d_task in done:
                    exc = d_task.exception()
                    if exc is None:
                        resp, head, chunks = d_task.result()
                        return _Committed(resp, head, chunks, p_task)
                    if isinstance(exc, EngineFailure) and exc.retryable and not p_task.done():
                        # A decode 5xx may be the prefill's death seen through the bootstrap.
                        await asyncio.wait({p_task}, timeout=_BLAME_GRACE_S)
                    if p_task.done() and p_task.exception() is not None:
                        return self._failure(p_task.exception(), plan.prefill)
                    return self._failure(exc, plan.decode)
                waiting = {d_task}
        finally:
            committed = d_task.done() and not d_task.cancelled() and d_task.exception() is None
            if not committed:
                # The client gets nothing from this attempt: closing both connections makes
                # SGLang abort whatever the engines still hold for it.
                d_task.cancel()
                p_task.cancel()
                await asyncio.gather(d_task, p_task, return_exceptions=True)

    def _failure(self, exc: BaseException | None, spec: EngineSpec) -> EngineFailure:
        if isinstance(exc, EngineFailure):
            return exc
        if isinstance(exc, httpx.HTTPError):
            return EngineFailure(
                spec.node_id,
                spec.http_url,
                f"{type(exc).__name__}: {exc or 'connection failed'}",
                status=502,
                down=isinstance(exc, _DOWN_ERRORS),
                retryable=True,
            )
        return EngineFailure(
            spec.node_id, spec.http_url, repr(exc), status=500, down=False, retryable=False
        )

    async def _prefill_call(
        self, rec: LiveRequest, spec: EngineSpec, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """POST to the prefill server and read its whole answer; the last payload is kept."""
        url = spec.http_url + rec.route
        async with self.client().stream(
            "POST", url, json=body, headers=self.headers, timeout=self.timeout
        ) as resp:
            raw = await resp.aread()
        if resp.status_code != 200:
            raise EngineFailure(
                spec.node_id,
                spec.http_url,
                f"prefill answered {resp.status_code}: {raw[:300].decode('utf-8', 'replace')}",
                status=resp.status_code,
                down=False,
                retryable=resp.status_code >= 500,
            )
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
            raise EngineFailure(
                spec.node_id,
                spec.http_url,
                f"prefill aborted the request ({problem[1]}): {problem[0]}",
                status=problem[1],
                down=False,
                retryable=problem[1] >= 500,
            )
        cached = cached_tokens(last)
        self._on_prefill_done(rec, spec.node_id, cached)
        return last if isinstance(last, dict) else None

    def _on_prefill_done(self, rec: LiveRequest, node: int, cached: int | None) -> None:
        host, cp = self.host, self.host.cp
        with cp.lock:
            now = host.now()
            rec.t_prefill_done = now
            if cached is not None:
                rec.cached_tokens, rec.engine_cached = min(cached, rec.t_in), True
            cp.on_prefill_done(rec.route_request(now), node, now)
            if rec.decode_node != node:
                self.inflight.get(node, {}).pop(rec.request_id, None)
            host.refresh_report(node)

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
                raise EngineFailure(
                    spec.node_id,
                    spec.http_url,
                    f"decode answered {resp.status_code}: {raw[:300].decode('utf-8', 'replace')}",
                    status=resp.status_code,
                    down=False,
                    retryable=resp.status_code >= 500,
                )
            if not rec.stream:
                raw = await resp.aread()
                try:
                    problem = event_error(json.loads(raw))
                except ValueError:
                    problem = None
                if problem is not None:
                    raise self._engine_error(spec, *problem)
                return resp, raw, None
            chunks = resp.aiter_raw()
            head = b""
            async for chunk in chunks:
                head += chunk
                events, _ = sse_events(head)
                if events:
                    problem = event_error(events[0])
                    if problem is not None:
                        raise self._engine_error(spec, *problem)
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

    @staticmethod
    def _engine_error(spec: EngineSpec, message: str, status: int) -> EngineFailure:
        return EngineFailure(
            spec.node_id,
            spec.http_url,
            f"decode aborted the request ({status}): {message}",
            status=status,
            down=False,
            retryable=status >= 500,
        )

    # ---- the answer -------------------------------------------------------------------
    def _first_token(self, rec: LiveRequest) -> None:
        host, cp = self.host, self.host.cp
        with cp.lock:
            now = host.now()
            rec.t_first_token = now
            assert rec.decode_node is not None
            cp.on_transfer_done(rec.branch_id, rec.decode_node, now)

    async def _respond(self, rec: LiveRequest, c: _Committed) -> Response:
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
            await c.response.aclose()
            await self._settle_prefill(rec, c.prefill)
            self._finish(rec, ok=True)
            media = c.response.headers.get("content-type", "application/json")
            return Response(c.head, status_code=200, media_type=media, headers=headers)
        return StreamingResponse(
            self._stream(rec, c), media_type="text/event-stream", headers=headers
        )

    async def _stream(self, rec: LiveRequest, c: _Committed) -> AsyncIterator[bytes]:
        assert c.chunks is not None
        pending = b""
        ok = False
        error: str | None = None
        try:
            events, pending = sse_events(c.head)
            for ev in events:
                rec.t_out = output_tokens(ev, rec.t_out)
            yield c.head
            try:
                async for data in c.chunks:
                    events, pending = sse_events(pending + data)
                    for ev in events:
                        rec.t_out = output_tokens(ev, rec.t_out)
                    yield data
                ok = True
            except httpx.HTTPError as e:
                spec = self.host.engine(rec.decode_node)  # type: ignore[arg-type]
                error = (
                    f"decode engine {spec.node_id} ({spec.http_url}) failed mid-stream after "
                    f"{rec.t_out} tokens: {type(e).__name__}: {e or 'connection lost'}"
                )
                log.error("request %s: %s", rec.request_id, error)
                if isinstance(e, _DOWN_ERRORS):
                    self.host.mark_down(spec.node_id, error)
                yield b"data: " + json.dumps(error_json(error, 502)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
        finally:
            if not ok and error is None:
                error = "the client disconnected mid-stream"
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
            now = host.now()
            p, d = rec.prefill_node, rec.decode_node
            for n in {p, d}:
                if n is not None:
                    self.inflight.get(n, {}).pop(rec.request_id, None)
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
                self._abandon(rec)
                if rec.admitted:
                    cp.on_request_abandoned(now)
            if not ok:
                rec.error = error
                self.num_errors += 1
            if rec.anonymous:
                cp.on_branch_finish(rec.branch_id, now)
                self.paths.forget(rec.branch_id)
            host.record_request(rec)
