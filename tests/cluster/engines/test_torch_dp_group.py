"""A torch engine served by a DP2×EP2 group of real processes on loopback (issue 22, item 2).

One group (two rank processes, gloo all-to-all per MoE layer) serves every test of the
module: its generations equal a single-process engine's with the same seed; its ranks run
the same sequence of (wave, step) passes, an idle rank dummy passes; each rank owns half
of the experts; every pass and MoE layer is logged and stored as a run; the front end
balances as vLLM's DP client does; stopping it leaves no process behind, and neither does
a `kill -9` of the launcher.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from cluster.engines.torch.config import EngineConfig, preset
from cluster.engines.torch.dp_coordinator import Balancer
from cluster.engines.torch.dp_group import DPGroup
from cluster.engines.torch.rank_log import read_rank_logs
from cluster.engines.torch.request import EngineRequest

ROOT = Path(__file__).resolve().parents[3]
SEED = 3
SYNC = 8  # steps between the ranks' "all done?" all-reduce (vLLM: 32), short for tests
CFG = EngineConfig(model=preset("tiny-moe"), seed=SEED, gpu_pages=256, host_pages=0)
TOKEN = "group-secret"
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DPGroup, str, Path]]:
    logs = tmp_path_factory.mktemp("dp-group")
    g = DPGroup(CFG, 2, 2, log_dir=logs, sync_interval=SYNC, token=TOKEN,
                max_body_bytes=BODY_LIMIT)  # fmt: skip
    url = g.start().http_url
    try:
        yield g, url, logs
    finally:
        codes = g.stop()
        assert codes == [0, 0], f"ranks exited with {codes}"


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def _generate(url: str, ids: list[int], n: int, rank: int | None = None) -> httpx.Response:
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": n,
                                                                  "ignore_eos": True}}  # fmt: skip
    headers = {} if rank is None else {"X-data-parallel-rank": str(rank)}
    r = httpx.post(url + "/generate", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def _single_engine(engine_parts, prompts: list[tuple[list[int], int]]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """The same requests, together, on one in-process engine with all experts."""
    sched = engine_parts(seed=SEED)
    done = [threading.Event() for _ in prompts]
    outs: list[list[int]] = [[] for _ in prompts]

    def on_update(i: int):  # type: ignore[no-untyped-def]
        def update(ids: list[int], fin: dict[str, Any] | None) -> None:
            if fin is not None:
                outs[i] = ids
                done[i].set()

        return update

    for i, (ids, n) in enumerate(prompts):
        sched.submit(EngineRequest(f"r{i}", ids, n, on_update(i), ignore_eos=True))
    assert all(d.wait(60) for d in done)
    return outs


def test_generations_equal_a_single_engine(group, engine_parts) -> None:  # type: ignore[no-untyped-def]
    _g, url, _logs = group
    prompts = [(_prompt(20 + 9 * i, i), 6 + 3 * i) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:  # both ranks busy at once: tokens cross ranks
        got = list(pool.map(lambda p: _generate(url, p[1][0], p[1][1], p[0] % 2),
                            enumerate(prompts)))  # fmt: skip
    want = _single_engine(engine_parts, prompts)
    assert [r.json()["output_ids"] for r in got] == want
    assert [r.headers["x-data-parallel-rank"] for r in got] == ["0", "1"] * 3
    # One rank busy alone: its layers dispatch to the other, which runs dummy passes.
    alone = _generate(url, prompts[5][0], prompts[5][1], rank=1)
    assert alone.json()["output_ids"] == want[5]


def test_ranks_step_in_lockstep_with_dummy_passes(group) -> None:  # type: ignore[no-untyped-def]
    _g, url, logs = group
    _generate(url, _prompt(40, 7), 12, rank=0)  # rank 1 has nothing to do
    done = _paused(url)  # the wave ends within SYNC steps
    time.sleep(1.5)  # the logs flush each second
    passes = [p for p in read_rank_logs(logs)["pass"] if p["wave"] < done]
    seq = {r: [(p["wave"], p["step"]) for p in passes if p["rank"] == r] for r in (0, 1)}
    assert seq[0] == seq[1] and len(seq[0]) >= 12  # a prefill and 11 decodes at least
    kinds = {r: [p["kind"] for p in passes if p["rank"] == r] for r in (0, 1)}
    assert "dummy" in kinds[1] and "decode" in kinds[0]
    # At the step where rank 0 decoded alone, rank 1 ran a dummy pass.
    both = list(zip(kinds[0], kinds[1], strict=True))
    assert ("decode", "dummy") in both
    # Waves end together: every wave's last step is a multiple of the sync interval.
    for w in {p["wave"] for p in passes}:
        steps = [p["step"] for p in passes if p["wave"] == w and p["rank"] == 0]
        assert max(steps) % SYNC == 0


def test_each_rank_owns_half_of_the_experts(group) -> None:  # type: ignore[no-untyped-def]
    g, _url, _logs = group
    infos = [httpx.get(r["http_url"] + "/server_info").json() for r in g.endpoints.ranks]
    assert [i["local_experts"] for i in infos] == [list(range(8)), list(range(8, 16))]
    assert all(i["dp_size"] == 2 and i["ep_size"] == 2 for i in infos)


def test_every_pass_and_moe_layer_is_logged_and_stored(group, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from toolkit.importers.torch_group import read_group_run, write_group_run

    _g, url, logs = group
    for rank in (0, 1):
        _generate(url, _prompt(33, 9 + rank), 5, rank=rank)
    _paused(url)  # no more passes: the logs read twice below hold the same rows
    time.sleep(1.5)
    tabs = read_rank_logs(logs)
    layers = tabs["layer"]
    for r in (0, 1):
        ids = [p["pass_id"] for p in tabs["pass"] if p["rank"] == r]
        assert ids == list(range(1, len(ids) + 1))
        per_pass = [x for x in layers if x["rank"] == r]
        assert len(per_pass) == 4 * len(ids)  # tiny-moe: 4 MoE layers
        assert all(0 <= x["experts_activated"] <= 8 for x in per_pass)
    # A token reaches at most both ranks and at least one: per pass and layer, the tokens
    # received over the ranks lie between the tokens sent and twice as many.
    by_step: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    wave_step = {(p["rank"], p["pass_id"]): (p["wave"], p["step"]) for p in tabs["pass"]}
    for x in layers:
        by_step.setdefault((*wave_step[(x["rank"], x["pass_id"])], x["layer"]), []).append(x)
    for rows in by_step.values():
        sent = sum(x["tokens_in"] for x in rows)
        assert sent <= sum(x["tokens_received"] for x in rows) <= 2 * sent
    reqs = tabs["request"]
    assert {r["rank"] for r in reqs} == {0, 1} and all(r["t_first_token"] for r in reqs)
    # the engine's arrival comes first, then the loop's intake at a pass boundary
    assert all(r["t_arrival"] <= r["t_queued"] <= r["t_prefill_start"] for r in reqs)
    db = tmp_path / "run.duckdb"
    write_group_run(db, read_group_run(logs, "ep2"))
    con = duckdb.connect(str(db), read_only=True)
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    assert q("SELECT count(*) FROM requests") == [(len(reqs),)]
    assert q("SELECT count(DISTINCT prefill_node) FROM requests") == [(2,)]
    assert q("SELECT count(*) FROM moe_layer_loads") == [(len(layers),)]
    assert q("SELECT count(*) FROM dp_passes WHERE kind = 'dummy' AND iter_id IS NULL")[0][0] > 0
    n_dec = sum(p["kind"] == "decode" for p in tabs["pass"])
    assert q("SELECT count(*) FROM decode_iterations") == [(n_dec,)]
    config = json.loads(q("SELECT config FROM runs")[0][0])
    assert config["arrival_anchor"].startswith("engine")
    assert q("SELECT count(*) FROM requests WHERE t_arrival > t_prefill_start "
             "OR t_sent > t_arrival") == [(0,)]  # fmt: skip
    engine = config["engine"]
    assert (engine["data_parallel_size"], engine["expert_parallel_size"]) == (2, 2)
    assert engine["num_gpu_blocks"] == 256 and engine["mixed_prefill_decode"] is False
    con.close()
    from toolkit.samples.torch_ep_group import ep_group_db, write_bundle

    write_bundle(db, "ep2", bundle=tmp_path / "bundle")  # what --bundle keeps in the repo
    again = duckdb.connect(str(ep_group_db(tmp_path / "again.duckdb", tmp_path / "bundle")))
    assert again.execute("SELECT count(*) FROM moe_layer_loads").fetchall() == [(len(layers),)]
    assert again.execute("SELECT count(*) FROM requests").fetchall() == [(len(reqs),)]
    again.close()


def test_balancer_is_vllms_least_loaded_rule() -> None:
    b = Balancer(3)
    assert [b.choose() for _ in range(4)] == [0, 1, 2, 0]  # optimistic waiting counts
    b.update([(0, 5), (1, 0), (0, 3)])  # scores 5, 4, 3
    assert b.choose() == 2
    assert b.counts()[2] == [1, 3]
    assert b.choose(rank=0) == 0 and b.counts()[0] == [0, 5]  # a named rank is not counted


def test_front_end_spreads_concurrent_requests(group) -> None:  # type: ignore[no-untyped-def]
    _g, url, logs = group
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: _generate(url, _prompt(24, 100 + i), 8), range(8)))
    ranks = [int(r.headers["x-data-parallel-rank"]) for r in got]
    assert sorted(set(ranks)) == [0, 1] and 2 <= ranks.count(1) <= 6
    assigned = {a["rid"]: a["rank"] for a in _front_log(logs)}
    assert [assigned[r.json()["meta_info"]["id"]] for r in got] == ranks
    state = httpx.get(url + "/pdlab/dp_state").json()
    assert state["start_waves_relayed"] >= 1 and len(state["ranks"]) == 2


def test_front_end_takes_the_engine_door(group) -> None:  # type: ignore[no-untyped-def]
    """The group's front end answers as one engine's guard does (shell.guard), and the
    ranks hold the same token: a mutation relayed with it succeeds on every rank, one sent
    to a rank's own port without it is refused."""
    g, url, _logs = group
    _paused(url)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(url + "/flush_cache", json={})
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = httpx.post(url + "/flush_cache", json={}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["detail"] == "invalid bearer token"
    r = httpx.post(url + "/kv_eviction", content=b"policy=lru", headers=bearer)
    assert r.status_code == 415  # JSON only
    assert httpx.get(url + "/flush_cache").status_code == 405  # mutations are POST only
    big = {"input_ids": [1] * (BODY_LIMIT // 2), "sampling_params": {"max_new_tokens": 1}}
    r = httpx.post(url + "/generate", json=big)
    assert r.status_code == 413 and str(BODY_LIMIT) in r.json()["detail"]
    r = httpx.post(url + "/kv_eviction", json={"policy": "lru"}, headers=bearer)
    assert r.status_code == 200, r.text
    assert httpx.post(url + "/flush_cache", json={}, headers=bearer).status_code == 200
    rank_url = g.endpoints.ranks[1]["http_url"]
    assert httpx.post(rank_url + "/flush_cache", json={}).status_code == 401
    assert httpx.get(url + "/kv_eviction").json()["policy"] == "lru"  # reads need no token


def test_server_info_advertises_every_ranks_publishers(group) -> None:  # type: ignore[no-untyped-def]
    """/server_info names each rank's KV-event and forward-pass publishers: SGLang's DP
    descriptor (rank r on port base + r), which the live control plane's discovery reads
    per rank, as every rank's own /server_info says."""
    from cluster.live.cluster_file import spec_from_server_info

    g, url, _logs = group
    info = httpx.get(url + "/server_info").json()
    kv = info["kv_events"]
    assert kv["dp_size"] == 2 and len(info["forward_pass_metrics_endpoints"]) == 2
    for r, rank in enumerate(g.endpoints.ranks):
        own = httpx.get(rank["http_url"] + "/server_info").json()
        spec = spec_from_server_info(info, url, node_id=0, dp_rank=r)
        port = own["kv_events"]["endpoint_port_base"]
        assert spec.kv_events is not None and spec.kv_events.endswith(f":{port}")
        assert port == kv["endpoint_port_base"] + r
        assert spec.forward_metrics == own["forward_pass_metrics_endpoint"]
        assert info["kv_events_endpoints"][r].endswith(f":{port}")
    assert len(set(info["forward_pass_metrics_endpoints"])) == 2


def test_bad_rank_is_refused(group) -> None:  # type: ignore[no-untyped-def]
    _g, url, _logs = group
    r = httpx.post(url + "/generate", json={"input_ids": [1, 2]},
                   headers={"X-data-parallel-rank": "2"})  # fmt: skip
    assert r.status_code == 400 and "[0, 2)" in r.json()["error"]["message"]


def _paused(url: str, timeout_s: float = 60.0) -> int:
    """Wait until the group's wave has ended; the number of waves that ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = httpx.get(url + "/pdlab/dp_state").json()
        if not state["engines_running"]:
            return int(state["current_wave"])
        time.sleep(0.1)
    raise AssertionError("the group's wave did not end")


def _front_log(logs: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (logs / "frontend.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a group of its own
def test_killed_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    """`pdlab engine --dp 2 --ep 2` takes the token as one engine does ($PDLAB_ENGINE_TOKEN
    here) for its front end and ranks; a `kill -9` of it leaves no rank behind."""
    cmd = [sys.executable, "-m", "toolkit.cli", "engine", "--dp", "2", "--ep", "2", "--port",
           "0", "--kv-gpu-tokens", "2048", "--kv-host-tokens", "0"]  # fmt: skip
    env = {**os.environ, "PDLAB_ENGINE_TOKEN": "cli-secret"}
    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("pdlab engine ready:"), line
        ready = json.loads(line.split("ready:", 1)[1])
        pids = [r["pid"] for r in ready["ranks"]]
        _generate(ready["http_url"], [5, 6, 7], 3)
        url, body = ready["http_url"], {"policy": "lru"}
        assert httpx.post(url + "/kv_eviction", json=body).status_code == 401
        for target in (url, ready["ranks"][0]["http_url"]):
            r = httpx.post(target + "/kv_eviction", json=body,
                           headers={"Authorization": "Bearer cli-secret"})  # fmt: skip
            assert r.status_code == 200, r.text
        assert "PDLAB_ENGINE_TOKEN" in (tmp_path / "stderr").read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_all_to_all_moves_rows_exactly(tmp_path: Path) -> None:
    """Through a real gloo world (one rank: every expert local), the dispatched MoE layer
    equals the single-process layer bit for bit; sharding keeps the owned experts' weights."""
    import torch
    import torch.distributed as dist

    from cluster.core import ConfigError
    from cluster.engines.torch.expert_parallel import EPComm, ExpertPlacement
    from cluster.engines.torch.model import Transformer

    cfg = preset("tiny-moe")
    full = Transformer(cfg, seed=SEED)
    ep = Transformer(cfg, seed=SEED)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        comm = EPComm(ExpertPlacement(cfg.num_experts, 1, 0))
        ep.shard_experts(comm)
        x = torch.randn(37, cfg.d_model, generator=torch.Generator().manual_seed(1))
        want, active = full.blocks[0].ffn(x)
        got, routed = ep.blocks[0].ffn(x)
        assert torch.equal(got, want) and routed == active
        assert comm.take_loads()[0].tokens_received == 37
        assert torch.equal(ep.dense_logits([1, 2, 3, 4]), full.dense_logits([1, 2, 3, 4]))
    finally:
        dist.destroy_process_group()
    half = Transformer(cfg, seed=SEED)
    for module in half.blocks:
        module.ffn.shard(EPComm(ExpertPlacement(cfg.num_experts, 2, 1)))
    assert torch.equal(half.blocks[2].ffn.w_up, full.blocks[2].ffn.w_up[8:])
    with pytest.raises(ConfigError, match="split evenly"):
        ExpertPlacement(16, 3, 0)


@pytest.mark.slow  # a group of its own: ~10-20 s on two busy cores
def test_a_prefill_group_hands_kv_to_a_decode_engine(tmp_path: Path, engine_parts) -> None:  # type: ignore[no-untyped-def]
    """PD: a DP2×EP2 group in the prefill role, a single decode engine; the decode engine
    fetches each room's KV through the group's bootstrap server from the rank that
    prefilled it and continues as a collocated engine would."""
    from cluster.engines.torch.engine import TorchEngine

    g = DPGroup(CFG, 2, 2, role="prefill", sync_interval=SYNC)
    dec = TorchEngine(CFG, "decode")
    try:
        ep = g.start()
        dec.start()
        info = httpx.get(ep.http_url + "/server_info").json()
        assert info["disaggregation_mode"] == "prefill"
        assert info["disaggregation_bootstrap_port"] == ep.bootstrap_port

        def pd(i: int) -> tuple[str, list[int]]:
            body = {"input_ids": _prompt(30 + i, 50 + i), "bootstrap_host": "127.0.0.1",
                    "bootstrap_port": ep.bootstrap_port, "bootstrap_room": 7000 + i,
                    "data_parallel_rank": i % 2, "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}  # fmt: skip
            with ThreadPoolExecutor(2) as pool:  # what a PD router does
                p = pool.submit(httpx.post, ep.http_url + "/generate", json=body, timeout=60)
                d = pool.submit(httpx.post, dec.endpoints.http_url + "/generate", json=body,
                                timeout=60)  # fmt: skip
                assert p.result().status_code == 200 and d.result().status_code == 200
                return p.result().headers["x-data-parallel-rank"], d.result().json()["output_ids"]

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(pd, range(4)))
        assert [rank for rank, _ in got] == ["0", "1", "0", "1"]
        want = _single_engine(engine_parts, [(_prompt(30 + i, 50 + i), 6) for i in range(4)])
        assert [ids for _, ids in got] == want
    finally:
        dec.stop()
        assert g.stop() == [0, 0]
