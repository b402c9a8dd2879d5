"""The engine shell both engines share (cluster.engines.shell): room registry, chunked
prefill selection, options, and the same HTTP answers from the stand-in and the torch engine."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx
import pytest

from cluster.engines.shell.bootstrap import RoomRegistry
from cluster.engines.shell.scheduling import prefill_chunks
from cluster.engines.standin.server import StandinEngine
from cluster.engines.torch.config import EngineConfig
from cluster.engines.torch.engine import TorchEngine


def test_room_registry_forgets_oldest_past_its_count_and_keeps_until_taken() -> None:
    rooms: RoomRegistry[str] = RoomRegistry(max_rooms=2)
    for room in (1, 2, 3):
        rooms.finish(room, f"r{room}")
    assert len(rooms) == 2 and rooms.num_forgotten == 1
    assert rooms.wait(1, 0.0) is None  # forgotten
    assert rooms.wait(2, 0.0) == "r2" and rooms.wait(2, 0.0) == "r2"  # wait keeps it
    assert rooms.take(3, 0.0) == "r3" and rooms.take(3, 0.0) is None  # take hands it out once


def test_room_registry_bounds_bytes_keeps_the_newest_and_counts_a_refinished_room_once() -> None:
    rooms: RoomRegistry[bytes] = RoomRegistry(max_bytes=10, nbytes=len)
    rooms.finish(1, b"x" * 4)
    rooms.finish(1, b"x" * 4)  # the same room again replaces it (no bytes counted twice)
    rooms.finish(2, b"y" * 6)
    assert len(rooms) == 2 and rooms.num_forgotten == 0
    rooms.finish(3, b"z" * 20)  # over the bound alone: the older rooms go, the newest stays
    assert len(rooms) == 1 and rooms.take(3, 0.0) == b"z" * 20
    rooms.finish(4, b"w" * 10)
    assert len(rooms) == 1 and rooms.wait(4, 0.0) == b"w" * 10


def test_room_registry_wakes_a_waiter_when_the_room_finishes() -> None:
    rooms: RoomRegistry[int] = RoomRegistry(max_rooms=10)
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(rooms.take(7, 5.0)))
    waiter.start()
    rooms.finish(7, 42)
    waiter.join(5.0)
    assert got == [42] and len(rooms) == 0


@dataclass
class _Req:
    input_ids: list[int]
    done: int = 0
    admitted: bool = False
    arrived: bool = False  # decode role: KV arrived, no prefill here
    fits: bool = True
    calls: list[str] = field(default_factory=list)


def _chunks(waiting: list[_Req], running: int, budget: int, max_running: int = 8) -> list[int]:
    def admit(r: _Req) -> bool:
        r.admitted = r.fits
        return r.fits

    out = prefill_chunks(
        waiting,
        running,
        budget_tokens=budget,
        max_running=max_running,
        admit=admit,
        computed=lambda r: None if r.arrived else r.done,
    )
    return [n for _, n in out]


def test_prefill_chunks_fcfs_under_the_token_budget_and_running_cap() -> None:
    a, b, c = _Req([0] * 100, done=40), _Req([0] * 50), _Req([0] * 30)
    assert _chunks([a, b, c], 0, budget=80) == [60, 20]  # a's rest, then b's first chunk
    assert _chunks([a, b, c], 7, budget=500) == [60]  # one slot left
    assert _chunks([_Req([0] * 5, arrived=True), c], 0, budget=500) == [30]  # no prefill here


def test_prefill_chunks_stop_at_a_request_that_does_not_fit() -> None:
    a, big, c = _Req([0] * 10), _Req([0] * 10, fits=False), _Req([0] * 10)
    assert _chunks([a, big, c], 0, budget=500) == [10]  # nothing overtakes `big`
    assert a.admitted and not big.admitted and not c.admitted


def test_unknown_engine_options_are_refused_with_the_allowed_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown engine options \['prot'\]; allowed: .*port"):
        StandinEngine("null", prot=1)  # type: ignore[call-arg]


def test_standin_health_reports_a_stopped_scheduler() -> None:
    with StandinEngine("null", kv_events=False, forward_metrics=False) as engine:
        url = engine.endpoints.http_url  # type: ignore[union-attr]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        engine.sched.stop()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 503
        assert httpx.get(f"{url}/health_generate", timeout=10).status_code == 503


def test_both_engines_answer_the_shared_routes_alike() -> None:
    """Same shapes from both; the kept differences: forward-pass metrics default to IPC on
    the stand-in and TCP on the torch engine, and only the torch engine reads
    max_completion_tokens on /v1/completions (SGLang's CompletionRequest has max_tokens)."""
    standin = StandinEngine("null")
    torch_engine = TorchEngine(EngineConfig(gpu_pages=64, host_pages=64), "null")
    try:
        answers = {}
        for name, engine in (("standin", standin), ("torch", torch_engine)):
            ep = engine.start()
            body = {"prompt": "hi", "max_completion_tokens": 3, "ignore_eos": True}
            comp = httpx.post(f"{ep.http_url}/v1/completions", json=body, timeout=30).json()
            tok = httpx.post(f"{ep.http_url}/v1/tokenize", json={"prompt": "hi"}, timeout=30)
            answers[name] = (ep.forward_metrics, comp, tok.json())
        (s_fpm, s_comp, s_tok), (t_fpm, t_comp, t_tok) = answers["standin"], answers["torch"]
        assert s_fpm is not None and s_fpm.startswith("ipc://")
        assert t_fpm is not None and t_fpm.startswith("tcp://")
        assert s_comp.keys() == t_comp.keys() and s_comp["object"] == "text_completion"
        assert s_comp["usage"]["completion_tokens"] == 16  # max_tokens' default
        assert t_comp["usage"]["completion_tokens"] == 3
        assert s_tok["tokens"] == t_tok["tokens"] == [104, 105]
    finally:
        standin.stop()
        torch_engine.stop()
