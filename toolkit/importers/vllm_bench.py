"""`pdlab import vllm-bench DIR`: a vLLM serving run recorded by LLMServingSim's bench.

The directory holds `meta.json` (engine_kwargs, and in newer runs kv_cache, hardware and
vLLM's resolved config) and `requests.jsonl`, one request per line: `input_toks`,
`output_toks`, `arrival_time` (front-end wall clock, epoch s) and vLLM's
RequestStateStats `queued_ts`, `scheduled_ts`, `first_token_ts`, `last_token_ts` (engine
monotonic clock). Two clocks: times are never subtracted across them. As the bench's own
validation does, the arrival anchor is `arrival_time` when it is on the engine's clock
(within a day of first_token_ts for every request), else `queued_ts`; the run's time 0 is
the first anchor. So t_arrival, t_prefill_start (scheduled), t_first_token and t_done are
on the engine clock, and TTFT = first_token_ts - anchor, E2E = last_token_ts - anchor,
TPOT = (last_token_ts - first_token_ts) / (output_toks - 1). The wall-clock send times go
to t_sent (seconds since the first send). A request without timestamps (no metrics: it
failed) is left out and listed in the config's "failed_request_ids".

Engine settings (cluster.hardware.engine_settings.EngineSettings) come from engine_kwargs, then
kv_cache / hardware / resolved_config where present, with vLLM V1's defaults where neither
says (chunked prefill and prefix caching on, block 16). One node per DP rank; a request's
rank is its `dp_rank` field when recorded, else 0 (the config's "dp_ranks" says which). The
nodes' MoE shape comes from `--model-config` (dense when absent unless vLLM says the model
is MoE: then it is required).

An optional `llmservingsim_validation.txt` (LLMServingSim's own summary of its replay of the
run: mean TTFT, TPOT and latency, vLLM and Sim, ms) goes into `reference_latency`, the peer's
figures `pdlab validate` shows.

An optional `timeseries.csv` (the bench's per-tick engine counters: running and waiting
requests, KV cache use, token throughputs) goes into `reference_series` (source 'real',
scope 'cluster'; toolkit.importers.bench_series), which `pdlab report` draws.

An optional `cluster_config.json` (LLMServingSim's description of the machine the run
used) adds the interconnect between an engine's GPUs, `link_bw` (GB/s) and `link_latency`
(ns), to the config's "interconnect" (what TP/EP collectives cost: the twin prices them
with it), and the GPU memory (`npu_mem.mem_size`, GiB: a nominal size) and GPU name
(`hardware`) when meta.json has none. `gpu_memory_source` says whether the memory is the
device's own total ("device") or a nominal figure (the twin's KV estimate carries the
difference).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster import size_limits as limits
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.model_shape import ModelShape
from toolkit.importers.bench_run import BenchRun
from toolkit.importers.bench_series import read_series
from toolkit.importers.fields import MAX_SPAN_S, Fields, ImportFileError, json_lines, load_json

SAME_CLOCK_S = 100_000.0  # two timestamps within ~a day are on one clock (bench validate.py)
ORDER_SLACK_S = 1e-6
TIMESTAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def _eager(meta: Fields) -> bool | None:
    """vLLM's enforce_eager (no CUDA graphs), None when meta.json does not say."""
    res = meta.sub("resolved_config")
    model_cfg = res.sub("model_config") if res else None
    return model_cfg.boolean("enforce_eager") if model_cfg else None


def _engine(meta: Fields) -> tuple[EngineSettings, bool]:
    """Engine settings and whether vLLM says the model is MoE."""
    kw = meta.sub("engine_kwargs", required=True)
    assert kw is not None
    kv = meta.sub("kv_cache")
    hw = meta.sub("hardware")
    res = meta.sub("resolved_config")
    sched = res.sub("scheduler_config") if res else None
    cache = res.sub("cache_config") if res else None
    comp = res.sub("compilation_config") if res else None
    model_cfg = res.sub("model_config") if res else None
    par = res.sub("parallel_config") if res else None

    def first(*got: Any) -> Any:
        return next((g for g in got if g is not None), None)

    for where in (kv, cache):
        u = where.number("gpu_memory_utilization") if where else None
        if where is not None and u is not None and not 0 < u <= 1:
            raise where.fail("gpu_memory_utilization", f"must be in (0, 1], got {u}")
    tp = kw.integer("tensor_parallel_size", minimum=1, maximum=int(limits.TENSOR_PARALLEL.hi)) or 1
    dp = kw.integer("data_parallel_size", minimum=1, maximum=int(limits.DATA_PARALLEL.hi)) or 1
    ep = bool(kw.boolean("enable_expert_parallel"))
    eager = model_cfg.boolean("enforce_eager") if model_cfg else None
    graphs = comp.integer("max_cudagraph_capture_size", minimum=0) if comp else None
    sizes = comp.array("cudagraph_capture_sizes") if comp else None
    if sizes is not None and not all(isinstance(x, int) and x > 0 for x in sizes):
        raise comp.fail("cudagraph_capture_sizes", "expected positive integers")  # type: ignore[union-attr]
    settings = EngineSettings(
        engine="vllm",
        model=first(kw.string("model"), meta.string("model")),
        max_num_seqs=first(
            kw.integer("max_num_seqs", minimum=1),
            sched.integer("max_num_seqs", minimum=1) if sched else None,
        ),
        max_num_batched_tokens=first(
            kw.integer("max_num_batched_tokens", minimum=1),
            sched.integer("max_num_batched_tokens", minimum=1) if sched else None,
        ),
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        expert_parallel_size=tp * dp if ep else 1,
        block_size=first(
            kv.integer("block_size", minimum=1) if kv else None,
            cache.integer("block_size", minimum=1) if cache else None,
            16,
        ),
        num_gpu_blocks=first(
            kv.integer("num_gpu_blocks", minimum=1) if kv else None,
            cache.integer("num_gpu_blocks", minimum=1) if cache else None,
        ),
        gpu_memory_utilization=first(
            kv.number("gpu_memory_utilization") if kv else None,
            cache.number("gpu_memory_utilization") if cache else None,
        ),
        gpu_memory_bytes=hw.integer("device_total_memory_bytes", minimum=1) if hw else None,
        enable_chunked_prefill=first(
            sched.boolean("enable_chunked_prefill") if sched else None, True
        ),
        enable_prefix_caching=first(
            kv.boolean("enable_prefix_caching") if kv else None,
            cache.boolean("enable_prefix_caching") if cache else None,
            True,
        ),
        max_model_len=first(
            kw.integer("max_model_len", minimum=1),
            model_cfg.integer("max_model_len", minimum=1) if model_cfg else None,
        ),
        kv_cache_dtype=kw.string("kv_cache_dtype") or "auto",
        cuda_graph_max_batch=None if eager else graphs,
        cuda_graph_sizes=None if eager or sizes is None else tuple(sorted(sizes)),
        async_scheduling=sched.boolean("async_scheduling") if sched else None,
        max_num_partial_prefills=sched.integer("max_num_partial_prefills", minimum=1)
        if sched
        else None,
        long_prefill_token_threshold=sched.integer("long_prefill_token_threshold")
        if sched
        else None,
        reserve_full_prompt=sched.boolean("scheduler_reserve_full_isl") if sched else None,
        scheduling_policy=sched.string("policy") if sched else None,
        hardware=hw.string("device_name") if hw else None,
        engine_version=meta.string("vllm_version"),
        mixed_prefill_decode=True,
    )
    is_moe = bool(par.boolean("is_moe_model")) if par else False
    return settings, is_moe


def _cluster(path: Path) -> tuple[dict[str, Any] | None, float | None, str | None]:
    """(interconnect, GPU GiB, GPU name) of an optional cluster description (module doc)."""
    if not path.exists():
        return None, None, None
    doc, text = load_json(path)
    top = Fields(doc, path, None, text)
    bw, lat = top.number("link_bw"), top.number("link_latency")
    if bw is not None and bw <= 0:
        raise top.fail("link_bw", f"must be > 0 GB/s, got {bw}")
    if lat is not None and lat < 0:
        raise top.fail("link_latency", f"must be >= 0 ns, got {lat}")
    link = None
    if bw is not None or lat is not None:
        link = {
            "link_gbps": bw,
            "link_latency_s": None if lat is None else lat * 1e-9,
            "source": path.name,
        }
    gib = gpu = None
    nodes = top.array("nodes")
    inst = nodes[0].get("instances") if nodes and isinstance(nodes[0], dict) else None
    if isinstance(inst, list) and inst and isinstance(inst[0], dict):
        mem = inst[0].get("npu_mem")
        size = mem.get("mem_size") if isinstance(mem, dict) else None
        if isinstance(size, int | float) and not isinstance(size, bool) and size > 0:
            gib = float(size)
        hw = inst[0].get("hardware")
        gpu = hw.strip() if isinstance(hw, str) and hw.strip() else None
    return link, gib, gpu


def _peer_means(path: Path) -> dict[str, list[Any]] | None:
    """reference_latency rows of LLMServingSim's own validation summary of the run (its
    `Metric / vLLM / Sim / Diff%` table, ms), when the directory has one."""
    if not path.is_file():
        return None
    want = {"TTFT Mean": "ttft_mean_s", "TPOT Mean": "tpot_mean_s", "Latency Mean": "e2e_mean_s"}
    got: dict[str, tuple[float, float]] = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        for label, col in want.items():
            if line.startswith(label):
                parts = line[len(label) :].split()
                try:
                    got[col] = (float(parts[0]) / 1e3, float(parts[1]) / 1e3)
                except (IndexError, ValueError):
                    raise ImportFileError(
                        path, i, label, f"expected vLLM and Sim ms, got {line!r}"
                    ) from None
    if not got:
        return None
    rows: dict[str, list[Any]] = {"framework": ["vLLM", "LLMServingSim"], "is_real": [True, False]}
    rows["throughput_tok_s"] = [None, None]
    for col in want.values():
        rows[col] = [got[col][0], got[col][1]] if col in got else [None, None]
    return rows


def _started_at(meta: Fields, first_send: float | None) -> datetime:
    text = meta.string("started_at")
    if text:
        try:
            ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
            return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo else ts
        except (ValueError, OverflowError):
            raise meta.fail("started_at", f"not an ISO 8601 time: {text[:40]!r}") from None
    if first_send is not None:
        return datetime.fromtimestamp(first_send, UTC).replace(tzinfo=None)
    return datetime(1970, 1, 1)


def _requests(path: Path, dp: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Completed requests (validated) and the ids of failed ones."""
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    seen: dict[str, int] = {}
    for i, obj in json_lines(path):
        f = Fields(obj, path, i)
        rid = f.string("request_id", required=True)
        assert rid is not None
        if rid in seen:
            raise f.fail("request_id", f"{rid!r} repeats the request of line {seen[rid]}")
        seen[rid] = i
        row: dict[str, Any] = {
            "line": i,
            "request_id": rid,
            "t_in": f.tokens("input_toks", required=True, minimum=1),
            "t_out": f.tokens("output_toks", required=True, minimum=1),
            "arrival_time": f.timestamp("arrival_time"),
            "dp_rank": f.integer("dp_rank") or 0,
            "dp_rank_recorded": obj.get("dp_rank") is not None,
            **{k: f.timestamp(k) for k in TIMESTAMPS},
        }
        if row["dp_rank"] >= dp:
            raise f.fail("dp_rank", f"{row['dp_rank']} but data_parallel_size is {dp}")
        if row["first_token_ts"] is None or row["last_token_ts"] is None:
            failed.append(rid)
            continue
        if row["queued_ts"] is None and row["arrival_time"] is None:
            raise f.fail(
                "queued_ts", "missing: the request has tokens but no arrival or queue time"
            )
        prev = None
        for k in TIMESTAMPS:
            if row[k] is None:
                continue
            if prev is not None and row[k] < row[prev] - ORDER_SLACK_S:
                raise f.fail(k, f"{row[k]} is before {prev} {row[prev]}")
            prev = k
        rows.append(row)
    if not rows and not failed:
        raise ImportFileError(path, 1, None, "no requests")
    if not rows:  # as the sglang-bench importer: a run without a completed request has no metrics
        raise ImportFileError(
            path, 1, None, f"all {len(failed)} requests failed (no first or last token time)"
        )
    return rows, failed


def read_vllm_bench(
    directory: str | Path,
    *,
    run_id: str | None = None,
    model_config: str | Path | None = None,
) -> BenchRun:
    """Parse a bench directory into a BenchRun (ImportFileError names file, line, field)."""
    d = Path(directory)
    if not d.is_dir():
        raise ImportFileError(d, 0, None, "not a directory (expected meta.json and requests.jsonl)")
    meta_path = d / "meta.json"
    doc, text = load_json(meta_path)
    meta = Fields(doc, meta_path, None, text)
    with meta.naming_errors("engine_kwargs"):  # a ceiling of cluster.size_limits
        settings, is_moe = _engine(meta)
    shape = ModelShape.load(model_config) if model_config is not None else None
    if shape is None and is_moe:
        raise meta.fail(
            "resolved_config.parallel_config.is_moe_model", "the model is MoE: pass --model-config"
        )
    interconnect, gpu_gib, gpu_name = _cluster(d / "cluster_config.json")
    memory_source = "device" if settings.gpu_memory_bytes is not None else None
    if settings.gpu_memory_bytes is None and gpu_gib is not None:
        settings = settings.with_overrides(gpu_memory_bytes=int(gpu_gib * GIB))
        memory_source = "nominal (cluster_config.json)"
    if settings.hardware is None and gpu_name is not None:
        settings = settings.with_overrides(hardware=gpu_name)
    rows, failed = _requests(d / "requests.jsonl", settings.data_parallel_size)
    # One clock for the anchor of every request (module docstring).
    on_engine = all(
        r["arrival_time"] is not None
        and abs(r["arrival_time"] - r["first_token_ts"]) < SAME_CLOCK_S
        for r in rows
    )
    anchor = "arrival_time" if on_engine else "queued_ts"
    for r in rows:
        if r[anchor] is None:
            raise ImportFileError(
                d / "requests.jsonl", r["line"], anchor, "missing (the arrival anchor of this run)"
            )
    t0 = min((r[anchor] for r in rows), default=0.0)
    for r in rows:  # metrics of a run longer than the span ceiling mean nothing
        end = r["last_token_ts"] - t0
        if end > MAX_SPAN_S:
            raise ImportFileError(
                d / "requests.jsonl",
                r["line"],
                "last_token_ts",
                f"{end:g} s after the run's first arrival (allowed: at most {MAX_SPAN_S:g} s; "
                "a clock reading from another clock?)",
            )
    sends = [r["arrival_time"] for r in rows if r["arrival_time"] is not None]
    s0 = min(sends) if sends and not on_engine else None
    run = BenchRun(
        run_id=run_id or f"vllm-{d.name}",
        started_at=_started_at(meta, s0),
        source="vllm-bench",
        config={},
        node_names=[f"vllm-dp{i}" for i in range(settings.data_parallel_size)],
        hardware=settings.hardware or "unknown",
        moe_top_k=shape.top_k if shape and shape.is_moe else 0,
        moe_experts=shape.num_experts if shape and shape.is_moe else 0,
    )
    lags = []
    for r in sorted(rows, key=lambda r: (r[anchor], r["line"])):

        def rel(k: str, r: dict[str, Any] = r) -> float | None:
            return None if r[k] is None else max(r[k] - t0, 0.0)

        run.add_request(
            request_id=r["request_id"],
            program_id=r["request_id"],
            branch_id=r["request_id"],
            t_arrival=rel(anchor),
            prefill_node=r["dp_rank"],
            decode_node=r["dp_rank"],
            t_in=r["t_in"],
            t_c=0,
            t_fetch=0,
            t_out=r["t_out"],
            t_prefill_start=rel("scheduled_ts"),
            t_first_token=rel("first_token_ts"),
            t_done=rel("last_token_ts"),
            t_sent=None if s0 is None or r["arrival_time"] is None else r["arrival_time"] - s0,
        )
        if s0 is not None and r["arrival_time"] is not None and r["queued_ts"] is not None:
            lags.append((r["queued_ts"] - t0) - (r["arrival_time"] - s0))
    run.config = {
        "importer": "vllm-bench",
        "source_dir": str(d),
        "model": settings.model,
        "engine": settings.to_json(),
        "kv_tokens": None
        if settings.num_gpu_blocks is None
        else settings.num_gpu_blocks * settings.block_size,
        "model_shape": shape.to_json() if shape else None,
        "interconnect": interconnect,
        "gpu_memory_source": memory_source,
        "enforce_eager": _eager(meta),  # None: not recorded (the twin ranges CUDA graphs)
        "arrivals": "recorded",
        # without a dp_rank per request every request is stored on rank 0: not its rank
        "dp_ranks": "recorded" if any(r["dp_rank_recorded"] for r in rows) else "not recorded",
        "clock": {
            "anchor": anchor,
            "engine_t0_s": t0,
            "client_t0_epoch_s": s0,
            "queue_lag_mean_s": sum(lags) / len(lags) if lags else None,
            "queue_lag_max_s": max(lags) if lags else None,
        },
        "prefix_cached_tokens": "not recorded (t_c = 0)",
        "failed_request_ids": failed,
        "workload": {
            k: doc.get(k) for k in ("dataset_path", "dataset_hash", "num_requests") if k in doc
        },
        "finished_at": doc.get("finished_at"),
        "metrics": {
            "ttft": "t_first_token - t_arrival",
            "tpot": "(t_done - t_first_token) / (t_out - 1)",
            "e2e": "t_done - t_arrival",
        },
    }
    series, series_info = read_series(d / "timeseries.csv")
    if series is not None:
        run.extra["reference_series"] = series
        run.config["series"] = series_info
    peers = _peer_means(d / "llmservingsim_validation.txt")
    if peers is not None:
        run.extra["reference_latency"] = peers
    return run
