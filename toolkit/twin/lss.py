"""The twin of an imported cluster run (`pdlab import lss-run`): its requests replayed on
engine models of its instances (cluster.sim.engine_model.cluster_replay).

`load_cluster_inputs` reads what the import stored: per instance its role, engine settings
and KV blocks (runs.config), its operator profile (operator_profiles: the pricer, with the
GPU's memory bandwidth as the attention floor and the config's link for TP collectives),
the requests with the chained hashes of their token ids in the engines' 16-token blocks
(request_tokens, when prefix caching is on), the PD link and the CPU prefix pool.
`replay_cluster_run` builds one vLLM V1 scheduler per instance (prefix_pool's block-hash
cache when prefix caching is on, a shared shared_pool.SharedPrefixPool as every instance's
connector with a shared CPU pool, a private one each with an unshared CPU tier) and
replays; the front end is the import's (round robin). `instance_setups` and
`instance_parameters` give each instance's replay setup and parameters with their sources
and ranges (toolkit.twin.parameters), and `replay_cluster_run(inputs, setups)` replays
under other setups (the interval's variants, toolkit.validate.cluster).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from cluster.core import ConfigError
from cluster.hardware.engine_settings import EngineSettings, KvCapacity
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile
from cluster.hardware.pricer import IterationPricer
from cluster.kv.hashing import token_block_hashes
from cluster.sim.engine_model import IterationOverhead
from cluster.sim.engine_model.block_pool import BlockPool
from cluster.sim.engine_model.cluster_replay import (
    ClusterReplay,
    ClusterRequest,
    Instance,
    replay_cluster,
)
from cluster.sim.engine_model.prefix_pool import HashedBlockPool
from cluster.sim.engine_model.replay import batch_pricer
from cluster.sim.engine_model.scheduler import StepScheduler
from cluster.sim.engine_model.shared_pool import SharedPrefixPool
from toolkit.queries.run import Source, open_run
from toolkit.twin.parameters import ReplayParameter, ReplaySetup, replay_parameters

ROLE = {"collocated": "both", "prefill": "prefill", "decode": "decode"}
GB = 1e9


class InstanceInputs(NamedTuple):
    role: str  # collocated | prefill | decode
    engine: EngineSettings
    kv_blocks: int
    shape: ModelShape
    pricer: IterationPricer
    host_memory_gib: float | None
    host_memory_gbps: float | None


class ClusterInputs(NamedTuple):
    run_id: str
    instances: list[InstanceInputs]
    requests: list[ClusterRequest]
    prefix_caching: bool
    prefix_pool: str  # none | cpu | cpu-shared
    link_gbps: float | None
    link_latency_s: float
    frontend: str
    config: dict[str, Any]


def load_cluster_inputs(source: Source, run_id: str | None = None) -> ClusterInputs:
    """What the replay of an imported cluster run needs (module docstring)."""
    with open_run(source, run_id) as run:
        rid = run.run_id
        cfg = run.config()
        if cfg.get("importer") != "lss-run":
            raise ConfigError(
                f"run {rid!r} is not a cluster run imported with `pdlab import lss-run`"
            )
        inst_rows = run.df(
            "SELECT * FROM cluster_instances WHERE run_id = ? ORDER BY node_id", [rid]
        ).to_dicts()
        profs = run.df(
            "SELECT model, hardware, tp, profile FROM operator_profiles WHERE run_id = ?", [rid]
        ).to_dicts()
        reqs = run.df(
            "SELECT r.request_id, r.t_arrival, r.t_in, r.t_out, k.input_token_ids, "
            "k.output_token_ids FROM requests r LEFT JOIN request_tokens k "
            "ON k.run_id = r.run_id AND k.request_id = r.request_id WHERE r.run_id = ? "
            "ORDER BY r.t_arrival, try_cast(r.request_id AS BIGINT), r.request_id",
            [rid],
        ).to_dicts()
    if not inst_rows or len(inst_rows) != len(cfg.get("instances", [])):
        raise ConfigError(
            f"run {rid!r}: its cluster_instances and config disagree; import it again"
        )
    pricers: dict[tuple[str, str, int], OperatorProfile] = {
        (p["model"], p["hardware"], int(p["tp"])): OperatorProfile.from_json(
            json.loads(p["profile"]), f"run {rid} profile"
        )
        for p in profs
    }
    instances = []
    for row, ic in zip(inst_rows, cfg["instances"], strict=True):
        key = (row["model"], row["hardware"], int(row["tp"]))
        if key not in pricers:
            raise ConfigError(f"run {rid!r}: no operator profile of {key}")
        prof = pricers[key]
        instances.append(
            InstanceInputs(
                row["role"], EngineSettings.from_json(ic["engine"]), int(ic["kv_blocks"]),
                prof.shape, prof.pricer, row["host_memory_gib"], row["host_memory_gbps"],
            )
        )  # fmt: skip
    pc = bool(inst_rows[0]["prefix_caching"])
    bs = instances[0].engine.block_size
    requests = []
    for r in reqs:
        hashes: tuple[int, ...] = ()
        if pc:
            if r["input_token_ids"] is None:
                raise ConfigError(f"run {rid!r}: request {r['request_id']} has no token ids")
            ids = json.loads(r["input_token_ids"]) + json.loads(r["output_token_ids"])
            hashes = tuple(token_block_hashes(ids, bs))
        requests.append(
            ClusterRequest(
                str(r["request_id"]), float(r["t_arrival"]), int(r["t_in"]), int(r["t_out"]), hashes
            )
        )
    link = cfg.get("link") or {}
    return ClusterInputs(
        rid, instances, requests, pc, str(inst_rows[0]["prefix_pool"]), link.get("link_gbps"),
        float(link.get("link_latency_s") or 0.0), str(cfg.get("frontend", {}).get("rule", "round_robin")),
        cfg,
    )  # fmt: skip


def _pool(inst: InstanceInputs) -> SharedPrefixPool:
    if inst.host_memory_gib is None or inst.host_memory_gbps is None:
        raise ConfigError("a CPU prefix pool needs the node's CPU memory size and bandwidth")
    return SharedPrefixPool(
        inst.host_memory_gib * GB,
        inst.host_memory_gbps * GB,
        inst.shape.kv_bytes_per_token_total(),
        block_size=inst.engine.block_size,
    )


def instance_setups(inputs: ClusterInputs) -> list[ReplaySetup]:
    """What each instance's engine replays with: settings, KV blocks, pricer, no CPU time."""
    return [
        ReplaySetup(x.engine, x.kv_blocks, x.pricer, IterationOverhead()) for x in inputs.instances
    ]


def instance_parameters(inputs: ClusterInputs) -> list[tuple[ReplayParameter, ...]]:
    """Each instance's replay parameters (toolkit.twin.parameters): KV blocks as the import
    estimated them from the config's (nominal) GPU memory, the config's link (described)
    for TP collectives, CPU time and CUDA graphs (the artifact records neither)."""
    out = []
    for i, x in enumerate(inputs.instances):
        said = inputs.config["instances"][i].get("sources", {}).get("kv_blocks", "")
        per_token = x.engine.kv_bytes_per_token(x.shape)
        kv = KvCapacity(
            x.kv_blocks * x.engine.block_size, x.kv_blocks, per_token,
            "GPU memory" if said.startswith("estimated") else "recorded KV blocks",
        )  # fmt: skip
        pd = x.role in ("prefill", "decode")
        link = "described (cluster config)"
        out.append(replay_parameters(x.engine, x.shape, x.pricer, kv, link, kv_transfers=pd))
    return out


def build_instances(
    inputs: ClusterInputs, setups: list[ReplaySetup] | None = None
) -> tuple[list[Instance], SharedPrefixPool | None]:
    """One scheduler and price per instance, and the shared pool (module docstring)."""
    shared = _pool(inputs.instances[0]) if inputs.prefix_pool == "cpu-shared" else None
    out = []
    for inst, s in zip(inputs.instances, setups or instance_setups(inputs), strict=True):
        e = s.engine
        pool: Any = (
            HashedBlockPool(s.kv_blocks, e.block_size)
            if inputs.prefix_caching
            else BlockPool(s.kv_blocks, e.block_size, prefix_caching=False)
        )
        connector = (
            shared if shared is not None else (_pool(inst) if inputs.prefix_pool == "cpu" else None)
        )
        sched = StepScheduler(
            pool,
            e.max_num_seqs or 256,
            e.max_num_batched_tokens or 2048,
            long_prefill_token_threshold=e.long_prefill_token_threshold or 0,
            reserve_full_prompt=e.reserve_full_prompt is not False,
            enable_chunked_prefill=e.enable_chunked_prefill,
            connector=connector,
        )
        price = batch_pricer(s.pricer, s.overhead)
        out.append(
            Instance(ROLE[inst.role], sched, lambda b, price=price: price(b, float(b.num_tokens)))
        )
    return out, shared


def kv_transfer_s(inputs: ClusterInputs, setups: list[ReplaySetup] | None = None) -> Any:
    """Seconds a PD split sends one request's prompt KV: latency + bytes over the link (the
    config's, which the prefill instance's pricer carries: a variant's, with `setups`)."""
    per_token = inputs.instances[0].shape.kv_bytes_per_token_total()
    gbps, lat = inputs.link_gbps, inputs.link_latency_s
    if setups is not None:
        sender = next(
            (s for x, s in zip(inputs.instances, setups, strict=True) if x.role == "prefill"), None
        )
        base = next((x for x in inputs.instances if x.role == "prefill"), None)
        if sender is not None and base is not None:
            # the variant's link relative to the import's (collective_cost, link_gbps, ...)
            b, v = base.pricer.parallel, sender.pricer.parallel
            gbps = None if gbps is None else gbps * v.link_gbps / b.link_gbps
            lat = lat * v.link_latency_s / b.link_latency_s if b.link_latency_s else lat
    if gbps is None:
        return lambda _tokens: lat
    return lambda tokens: lat + tokens * per_token / (gbps * GB)


def replay_cluster_run(
    inputs: ClusterInputs, setups: list[ReplaySetup] | None = None
) -> ClusterReplay:
    """Replay the run's requests on its instances (under `setups`, else their own)."""
    instances, shared = build_instances(inputs, setups)
    return replay_cluster(
        inputs.requests, instances, frontend=inputs.frontend,
        kv_transfer_s=kv_transfer_s(inputs, setups), pool=shared,
    )  # fmt: skip


def weights_mib(inputs: ClusterInputs, node: int) -> float:
    """Model weights on one GPU of an instance (what gpu_mem_mb counts besides KV), MiB."""
    inst = inputs.instances[node]
    return inst.shape.weight_bytes(inst.engine.tensor_parallel_size) / 2**20


def block_mib(inputs: ClusterInputs, node: int) -> float:
    inst = inputs.instances[node]
    return (
        inst.engine.block_size
        * inst.shape.kv_bytes_per_token(inst.engine.tensor_parallel_size)
        / 2**20
    )
