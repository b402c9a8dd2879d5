"""`pdlab import sglang-bench FILE`: SGLang's `bench_serving --output-file` JSONL.

bench_serving appends one JSON object per benchmark invocation: the arguments (backend,
dataset_name, request_rate, max_concurrency, ...), totals (duration, completed, ...) and
summary statistics in milliseconds. Only with `--output-details` does it add per-request
arrays, which an import needs: `input_lens`, `output_lens`, `ttfts` (s, client side: from
sending the request to the first streamed chunk), `itls` (s, per request: the gaps between
streamed chunks), `errors`, and in some versions `latencies` (s) and `start_times`. It does
not record the engine's own timestamps, nor (in most versions) when each request was sent:
- with `start_times` the arrivals are recorded (seconds since the first send);
- with request_rate inf (all sent at once, possibly capped by max_concurrency) they are 0,
  the burst (config "arrivals": "burst");
- otherwise they are unknown: every t_arrival is 0 and the config says "arrivals":
  "unknown" (TTFT, TPOT and E2E per request stay right; a replay cannot use them).
E2E is `latencies[i]` when present, else TTFT + sum(itls[i]) (the streaming client's last
chunk). A request with an error or no first token is left out and counted. Every line of
the file with per-request arrays becomes one run (ids `<run-id>-<line>` when there are
several). Engine settings are not in the file: `--server-info` reads SGLang's
`/get_server_info` JSON (tp_size, dp_size, ep_size, max_running_requests,
chunked_prefill_size, page_size, max_total_num_tokens, mem_fraction_static, ...).
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster.hardware.engine import EngineSettings
from cluster.hardware.model_shape import ModelShape
from toolkit.importers.bench_run import BenchRun
from toolkit.importers.fields import (
    MAX_SPAN_S,
    MAX_TIMESTAMP_S,
    MAX_TOKENS,
    Fields,
    ImportFileError,
    json_lines,
    load_json,
)

PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls")


def server_settings(path: str | Path) -> EngineSettings:
    """EngineSettings from an SGLang /get_server_info (or /server_info) JSON file."""
    p = Path(path)
    doc, text = load_json(p)
    top = Fields(doc, p, None, text)
    states = top.array("internal_states") or []
    inner = (
        Fields(states[0], p, None, text, ("internal_states",))
        if states and isinstance(states[0], dict)
        else None
    )

    def get(kind: str, key: str, **kw: Any) -> Any:
        for f in (top, inner):
            if f is not None and f.has(key):
                return getattr(f, kind)(key, **kw)
        return None

    with top.naming_errors():  # a ceiling of cluster.size_limits
        return _server_settings(get, top)


def _server_settings(get: Any, top: Fields) -> EngineSettings:
    tp = get("integer", "tp_size", minimum=1) or 1
    dp = get("integer", "dp_size", minimum=1) or 1
    page = get("integer", "page_size", minimum=1) or 1
    tokens = get("integer", "max_total_num_tokens", minimum=1)
    frac = get("number", "mem_fraction_static")
    if frac is not None and not 0 < frac <= 1:
        raise top.fail("mem_fraction_static", f"must be in (0, 1], got {frac}")
    return EngineSettings(
        engine="sglang",
        model=get("string", "model_path"),
        max_num_seqs=get("integer", "max_running_requests", minimum=1),
        max_num_batched_tokens=get("integer", "chunked_prefill_size", minimum=1),
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        expert_parallel_size=get("integer", "ep_size", minimum=1) or 1,
        block_size=page,
        num_gpu_blocks=None if tokens is None else max(tokens // page, 1),
        gpu_memory_utilization=frac,
        enable_chunked_prefill=(get("integer", "chunked_prefill_size") or 0) > 0,
        mixed_prefill_decode=bool(get("boolean", "enable_mixed_chunk")),
        enable_prefix_caching=not bool(get("boolean", "disable_radix_cache")),
        max_model_len=get("integer", "context_length", minimum=1),
        kv_cache_dtype=get("string", "kv_cache_dtype") or "auto",
        cuda_graph_max_batch=None
        if get("boolean", "disable_cuda_graph")
        else get("integer", "cuda_graph_max_bs", minimum=0),
        engine_version=get("string", "version"),
    )


def _arrays(f: Fields) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key in PER_REQUEST:
        v = f.array(key)
        if v is None:
            raise f.fail(
                key,
                "missing: the file has no per-request arrays (run bench_serving with --output-details)",
            )
        out[key] = v
    for key in ("latencies", "start_times", "errors"):
        v = f.array(key)
        if v is not None:
            out[key] = v
    n = len(out["input_lens"])
    for key, v in out.items():
        if len(v) != n:
            raise f.fail(key, f"has {len(v)} entries but input_lens has {n}")
    return out


def _num(
    f: Fields, key: str, i: int, v: Any, *, integer: bool = False, maximum: float = MAX_SPAN_S
) -> float:
    """Entry i of a per-request array: a finite number (an integer) in [0, maximum]."""
    ok = not isinstance(v, bool) and isinstance(v, int | float)
    if ok and integer:
        ok = isinstance(v, int) or (math.isfinite(v) and v.is_integer())
    try:
        ok = ok and math.isfinite(float(v)) and v >= 0
    except OverflowError:  # an integer beyond a float's range
        ok = False
    shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
    if not ok:
        kind = "an integer >= 0" if integer else "a finite number >= 0"
        raise f.fail(f"{key}[{i}]", f"expected {kind}, got {shown}")
    if v > maximum:
        raise f.fail(f"{key}[{i}]", f"must be at most {maximum:g}, got {shown}")
    return float(v)


def _run(
    f: Fields,
    line: int,
    run_id: str,
    started: datetime,
    settings: EngineSettings | None,
    shape: ModelShape | None,
    source: Path,
) -> BenchRun:
    a = _arrays(f)
    rate = f.obj.get("request_rate")
    # json.dumps writes float("inf") as Infinity, which json.loads reads back as inf.
    burst = (isinstance(rate, str) and rate.lower() in ("inf", "infinity")) or (
        isinstance(rate, float) and math.isinf(rate)
    )
    arrivals = "recorded" if "start_times" in a else "burst" if burst else "unknown"
    starts = (
        [
            _num(f, "start_times", i, v, maximum=MAX_TIMESTAMP_S)
            for i, v in enumerate(a["start_times"])
        ]
        if "start_times" in a
        else []
    )
    s0 = min(starts) if starts else 0.0
    dp = settings.data_parallel_size if settings else 1
    run = BenchRun(
        run_id=run_id,
        started_at=started,
        source="sglang-bench",
        config={},
        node_names=[f"sglang-dp{i}" for i in range(dp)],
        hardware="unknown",
        moe_top_k=shape.top_k if shape and shape.is_moe else 0,
        moe_experts=shape.num_experts if shape and shape.is_moe else 0,
    )
    failed = 0
    errors = a.get("errors")
    for i in range(len(a["input_lens"])):
        t_in = _num(f, "input_lens", i, a["input_lens"][i], integer=True, maximum=MAX_TOKENS)
        t_out = _num(f, "output_lens", i, a["output_lens"][i], integer=True, maximum=MAX_TOKENS)
        err = errors[i] if errors is not None else ""
        ttft = a["ttfts"][i]
        if err or not ttft:
            failed += 1
            continue
        ttft = _num(f, "ttfts", i, ttft)
        itls = a["itls"][i]
        if not isinstance(itls, list):
            raise f.fail(f"itls[{i}]", f"expected an array, got {itls!r}")
        gaps = [_num(f, f"itls[{i}]", j, g) for j, g in enumerate(itls)]
        e2e = _num(f, "latencies", i, a["latencies"][i]) if "latencies" in a else ttft + sum(gaps)
        if e2e < ttft - 1e-9:
            raise f.fail(f"latencies[{i}]", f"{e2e} is shorter than its TTFT {ttft}")
        if t_out < 1:  # a completed request generated a token; 0 would be stored as 1
            raise f.fail(f"output_lens[{i}]", "0 for a request with a first token")
        t0 = starts[i] - s0 if starts else 0.0
        if t0 + e2e > MAX_SPAN_S:
            raise f.fail(
                f"latencies[{i}]",
                f"the request ends {t0 + e2e:g} s after the first send (allowed: at most "
                f"{MAX_SPAN_S:g} s)",
            )
        rid = f"{run_id}-{i}"
        run.add_request(
            request_id=rid,
            program_id=rid,
            branch_id=rid,
            t_arrival=t0,
            prefill_node=0,
            decode_node=0,
            t_in=int(t_in),
            t_c=0,
            t_fetch=0,
            t_out=int(t_out),
            t_first_token=t0 + ttft,
            t_done=t0 + max(e2e, ttft),
            t_sent=t0 if starts else None,
        )
    if run.num_requests == 0:
        raise f.fail("errors", f"all {failed} requests failed")
    run.config = {
        "importer": "sglang-bench",
        "source_file": str(source),
        "line": line,
        "engine": None if settings is None else settings.to_json(),
        "model_shape": shape.to_json() if shape else None,
        "arrivals": arrivals,
        "clock": {
            "anchor": "client send (perf_counter)",
            "ttft": "client side, includes the network and tokenization",
        },
        "failed_requests": failed,
        "benchmark": {
            k: f.obj.get(k)
            for k in (
                "backend",
                "dataset_name",
                "request_rate",
                "max_concurrency",
                "duration",
                "completed",
            )
            if k in f.obj
        },
        "metrics": {
            "ttft": "t_first_token - t_arrival",
            "tpot": "(t_done - t_first_token) / (t_out - 1)",
            "e2e": "t_done - t_arrival",
        },
    }
    return run


def read_sglang_bench(
    path: str | Path,
    *,
    run_id: str | None = None,
    server_info: str | Path | None = None,
    model_config: str | Path | None = None,
) -> list[BenchRun]:
    """One BenchRun per line with per-request arrays (ImportFileError names file, line, field)."""
    p = Path(path)
    settings = server_settings(server_info) if server_info is not None else None
    shape = ModelShape.load(model_config) if model_config is not None else None
    objs = [(i, Fields(obj, p, i)) for i, obj in json_lines(p)]
    if not objs:
        raise ImportFileError(p, 1, None, "no benchmark results")
    detailed = [(i, f) for i, f in objs if f.has("input_lens")]
    if not detailed:
        raise objs[0][1].fail(
            "input_lens", "missing on every line: run bench_serving with --output-details"
        )
    base = run_id or f"sglang-{p.stem}"
    mtime = datetime.fromtimestamp(os.path.getmtime(p), UTC).replace(tzinfo=None)
    runs = []
    for i, f in detailed:
        rid = base if len(detailed) == 1 else f"{base}-{i}"
        duration = f.seconds("duration") or 0.0
        started = datetime.fromtimestamp(
            mtime.replace(tzinfo=UTC).timestamp() - duration, UTC
        ).replace(tzinfo=None)
        runs.append(_run(f, i, rid, started, settings, shape, p))
    return runs
