"""A recorded run of a torch engine group (`pdlab engine --dp N --ep N --log-dir DIR`).

The log directory holds `group.json` (the group's settings, `dp_group.DPGroup.describe`),
`frontend.jsonl` (each request's rank and arrival at the front end) and one
`rank{r}.jsonl` per DP rank (`cluster.engines.torch.rank_log`: every pass with its wave
and step, the MoE layers' loads, the requests it served). `read_group_run` turns them into
one run of the SPEC §3 tables, as `pdlab twin` reads a vLLM run:

- `runs.config["engine"]`: EngineSettings of one rank (max_num_seqs = the running cap,
  max_num_batched_tokens = the prefill chunk budget, TP 1, DP, EP, KV blocks per rank,
  prefill and decode passes never mixed, prefix caching on), `model_shape` (the preset as
  a Hugging Face config), `arrivals` 'recorded', the DP and EP settings (`dp_group`:
  sync interval, load-balancing rule, all-to-all backend), and `interconnect` when the
  caller measured one (`link_gbps`, `link_latency_s`, `source`);
- `nodes`: one per DP rank; `requests`: prefill_node = decode_node = the rank that served
  it; t_arrival when it reached the rank's engine (its HTTP server handed it to the
  scheduler, as a request reaches vLLM's engine core: the loop takes it in at the next
  pass boundary, which the twin replays), or, in logs written before ranks logged that,
  when the scheduler took it in (config "arrival_anchor" says which); t_sent the front
  end's arrival; time 0 is the first such arrival;
- `prefill_iterations`, `decode_iterations` (per rank), `dp_passes` (dummy passes too) and
  `moe_layer_loads`.
Requests that did not finish (aborted) are left out and named in the config's
"failed_request_ids".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from cluster.engines.torch.config import ModelConfig
from cluster.engines.torch.rank_log import read_rank_logs
from cluster.hardware.engine import EngineSettings
from cluster.hardware.model_shape import ModelShape
from telemetry import TelemetryError, live, store
from telemetry.validate import validate_batch
from toolkit.importers.bench_run import BenchRun
from toolkit.importers.fields import ImportFileError

ENGINE = "pdlab-torch"


@dataclass(slots=True)
class GroupRun:
    """A group's run: the BenchRun tables plus iterations, passes and layer loads."""

    bench: BenchRun
    tables: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def batches(self) -> dict[str, pa.Table]:
        out = self.bench.batches()
        nodes = set(range(len(self.bench.node_names)))
        for name, cols in self.tables.items():
            out[name] = validate_batch(name, cols, self.bench.run_id, nodes)
        return out


def engine_settings(group: dict[str, Any]) -> EngineSettings:
    """One rank's settings as EngineSettings (module docstring)."""
    e = group["engine"]
    m = e["model"]
    return EngineSettings(
        engine=ENGINE, model=f"pdlab/{m['name']}", max_num_seqs=int(e["max_running"]),
        max_num_batched_tokens=int(e["chunk_tokens"]), tensor_parallel_size=1,
        data_parallel_size=int(group["dp"]), expert_parallel_size=int(group["ep"]),
        block_size=int(e["page_size"]), num_gpu_blocks=int(e["gpu_pages"]),
        enable_chunked_prefill=True, mixed_prefill_decode=False, enable_prefix_caching=True,
        max_model_len=int(m["max_context_tokens"]), kv_cache_dtype=str(e["dtype"]),
        async_scheduling=False, reserve_full_prompt=True, scheduling_policy="fcfs",
        hardware=f"{e['device']}, {e['num_threads']} torch thread(s) per rank "
        f"({group.get('cpu_count')} cores)",
        engine_version="0.5.23-pdlab-torch",
    )  # fmt: skip


def read_group_run(
    log_dir: str | Path, run_id: str, *, interconnect: dict[str, Any] | None = None,
    extra_config: dict[str, Any] | None = None,
) -> GroupRun:  # fmt: skip
    d = Path(log_dir)
    try:
        group = json.loads((d / "group.json").read_text())
    except FileNotFoundError:
        raise ImportFileError(
            d / "group.json", 1, None, "missing (record with --log-dir)"
        ) from None
    logs = read_rank_logs(d)
    assigns = {r["rid"]: r for r in _jsonl(d / "frontend.jsonl")}
    reqs = sorted(logs.get("request", []), key=lambda r: r["t_queued"])
    done = [r for r in reqs if r["finish"] in ("length", "stop") and r["t_first_token"]]
    failed = sorted(r["rid"] for r in reqs if r not in done)
    sent = [assigns[r["rid"]]["t_arrival"] for r in done if r["rid"] in assigns]
    engine_arrival = all("t_arrival" in r for r in done)
    arrive = "t_arrival" if engine_arrival else "t_queued"
    t0 = min([r[arrive] for r in done] + sent) if done else 0.0
    model = ModelConfig(**group["engine"]["model"])
    shape = ModelShape.from_hf_config(model.hf_config(), source=model.name)
    config = {
        "engine": engine_settings(group).to_json(), "model_shape": shape.to_json(),
        "arrivals": "recorded", "source_dir": str(d), "failed_request_ids": failed,
        "arrival_anchor": "engine: the rank's HTTP server handed it to the scheduler"
        if engine_arrival else "scheduler intake (at a pass boundary; older logs)",
        "dp_group": {k: group[k] for k in ("dp", "ep", "tp", "sync_interval",
                                           "stats_interval_s", "load_balance", "all_to_all",
                                           "cpu_count", "load_avg")},
        "torch_engine": group["engine"],
        "scheduling": "SGLang-style, per rank: a prefill pass (FCFS chunks under "
        "max_num_batched_tokens) whenever a waiting request fits, else one decode pass over "
        "every running request; never mixed; KV for prompt + max_new_tokens reserved at "
        "admission (no preemption)", **(extra_config or {}),
    }  # fmt: skip
    if interconnect is not None:
        config["interconnect"] = interconnect
    start = datetime.fromtimestamp(group["wall_s"] + t0 - group["monotonic_s"], tz=UTC)
    bench = BenchRun(
        run_id, start.replace(tzinfo=None), "torch-group", config,
        [f"dp{r}" for r in range(int(group["dp"]))], str(config["engine"]["hardware"]),
        model.top_k, model.num_experts,
    )  # fmt: skip
    for r in done:
        a = assigns.get(r["rid"])
        bench.add_request(
            request_id=r["rid"], program_id=r["rid"], branch_id=r["rid"],
            t_arrival=r[arrive] - t0, prefill_node=r["rank"], decode_node=r["rank"],
            t_in=r["t_in"], t_c=r["t_c"], t_fetch=0, t_out=r["t_out"],
            t_prefill_start=r["t_prefill_start"] - t0, t_first_token=r["t_first_token"] - t0,
            t_done=r["t_done"] - t0, t_sent=None if a is None else a["t_arrival"] - t0,
        )  # fmt: skip
    return GroupRun(bench, _pass_tables(logs, t0))


def _pass_tables(logs: dict[str, list[dict[str, Any]]], t0: float) -> dict[str, Any]:
    tabs: dict[str, dict[str, list[Any]]] = {}

    def add(table: str, **row: Any) -> None:
        cols = tabs.setdefault(table, {k: [] for k in row})
        for k, v in row.items():
            cols[k].append(v)

    for p in logs.get("pass", []):
        t = max(p["t_start"] - t0, 0.0)
        node, kind, dur = p["rank"], p["kind"], max(p["duration_s"], 1e-9)
        add("dp_passes", node_id=node, pass_id=p["pass_id"], wave=p["wave"], step=p["step"],
            kind=kind, iter_id=None if kind == "dummy" else p["iter_id"], t_start=t,
            duration_s=dur)  # fmt: skip
        if kind == "prefill":
            add("prefill_iterations", node_id=node, iter_id=p["iter_id"], t_start=t,
                duration_s=dur, num_reqs=p["num_reqs"], t_uc=p["t_uc"],
                attn_pairs=float(p["attn_pairs"]), t_rst=p["t_rst"], t_c=p["t_c"],
                experts_active=p["experts_active"])  # fmt: skip
        elif kind == "decode":
            add("decode_iterations", node_id=node, iter_id=p["iter_id"], t_start=t,
                duration_s=dur, batch_size=p["batch_size"], t_fwd=1.0,
                ctx_tokens=p["ctx_tokens"], experts_active=p["experts_active"])  # fmt: skip
    for x in logs.get("layer", []):
        add("moe_layer_loads", node_id=x["rank"], pass_id=x["pass_id"], layer=x["layer"],
            tokens_in=x["tokens_in"], tokens_received=x["tokens_received"],
            experts_activated=x["experts_activated"], comm_s=x.get("comm_s"))  # fmt: skip
    return tabs


def write_group_run(db_path: str | Path, run: GroupRun) -> str:
    """Insert the run in one transaction (nothing is written on error); returns its id."""
    rid = run.bench.run_id
    live.check_run_id(rid)
    batches = run.batches()
    db = Path(db_path)
    with store.transaction(db, what=f"import run {rid}") as con:
        if store.run_exists(con, db, rid) or live.run_dir(db, rid).exists():
            raise TelemetryError(f"run {rid!r} already exists in {db}; use another run id")
        for table, batch in batches.items():
            if batch.num_rows:
                store.insert(con, table, batch)
    return rid


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
