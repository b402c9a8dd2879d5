"""`pdlab serve --engines torch`: a live cluster of real torch engine processes (SPEC §6, §9).

The command starts three `pdlab engine` processes (1 prefill, 2 decode) on loopback, the
PD proxy, the control server and an agent client playing cc agents. Through the REST API
only (as the widgets do) the test switches a decode node that holds KV to prefill: the node
keeps its KV (the engine's own device and host counts in GET /v1/cluster), the switch is a
`phase_switches` row with 0 lost blocks, and router, planner and /metrics answer as for a
simulated cluster. Ctrl-C then stops the server, the run is consolidated into the DB and
no engine process is left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from telemetry import open_reader
from toolkit.client import launch_server

ARGS = ["--engines", "torch", "--nodes", "3", "--split", "1P2D", "--agents", "4",
        "--workload", "cc", "--window", "60", "--slices", "4"]  # fmt: skip


@pytest.mark.slow
def test_a_manual_switch_of_a_torch_node_keeps_its_kv(tmp_path: Path, procs: Any) -> None:
    db = tmp_path / "torch.duckdb"
    server = launch_server(*ARGS, db=db, timeout_s=300)
    try:
        client = server.client(timeout_s=30)
        health = client.health()
        assert health["source"] == "torch" and health["engines_up"] == 3
        engine_pids = health["engine_pids"]
        assert all(psutil.Process(p).ppid() == server.proc.pid for p in engine_pids)

        def decode_with_kv():  # type: ignore[no-untyped-def]
            state = client.cluster()
            if state["requests_completed"] < 10:
                return None
            held = [n for n in state["nodes"] if n["phase"] == "decode" and n["kv_gpu_used"]]
            return held[0] if held else None

        node = procs.wait_for(decode_with_kv, 180, "agents to leave KV on a decode node")
        started = client.switch(node["id"], "prefill")
        assert started["trigger"] == "manual" and started["from_phase"] == "decode"
        after = client.wait_for_phase(node["id"], "prefill", timeout_s=120)
        assert after["last_switch"]["ok"] and after["last_switch"]["lost_kv_blocks"] == 0
        after = procs.wait_for(
            lambda: next(
                (
                    n
                    for n in client.cluster()["nodes"]
                    if n["id"] == node["id"] and n["kv_host_used"]
                ),
                None,  # not reported yet: wait_for polls again
            ),
            30,
            "the engine's KV counts after the switch",
        )
        assert after["kv_gpu_used"] + after["kv_host_used"] > 0
        assert client.cluster()["split"] == {"prefill": 2, "decode": 1}
        # The rest of the control API works as for the simulated cluster.
        assert client.set_router("cache-aware")["policy"] == "cache-aware"
        assert client.planner()["name"] == "gain"
        assert client.set_planner(mode="off")["mode"] == "off"
        assert "pdlab_phase_switches_total" in client.metrics()
        served = client.cluster()["requests_completed"]
        assert served > 0
    finally:
        code = server.stop(timeout_s=90)  # SIGINT
    assert code == 0, server.log()[-3000:]
    assert procs.gone(engine_pids), "an engine process survived the server"
    log = server.log()
    assert "turns served" in log and "split 2P1D" in log

    r = open_reader(db)
    runs = r.runs()
    assert runs.height == 1 and runs["source"][0] == "torch" and not runs["live"][0]
    sw = r.table("phase_switches")
    assert sw["lost_kv_blocks"].to_list() == [0] and sw["trigger"].to_list() == ["manual"]
    assert r.table("requests").height >= served
    dec = r.table("decode_iterations")
    assert dec.height > 0 and dec["experts_active"].null_count() == 0
    assert r.table("prefill_iterations").height > 0
