"""`pdlab import lss-run`: a real run of a serving cluster, described as LLMServingSim does.

One import stores, in one transaction (toolkit.importers.bench_run.write_runs):
- `runs` (source 'lss-run'; config: the cluster config as read, each instance's engine
  settings with where each value came from, the front-end rule, the PD TTFT definition and
  every assumption), `nodes` (one per instance) and `cluster_instances` (role, TP, memory,
  links, prefix tiers: lss_config);
- `requests` (arrival, input and output tokens; no per-request times: the artifact records
  only series) and `request_tokens` (their token ids, when the file has them);
- `operator_profiles`: each (model, GPU, TP) profile built from `--profiles`
  (cluster.hardware.operator_profile, layers.csv or dense.csv layout, the GPU's memory
  bandwidth as the attention floor, the config's link for TP collectives);
- `reference_series` (the real run's series and peers' found beside them, lss_refs) and
  `reference_latency`.
Engine settings the artifact does not record are assumed and stored as such: vLLM V1's
OpenAI-server defaults for the instance's GPU memory (`vllm_server_defaults`: 256 sequences
and 2,048 tokens per iteration below 70 GiB) unless `--max-num-seqs` /
`--max-num-batched-tokens` say otherwise; KV capacity from the config's GPU memory at vLLM's
default utilization 0.9; 16-token blocks; chunked prefill; prefix caching only with
`--prefix-caching` (the setups without "PC" ran without it).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster.core import ConfigError
from cluster.hardware.engine_settings import GIB, EngineSettings, vllm_server_defaults
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile, build_profile
from cluster.hardware.pricer import Parallelism
from models.fitting import FitError
from toolkit.importers.bench_run import BenchRun
from toolkit.importers.fields import ImportFileError
from toolkit.importers.lss_config import (
    ClusterSpec,
    DatasetRequest,
    find_profile_dir,
    read_cluster_config,
    read_dataset,
)
from toolkit.importers.lss_refs import (
    LatencyRow,
    SeriesRow,
    peer_files,
    read_latency,
    read_series,
    series_kind,
)

FRONTEND = {
    "rule": "round_robin",
    "why": "LLMServingSim's real two-instance run (figure 7, MD+PC+PS): instance 1's prefix-"
    "cache queries total the prompt tokens of the even-indexed requests (39,877) and "
    "instance 2's those of the odd-indexed ones (42,768); LLMServingSim's own router "
    "defaults to round robin too",
}
PD_TTFT = (
    "vLLM's PD proxy: the client's first token comes from the decode instance: prefill queue "
    "and compute (max_tokens=1) + KV transfer over link_bw + the decode instance's queue and "
    "first step (it recomputes the last prompt token)"
)
PREFIX_STORAGE = ("cpu",)


def _shapes(spec: ClusterSpec, models: Path) -> dict[str, ModelShape]:
    out = {}
    for inst in spec.instances:
        if inst.model in out:
            continue
        path = models / f"{inst.model}.json"
        if not path.is_file():
            raise ImportFileError(path, 0, None, f"file is missing (the HF config of {inst.model})")
        out[inst.model] = ModelShape.load(path)
    return out


def _profiles(
    spec: ClusterSpec, shapes: dict[str, ModelShape], root: Path
) -> dict[tuple[str, str, int], tuple[OperatorProfile, str]]:
    out = {}
    for inst in spec.instances:
        key = (inst.model, inst.hardware, inst.tp)
        if key in out:
            continue
        folder, measured = find_profile_dir(root, inst.hardware, inst.model, inst.tp)
        par = Parallelism(
            tp=inst.tp,
            link_gbps=spec.link_gbps or Parallelism.link_gbps,
            link_latency_s=spec.link_latency_s
            if spec.link_latency_s is not None
            else Parallelism.link_latency_s,
        )
        stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in folder.iterdir()))
        memo = (str(folder.resolve()), stamp, shapes[inst.model], inst.tp, measured, par,
                inst.memory_gbps, inst.hardware)  # fmt: skip
        if memo not in _BUILT:
            try:
                _BUILT[memo] = build_profile(
                    folder, shapes[inst.model], tp=inst.tp, profiled_tp=measured, parallel=par,
                    hardware=inst.hardware, name=f"{inst.model}-{inst.hardware}-tp{inst.tp}",
                    memory_gbps=inst.memory_gbps,
                )  # fmt: skip
            except (FitError, ValueError) as exc:  # ConfigError, ProfileError are ValueErrors
                raise ConfigError(f"profile {folder}: {exc}") from None
        out[key] = (_BUILT[memo], str(folder))
    return out


# Profiles built in this process, by folder (and its files' times) and settings: importing
# several setups of one artifact fits each profile once.
_BUILT: dict[tuple[Any, ...], OperatorProfile] = {}


def _engines(
    spec: ClusterSpec,
    shapes: dict[str, ModelShape],
    prefix_caching: bool,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    gpu_memory_gib: float | None,
) -> list[dict[str, Any]]:
    out = []
    for i, inst in enumerate(spec.instances):
        gib = gpu_memory_gib or inst.gpu_memory_gib
        seqs, tokens = vllm_server_defaults(int(gib * GIB), inst.hardware)
        es = EngineSettings(
            engine="vllm",
            model=inst.model,
            max_num_seqs=max_num_seqs or seqs,
            max_num_batched_tokens=max_num_batched_tokens or tokens,
            tensor_parallel_size=inst.tp,
            block_size=16,
            gpu_memory_bytes=int(gib * GIB),
            enable_prefix_caching=prefix_caching,
            hardware=inst.hardware,
        )
        try:
            kv = es.kv_capacity(shapes[inst.model])
        except ConfigError as exc:
            raise ConfigError(f"instance {i} ({inst.model} on {inst.hardware}): {exc}") from None
        out.append(
            {
                "engine": es.to_json(),
                "kv_blocks": kv.blocks,
                "sources": {
                    "max_num_seqs": "flag" if max_num_seqs else "assumed: vLLM V1 server default",
                    "max_num_batched_tokens": "flag"
                    if max_num_batched_tokens
                    else "assumed: vLLM V1 server default",
                    "gpu_memory": "flag" if gpu_memory_gib else "config npu_mem.mem_size",
                    "kv_blocks": "estimated from GPU memory at utilization 0.9 "
                    "(cluster.hardware.engine_settings.kv_capacity)",
                    "block_size": "recorded (LLMServingSim --block-size 16)",
                    "prefix_caching": "flag",
                },
            }
        )
    return out


def _references(
    throughput: Path | None, latency: Path | None, prefix: list[Path], n_instances: int
) -> tuple[list[SeriesRow], list[LatencyRow]]:
    rows: list[SeriesRow] = []

    def add(path: Path, node: int | None) -> None:
        rows.extend(read_series(path, "real", node))
        for peer, file in peer_files(path).items():
            rows.extend(read_series(file, peer, node, optional_values=True))

    if throughput is not None:
        if series_kind(throughput) != "throughput":
            raise ImportFileError(throughput, 1, "throughput", "missing column (tokens per tick)")
        add(throughput, None)
    inst = 0
    for path in prefix:
        kind = series_kind(path)
        if kind == "throughput":
            raise ImportFileError(
                path, 1, None, "a throughput series: pass it as --reference-throughput"
            )
        if kind == "pool":
            add(path, None)
            continue
        if inst >= n_instances:
            raise ImportFileError(
                path,
                1,
                None,
                f"one --reference-prefix file per instance: the config has {n_instances}",
            )
        add(path, inst)
        inst += 1
    return rows, read_latency(latency) if latency is not None else []


def read_lss_run(
    config: str | Path,
    dataset: str | Path,
    profiles: str | Path,
    models: str | Path,
    name: str,
    *,
    prefix_caching: bool = False,
    prefix_storage: str | None = None,
    prefix_sharing: bool = False,
    reference_throughput: str | Path | None = None,
    reference_latency: str | Path | None = None,
    reference_prefix: list[str | Path] | tuple[str | Path, ...] = (),
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_gib: float | None = None,
) -> BenchRun:
    """Parse everything into one BenchRun (module docstring); ImportFileError or ConfigError
    name what is wrong."""
    if prefix_storage is not None and prefix_storage.lower() not in PREFIX_STORAGE:
        raise ConfigError(f"--prefix-storage {prefix_storage!r}: only 'cpu' is modelled")
    if prefix_sharing and prefix_storage is None:
        raise ConfigError(
            "--prefix-sharing shares a prefix storage tier: pass --prefix-storage cpu"
        )
    if (prefix_storage or prefix_sharing) and not prefix_caching:
        raise ConfigError("--prefix-storage and --prefix-sharing need --prefix-caching")
    for flag, v in (
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be >= 1, got {v}")
    spec = read_cluster_config(config)
    pool = "none" if prefix_storage is None else ("cpu-shared" if prefix_sharing else "cpu")
    if pool != "none" and any(
        i.host_memory_gib is None or i.host_memory_gbps is None for i in spec.instances
    ):
        raise ConfigError(
            f"{config}: a CPU prefix pool needs each node's cpu_mem mem_size and mem_bw"
        )
    requests = read_dataset(dataset, need_ids=prefix_caching)
    shapes = _shapes(spec, Path(models))
    engines = _engines(
        spec, shapes, prefix_caching, max_num_seqs, max_num_batched_tokens, gpu_memory_gib
    )
    series, latency = _references(
        None if reference_throughput is None else Path(reference_throughput),
        None if reference_latency is None else Path(reference_latency),
        [Path(p) for p in reference_prefix],
        len(spec.instances),
    )
    profs = _profiles(spec, shapes, Path(profiles))
    return _assemble(name, spec, requests, shapes, engines, profs, series, latency, pool, {
        "config": str(config), "dataset": str(dataset), "profiles": str(profiles),
        "models": str(models), "prefix_caching": prefix_caching, "prefix_storage": prefix_storage,
        "prefix_sharing": prefix_sharing,
    })  # fmt: skip


def _assemble(
    name: str,
    spec: ClusterSpec,
    requests: list[DatasetRequest],
    shapes: dict[str, ModelShape],
    engines: list[dict[str, Any]],
    profs: dict[tuple[str, str, int], tuple[OperatorProfile, str]],
    series: list[SeriesRow],
    latency: list[LatencyRow],
    pool: str,
    given: dict[str, Any],
) -> BenchRun:
    insts = spec.instances
    moe = [shapes[i.model] for i in insts]
    run = BenchRun(
        run_id=name,
        started_at=datetime(1970, 1, 1),  # the artifact records no wall time
        source="lss-run",
        config={},
        node_names=[f"inst{i}-{x.role}" for i, x in enumerate(insts)],
        hardware=insts[0].hardware,
        moe_top_k=moe[0].top_k if moe[0].is_moe else 0,
        moe_experts=moe[0].num_experts if moe[0].is_moe else 0,
    )
    for r in requests:
        rid = str(r.index)
        run.add_request(
            request_id=rid, program_id=rid, branch_id=rid, t_arrival=r.arrival_s,
            t_in=r.input_tokens, t_c=0, t_fetch=0, t_out=r.output_tokens,
        )  # fmt: skip
    cols = ("node_id", "model", "hardware", "tp", "role", "gpu_memory_gib", "memory_gbps",
            "link_gbps", "link_latency_s", "host_memory_gib", "host_memory_gbps",
            "prefix_caching", "prefix_pool")  # fmt: skip
    run.extra["cluster_instances"] = {
        c: [
            {
                "node_id": i, "model": x.model, "hardware": x.hardware, "tp": x.tp, "role": x.role,
                "gpu_memory_gib": engines[i]["engine"]["gpu_memory_bytes"] / GIB,
                "memory_gbps": x.memory_gbps, "link_gbps": spec.link_gbps,
                "link_latency_s": spec.link_latency_s, "host_memory_gib": x.host_memory_gib,
                "host_memory_gbps": x.host_memory_gbps, "prefix_caching": given["prefix_caching"],
                "prefix_pool": pool,
            }[c]
            for i, x in enumerate(insts)
        ]
        for c in cols
    }  # fmt: skip
    with_ids = [r for r in requests if r.input_ids is not None and r.output_ids is not None]
    if with_ids:
        run.extra["request_tokens"] = {
            "request_id": [str(r.index) for r in with_ids],
            "input_token_ids": [json.dumps(r.input_ids) for r in with_ids],
            "output_token_ids": [json.dumps(r.output_ids) for r in with_ids],
        }
    run.extra["operator_profiles"] = {
        "model": [k[0] for k in profs],
        "hardware": [k[1] for k in profs],
        "tp": [k[2] for k in profs],
        "source": [src for _, src in profs.values()],
        "profile": [json.dumps(p.to_json()) for p, _ in profs.values()],
    }
    if series:
        run.extra["reference_series"] = {
            f: [getattr(s, f) for s in series]
            for f in ("source", "scope", "node_id", "metric", "t", "value")
        }
    if latency:
        run.extra["reference_latency"] = {
            f: [getattr(x, f) for x in latency]
            for f in ("framework", "is_real", "throughput_tok_s", "ttft_mean_s", "tpot_mean_s", "e2e_mean_s")
        }  # fmt: skip
    run.config = {
        "importer": "lss-run",
        **given,
        "cluster_config": spec.doc,
        "instances": [
            {"model": x.model, "hardware": x.hardware, "tp": x.tp, "role": x.role, **engines[i]}
            for i, x in enumerate(insts)
        ],
        "link": {
            "link_gbps": spec.link_gbps,
            "link_latency_s": spec.link_latency_s,
            "source": "config",
        },
        "prefix_pool": pool,
        "frontend": FRONTEND,
        "pd_ttft": PD_TTFT,
        "arrivals": "recorded",
        "series_origin": "ticks count seconds from the first arrival; a throughput tick k >= 1 "
        "holds the tokens generated in (k-1, k]",
        "assumptions": [
            "vLLM version, max_num_seqs and max_num_batched_tokens not recorded: vLLM V1's "
            "OpenAI-server defaults for the GPU's memory unless flags say otherwise",
            "KV capacity estimated from the config's GPU memory at utilization 0.9",
            "no CPU time per iteration (the profiles are eager GPU operator times)",
        ],
        "metrics": {
            "ttft": "t_first_token - t_arrival (first token the client sees)",
            "tpot": "(t_done - t_first_token) / (t_out - 1)",
            "e2e": "t_done - t_arrival",
        },
    }
    return run
