"""`LaunchedCluster`: a live PD cluster that starts and stops its own engine processes.

Any engine speaking the SGLang subset will do; here the SGLang stand-in
(`cluster.engines.standin.server`, no torch, sleeps instead of computing) is launched from a
command template. An `AgentLoop` replays a timestamped trace once at its arrival times
through the proxy; a manual switch of a node holding KV records the blocks it lost (the
stand-in, like SGLang, releases its cache on a role switch, and its /server_info does not
say it keeps it); stopping the cluster ends every engine process. A launch that fails stops
the engines already started and names the failing one with its output.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from cluster.core import ConfigError
from cluster.live.agent_client import TokenMap
from cluster.live.agent_loop import AgentLoop
from cluster.live.cluster_file import ClusterSettings
from cluster.live.launched import EngineLaunch, LaunchedCluster
from cluster.live.serving import ServerThread
from cluster.workloads import TraceParams, TraceSource
from telemetry import open_reader
from toolkit.serve.sglang import create_sglang_app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
STANDIN = (sys.executable, "-m", "cluster.engines.standin.server", "--role", "{role}",
           "--host", "{host}", "--port", "{port}", "--bootstrap-port", "0",
           "--enable-pd-role-switch", "--time-scale", "0.01")  # fmt: skip
TOKEN = "launch"


def _until(pred, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_launched_cluster_replays_a_trace_and_stops_its_engines(tmp_path: Path) -> None:
    launch = EngineLaunch(STANDIN, ("prefill", "prefill", "decode"), log_dir=tmp_path / "logs")
    settings = ClusterSettings(
        tokenizer="toy", health_interval_s=0.2, decode_cuda_graph_memory_gb=1.0
    )
    db = tmp_path / "live.duckdb"
    cluster = LaunchedCluster(launch, settings, db_path=db, source="standin")
    source = TraceSource(FIXTURES / "mooncake_conversation_head300.jsonl", TraceParams(limit=40))
    try:
        with ServerThread(create_sglang_app(cluster, TOKEN)) as server:
            pids = [p.pid for p in cluster.processes]
            assert len(_alive(pids)) == 3 and all(
                psutil.Process(p).ppid() == psutil.Process().pid for p in pids
            )
            health = httpx.get(f"{server.url}/v1/health").json()
            assert health["engine_pids"] == pids and health["engines_up"] == 3
            tokens = TokenMap(vocab_lo=1, vocab_hi=256, token_scale=0.05)
            loop = AgentLoop(server.url, source, tokens, agents=4, time_scale=0.02).start()
            _until(lambda: loop.finished, 120)
            stats = loop.stop()
            assert (stats.programs_done, stats.turns_ok, stats.turns_failed) == (40, 40, 0)

            def prefill_with_kv() -> list[int]:  # the engines' KV events may still be in flight
                nodes = httpx.get(f"{server.url}/v1/cluster").json()["nodes"]
                return [n["id"] for n in nodes if n["phase"] == "prefill" and n["kv_blocks"]]

            node = _until(prefill_with_kv)[0]
            r = httpx.post(f"{server.url}/v1/nodes/{node}/phase", json={"phase": "decode"},
                           headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            assert r.status_code == 200, r.text

            def switched() -> dict:  # type: ignore[type-arg]
                state = httpx.get(f"{server.url}/v1/cluster").json()["nodes"][node]
                return state["last_switch"] if state["switching"] is None else None

            done = _until(switched)
            assert done["ok"], done["message"]
    finally:
        cluster.stop()
    assert _alive(pids) == [] and [p.proc.returncode for p in cluster.processes] == [0, 0, 0]
    r = open_reader(db)
    assert r.runs()["source"].to_list() == ["standin"]
    assert r.table("requests").height == 40
    (lost,) = r.table("phase_switches")["lost_kv_blocks"].to_list()
    assert lost > 0  # the stand-in released its cache: those blocks are lost


def test_a_failed_launch_stops_the_engines_it_started(tmp_path: Path) -> None:
    script = ("import sys, time\n"
              "print('cannot start as', sys.argv[1], flush=True)\n"
              "sys.exit(3) if sys.argv[1] == 'decode' else time.sleep(120)")  # fmt: skip
    launch = EngineLaunch((sys.executable, "-c", script, "{role}", "{port}"),
                          ("prefill", "decode"), startup_timeout_s=60)  # fmt: skip
    cluster = LaunchedCluster(launch, ClusterSettings(tokenizer="toy"))
    with pytest.raises(ConfigError, match=r"engine 1 exited with 3 while starting") as err:
        cluster.prepare()
    assert "cannot start as decode" in str(err.value)
    assert _alive([p.pid for p in cluster.processes]) == []


@pytest.mark.parametrize(
    ("command", "roles", "message"),
    [
        ((), ("prefill", "decode"), "the engine command is empty"),
        (("x",), ("prefill", "decode"), "must take its HTTP port as {port}"),
        (("x", "{port}"), ("prefill", "prefill"), "needs prefill and decode engines"),
        (("x", "{port}"), ("prefill", "null"), "needs prefill and decode engines"),
    ],
)
def test_launch_specs_are_checked(
    command: tuple[str, ...], roles: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        EngineLaunch(command, roles)
