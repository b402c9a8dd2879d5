"""`pdlab import vllm-bench RESULT.json`: the result file of `vllm bench serve --save-result`.

vLLM's benchmark client (`vllm/benchmarks/serve.py`) writes one JSON object (several, one
per line, with --append-result): the settings (`date` "%Y%m%d-%H%M%S", client local time;
`backend`, `endpoint_type`, `label`, `model_id`, `tokenizer_id`, `num_prompts`,
`request_rate` (a number or "inf"), `burstiness`, `max_concurrency`, and every
`--metadata KEY=VALUE` as a top-level string), totals (`duration`, `completed`, `failed`,
`total_input_tokens`, `total_output_tokens`, throughputs, `max_concurrent_requests`) and
summary statistics (`mean_/median_/std_/p99_{ttft,tpot,itl,e2el}_ms`). Only with
--save-detailed does it keep the per-request arrays: `input_lens`, `output_lens`, `ttfts`
(s, client side: from sending the request to the first streamed chunk), `itls` (s, per
request: the gaps between streamed chunks), `errors`, `generated_texts`, and since 2025
`start_times` (the client's perf_counter when it sent each request).

- With --save-detailed, every request that did not fail becomes a `requests` row:
  TTFT = ttfts[i], E2E = ttfts[i] + sum(itls[i]) (the last streamed chunk), on the client's
  clock. Arrivals: `start_times` present -> recorded (seconds since the first send);
  request_rate "inf" -> all sent at once (config "arrivals": "burst"; with max_concurrency
  the client waited for completions, which the twin cannot replay); otherwise unknown
  ("arrivals": "unknown": TTFT, TPOT and E2E per request stay right, a replay cannot
  use them).
- Without it, the run holds no requests: the summary statistics go to the run's config
  ("summary", milliseconds as vLLM wrote them); `pdlab twin` needs per-request records and
  says so.

vLLM's result carries no engine settings. They come from `--engine-args FILE` (a JSON object
of `vllm serve` arguments in their Python names: tensor_parallel_size, max_num_seqs,
max_num_batched_tokens, num_gpu_blocks, block_size, gpu_memory_utilization, ...) and from
`--metadata` entries of the same names in the result; which one said what is in the config
("engine_sources"); the rest stay unset (the twin then uses vLLM's defaults or flags).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster.core import ConfigError
from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.model_shape import ModelShape
from toolkit.importers.bench_run import BenchRun
from toolkit.importers.fields import Fields, ImportFileError, load_json

PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls")
SUMMARY = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
           "request_throughput", "output_throughput", "total_token_throughput",
           "max_concurrent_requests")  # fmt: skip
# EngineSettings field <- vLLM argument names (the first found wins).
ENGINE_ARGS: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": ("tensor_parallel_size", "tp"),
    "data_parallel_size": ("data_parallel_size", "dp"),
    "max_num_seqs": ("max_num_seqs",),
    "max_num_batched_tokens": ("max_num_batched_tokens",),
    "block_size": ("block_size",),
    "num_gpu_blocks": ("num_gpu_blocks", "num_gpu_blocks_override"),
    "gpu_memory_utilization": ("gpu_memory_utilization",),
    "max_model_len": ("max_model_len",),
    "enable_prefix_caching": ("enable_prefix_caching",),
    "enable_chunked_prefill": ("enable_chunked_prefill",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "hardware": ("hardware", "gpu"),
}
BOOLS = ("enable_prefix_caching", "enable_chunked_prefill")
FLOATS = ("gpu_memory_utilization",)
STRINGS = ("kv_cache_dtype", "hardware")


def is_vllm_result(doc: Any) -> bool:
    """A JSON object written by `vllm bench serve --save-result` (module docstring)."""
    return (
        isinstance(doc, dict)
        and "model_id" in doc
        and "date" in doc
        and ("completed" in doc or "duration" in doc)
    )


def _documents(path: Path) -> list[tuple[int, Any, str]]:
    """(line, object, text) of each result in the file: one JSON object, or one per line."""
    try:
        doc, text = load_json(path)
        return [(1, doc, text)]
    except ImportFileError as first:
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            raise first from None
        out = []
        for i, raw in enumerate(lines, 1):
            if raw.strip():
                try:
                    out.append((i, json.loads(raw), raw))
                except json.JSONDecodeError as exc:
                    raise ImportFileError(path, i, None, f"not valid JSON ({exc.msg})") from None
        if not out:
            raise first from None
        return out


def _engine_value(name: str, raw: Any, where: str) -> Any:
    v = raw.strip() if isinstance(raw, str) else raw
    try:
        if name in BOOLS:
            if isinstance(v, str):
                if v.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return v.lower() in ("true", "1")
            return bool(v)
        if name in FLOATS:
            return float(v)
        if name in STRINGS:
            return str(v)
        f = float(v)
        if not f.is_integer():
            raise ValueError
        return int(f)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} = {raw!r} is not a valid value") from None


def engine_settings(
    doc: dict[str, Any], engine_args: dict[str, Any] | None, where: str, args_where: str
) -> tuple[EngineSettings, dict[str, str]]:
    """Settings from --engine-args (first) and the result's --metadata; their sources."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, kv, at in (
        ("engine-args", engine_args or {}, args_where),
        ("metadata", doc, where),
    ):
        for field, names in ENGINE_ARGS.items():
            if field in values:
                continue
            key = next((n for n in names if kv.get(n) is not None), None)
            if key is not None:
                values[field] = _engine_value(field, kv[key], at)
                sources[field] = f"{source} {key}"
    ep = engine_args.get("enable_expert_parallel") if engine_args else None
    tp, dp = values.get("tensor_parallel_size", 1), values.get("data_parallel_size", 1)
    settings = EngineSettings(
        engine="vllm", model=str(doc.get("model_id") or "") or None,
        expert_parallel_size=tp * dp if ep else 1, **values,
    )  # fmt: skip
    return settings, sources


def _num(f: Fields, key: str, i: int, v: Any, *, integer: bool = False) -> float:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v >= 0
    if not ok or (integer and not float(v).is_integer()):
        kind = "an integer >= 0" if integer else "a finite number >= 0"
        raise f.fail(f"{key}[{i}]", f"expected {kind}, got {v!r}")
    return float(v)


def _started(f: Fields) -> datetime:
    text = f.string("date", required=True)
    try:
        return datetime.strptime(str(text), "%Y%m%d-%H%M%S")
    except ValueError:
        raise f.fail("date", f"expected vLLM's %Y%m%d-%H%M%S, got {text!r}") from None


def _requests(f: Fields, run: BenchRun) -> tuple[str, int]:
    """Add the per-request rows; (arrivals, failed requests)."""
    arrays: dict[str, list[Any]] = {}
    for key in (*PER_REQUEST, "start_times", "errors"):
        v = f.array(key)
        if v is not None:
            arrays[key] = v
    n = len(arrays["input_lens"])
    for key, v in arrays.items():
        if len(v) != n:
            raise f.fail(key, f"has {len(v)} entries but input_lens has {n}")
    rate = f.obj.get("request_rate")
    burst = (isinstance(rate, str) and rate.lower() in ("inf", "infinity")) or (
        isinstance(rate, float) and math.isinf(rate)
    )
    starts = [_num(f, "start_times", i, v) for i, v in enumerate(arrays.get("start_times", []))]
    arrivals = "recorded" if starts else "burst" if burst else "unknown"
    s0 = min(starts) if starts else 0.0
    failed = 0
    for i in range(n):
        err = arrays.get("errors", [""] * n)[i]
        ttft = arrays["ttfts"][i]
        if err or not ttft:
            failed += 1
            continue
        t_in = _num(f, "input_lens", i, arrays["input_lens"][i], integer=True)
        t_out = _num(f, "output_lens", i, arrays["output_lens"][i], integer=True)
        ttft = _num(f, "ttfts", i, ttft)
        gaps = arrays["itls"][i]
        if not isinstance(gaps, list):
            raise f.fail(f"itls[{i}]", f"expected an array, got {gaps!r}")
        e2e = ttft + sum(_num(f, f"itls[{i}]", j, g) for j, g in enumerate(gaps))
        t0 = starts[i] - s0 if starts else 0.0
        rid = f"{run.run_id}-{i}"
        run.add_request(
            request_id=rid, program_id=rid, branch_id=rid, t_arrival=t0, prefill_node=0,
            decode_node=0, t_in=int(t_in), t_c=0, t_fetch=0, t_out=max(int(t_out), 1),
            t_first_token=t0 + ttft, t_done=t0 + e2e, t_sent=t0 if starts else None,
        )  # fmt: skip
    if run.num_requests == 0:
        raise f.fail("errors", f"all {failed} requests failed")
    return arrivals, failed


def read_vllm_result(
    path: str | Path,
    *,
    run_id: str | None = None,
    engine_args: str | Path | None = None,
    model_config: str | Path | None = None,
) -> list[BenchRun]:
    """One BenchRun per result in the file (ImportFileError names file, line, field)."""
    p = Path(path)
    args: dict[str, Any] | None = None
    if engine_args is not None:
        doc, _ = load_json(Path(engine_args))
        if not isinstance(doc, dict):
            raise ImportFileError(engine_args, 1, None, "expected a JSON object of vLLM arguments")
        args = doc
    shape = ModelShape.load(model_config) if model_config is not None else None
    docs = _documents(p)
    runs = []
    for line, doc, text in docs:
        f = Fields(doc, p, line if len(docs) > 1 else None, text)
        if not is_vllm_result(doc):
            raise ImportFileError(
                p, line, None,
                "not a `vllm bench serve --save-result` file (no model_id, date and totals)",
            )  # fmt: skip
        settings, sources = engine_settings(doc, args, f"{p}: line {line}", str(engine_args))
        rid = run_id or f"vllm-{p.stem}"
        rid = rid if len(docs) == 1 else f"{rid}-{line}"
        run = BenchRun(
            run_id=rid, started_at=_started(f), source="vllm-bench-serve", config={},
            node_names=[f"vllm-dp{i}" for i in range(settings.data_parallel_size)],
            hardware=settings.hardware or "unknown",
            moe_top_k=shape.top_k if shape and shape.is_moe else 0,
            moe_experts=shape.num_experts if shape and shape.is_moe else 0,
        )  # fmt: skip
        detailed = f.has("input_lens")
        arrivals, failed = _requests(f, run) if detailed else ("unknown", 0)
        summary = {k: v for k, v in doc.items() if k in SUMMARY or k.endswith("_ms")}
        run.config = {
            "importer": "vllm-bench-serve",
            "source_file": str(p),
            "line": line,
            "model": settings.model,
            "engine": settings.to_json(),
            "engine_sources": sources,
            "model_shape": shape.to_json() if shape else None,
            "arrivals": arrivals,
            "per_request": "recorded" if detailed else "not saved (run with --save-detailed)",
            "dp_ranks": "not recorded",
            "clock": {
                "anchor": "client send (perf_counter)",
                "ttft": "client side, includes the network and tokenization",
            },
            "failed_requests": failed,
            "benchmark": {
                k: doc.get(k)
                for k in (
                    "backend",
                    "endpoint_type",
                    "label",
                    "tokenizer_id",
                    "num_prompts",
                    "request_rate",
                    "burstiness",
                    "max_concurrency",
                    "date",
                )
                if k in doc
            },
            "summary": summary,
            "metrics": {
                "ttft": "t_first_token - t_arrival",
                "tpot": "(t_done - t_first_token) / (t_out - 1)",
                "e2e": "t_done - t_arrival",
            },
        }
        runs.append(run)
    return runs
