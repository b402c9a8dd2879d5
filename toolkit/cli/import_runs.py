"""`pdlab import vllm-bench PATH`, `lss-bench DIR`, `sglang-bench FILE` and `lss-run` (SPEC §9).

`vllm-bench` reads vLLM's own result file (`vllm bench serve --save-result`, with or
without --save-detailed; toolkit.importers.vllm_result); given a directory it imports every
run it finds there (vLLM result files, LLMServingSim run directories) and lists them. An
LLMServingSim run directory given directly still imports, with a line saying its name is
now `lss-bench` (toolkit.importers.vllm_bench).

A recorded serving run goes into the documented tables (toolkit.importers) in one
transaction, with the engine settings in the run's config; the command then prints the
run's measured TTFT, TPOT and E2E (mean, P50, P90, P95, P99) and throughput, read back from
the database (toolkit.queries.serving). Malformed files are a clean error naming the file,
line and field (exit code 2), and the database is left as it was. A run id the database
already has is refused unless `--replace` (its old rows, in every table, are deleted in the
same transaction as the new ones are written). `lss-run` imports a real run of a serving
cluster described as LLMServingSim's artifact does (toolkit.importers.lss_run) and prints
its instances, the engine settings assumed and the references stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolkit.cli.formatting import json_text
from toolkit.cli.style import HELP_STYLE

EXIT_INPUT = 2

import_app = typer.Typer(
    help="Import serving runs recorded by other tools (vLLM, SGLang benchmarks).",
    no_args_is_help=True,
    **HELP_STYLE,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _write_and_report(db: Path, runs: list[Any], as_json: bool, replace: bool = False) -> None:
    from toolkit.importers import write_runs
    from toolkit.queries.serving import as_table, serving_metrics

    ids = write_runs(db, runs, replace=replace)
    results = []
    for run, rid in zip(runs, ids, strict=True):
        m = serving_metrics(db, rid)
        results.append((run, m))
    if as_json:
        out = {
            "db": str(db),
            "runs": [
                {
                    "run_id": m.run_id,
                    "requests": m.requests,
                    "arrivals": run.config.get("arrivals"),
                    "engine": run.config.get("engine"),
                    "metrics": m.flat(),
                }
                for run, m in results
            ],
        }
        typer.echo(json_text(out))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for run, m in results:
        if run.num_requests == 0:
            _print_summary(console, run)
            continue
        table = Table(
            title=f"run {m.run_id}: {m.requests} requests ({run.config.get('arrivals')} arrivals)",
            caption="milliseconds, measured (from the imported database)",
        )
        for col in ("metric", "mean", "P50", "P90", "P95", "P99"):
            table.add_column(col, justify="right" if col != "metric" else "left")
        for name, *vals in as_table(m):
            table.add_row(name, *("-" if v is None else f"{v:.1f}" for v in vals))
        console.print(table)
        if m.throughput_rps is not None:
            console.print(
                f"throughput {m.throughput_rps:.3f} requests/s, {m.output_tokens_per_s:.1f} output tokens/s"
            )
        engine = run.config.get("engine") or {}
        shown = {k: v for k, v in engine.items() if v is not None and k != "engine"}
        if shown:
            console.print("engine: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    console.print(f"imported into {db}")


def _print_summary(console: Any, run: Any) -> None:
    """A run without per-request records: vLLM's own summary, as it wrote it."""
    s = run.config.get("summary") or {}
    parts = [f"{k} {s[k]:.1f} ms" for k in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")
             if isinstance(s.get(k), int | float)]  # fmt: skip
    console.print(
        f"run {run.run_id}: no per-request records ({run.config.get('per_request')}); vLLM's "
        f"summary: {', '.join(parts) or 'none'}; `pdlab twin` needs per-request records"
    )


def _guarded(fn: Any) -> None:
    from cluster.core import ConfigError
    from telemetry import TelemetryError
    from toolkit.importers import ImportFileError

    try:
        fn()
    except (ImportFileError, ConfigError, TelemetryError) as exc:
        _fail(str(exc))


@import_app.command("vllm-bench")
def vllm_bench_command(
    path: Path = typer.Argument(
        ..., help="vLLM result JSON (`vllm bench serve --save-result`), or a directory of runs."
    ),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry database (created if absent)."),
    run_id: str | None = typer.Option(
        None, "--run-id", help="Run id (default: vllm-<file stem>; a prefix for several runs)."
    ),
    engine_args: Path | None = typer.Option(
        None, "--engine-args", help="JSON of the server's vLLM arguments (max_num_seqs, ...)."
    ),
    model_config: Path | None = typer.Option(
        None, "--model-config", help="The model's HF config.json (MoE shape of the nodes)."
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a run of the same id (its rows in every table)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import vLLM benchmark results (`vllm bench serve --save-result [--save-detailed]`)."""
    from toolkit.importers import ImportFileError, find_runs, read_vllm_bench, read_vllm_result

    def run() -> None:
        found, skipped = find_runs(path)
        if not found:
            raise ImportFileError(path, 0, None, "no vLLM result or bench run directory here")
        several = len(found) > 1 or (path.is_dir() and found[0].path != path)
        if several and not as_json:
            typer.echo(f"found {len(found)} run(s) under {path}:", err=True)
            for f in found:
                typer.echo(f"  {f.kind:12s} {f.path}", err=True)
            for f, why in skipped:
                typer.echo(f"  skipped      {f}: {why}", err=True)
        runs: list[Any] = []
        for f in found:
            rid = None if run_id is None else (f"{run_id}-{f.path.stem}" if several else run_id)
            if f.kind == "lss-bench":
                if not several:
                    typer.echo(
                        f"note: {path} is LLMServingSim's bench layout; `pdlab import "
                        "vllm-bench DIR` reads it for now, its name is `pdlab import lss-bench "
                        "DIR` (vllm-bench is for vLLM's own result files)",
                        err=True,
                    )
                runs.append(read_vllm_bench(f.path, run_id=rid, model_config=model_config))
            else:
                runs += read_vllm_result(
                    f.path, run_id=rid, engine_args=engine_args, model_config=model_config
                )
        _write_and_report(db, runs, as_json, replace)

    _guarded(run)


@import_app.command("lss-bench")
def lss_bench_command(
    directory: Path = typer.Argument(..., help="Bench run directory (meta.json, requests.jsonl)."),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry database (created if absent)."),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: vllm-<dir name>)."),
    model_config: Path | None = typer.Option(
        None, "--model-config", help="The model's HF config.json (MoE shape of the nodes)."
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a run of the same id (its rows in every table)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import a vLLM serving run recorded by LLMServingSim's bench (meta.json + requests.jsonl)."""
    from toolkit.importers import read_vllm_bench

    _guarded(
        lambda: _write_and_report(
            db,
            [read_vllm_bench(directory, run_id=run_id, model_config=model_config)],
            as_json,
            replace,
        )
    )


@import_app.command("sglang-bench")
def sglang_bench_command(
    file: Path = typer.Argument(
        ..., help="bench_serving --output-file JSONL (with --output-details)."
    ),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry database (created if absent)."),
    run_id: str | None = typer.Option(
        None, "--run-id", help="Run id (default: sglang-<file stem>)."
    ),
    server_info: Path | None = typer.Option(
        None, "--server-info", help="SGLang /get_server_info JSON: the engine settings."
    ),
    model_config: Path | None = typer.Option(
        None, "--model-config", help="The model's HF config.json (MoE shape of the nodes)."
    ),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a run of the same id (its rows in every table)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import SGLang bench_serving results (one run per line with per-request details)."""
    from toolkit.importers import read_sglang_bench

    _guarded(
        lambda: _write_and_report(
            db,
            read_sglang_bench(
                file, run_id=run_id, server_info=server_info, model_config=model_config
            ),
            as_json,
            replace,
        )
    )


@import_app.command("lss-run")
def lss_run_command(
    config: Path = typer.Option(..., "--config", help="LLMServingSim cluster config JSON."),
    dataset: Path = typer.Option(..., "--dataset", help="Request file (JSONL, with token ids)."),
    profiles: Path = typer.Option(
        ...,
        "--profiles",
        help="Profiles folder: <GPU>/<org>/<model>/tp<N>/ or <org>/<model>/tp<N>/.",
    ),
    models: Path = typer.Option(..., "--models", help="HF configs folder: <org>/<model>.json."),
    name: str = typer.Option(..., "--name", help="Run id to store it under."),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry database (created if absent)."),
    prefix_caching: bool = typer.Option(False, "--prefix-caching", help="GPU prefix caching on."),
    prefix_storage: str | None = typer.Option(
        None, "--prefix-storage", help="Second prefix tier: cpu (the node's CPU memory)."
    ),
    prefix_sharing: bool = typer.Option(
        False, "--prefix-sharing", help="The instances share one CPU prefix pool."
    ),
    reference_throughput: Path | None = typer.Option(
        None, "--reference-throughput", help="Real generation throughput per tick (TSV)."
    ),
    reference_latency: Path | None = typer.Option(
        None,
        "--reference-latency",
        help="Mean latency table: framework, throughput_tok_s, "
        "mean_ttft_ms, mean_tpot_ms (TSV; the vLLM row is the real run).",
    ),
    reference_prefix: list[Path] = typer.Option(
        [],
        "--reference-prefix",
        help="Per-tick gpu_mem_mb and prefix_hit_pct of one instance "
        "(repeat, config order), or a shared pool's shared_cpu_* file (TSV).",
    ),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="Engine batch limit (default: vLLM's server default)."
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None, "--max-num-batched-tokens", help="Tokens per iteration (default: vLLM's)."
    ),
    gpu_memory_gib: float | None = typer.Option(
        None, "--gpu-memory-gib", help="GPU memory per GPU (default: the config's npu_mem)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a run of the same name (its old rows deleted)."
    ),
) -> None:
    """Import a real serving-cluster run described as LLMServingSim does (config, requests,
    profiles, the measured series and the peers' figures)."""

    def run() -> None:
        from toolkit.importers import write_runs
        from toolkit.importers.lss_run import read_lss_run

        bench = read_lss_run(
            config, dataset, profiles, models, name,
            prefix_caching=prefix_caching, prefix_storage=prefix_storage,
            prefix_sharing=prefix_sharing, reference_throughput=reference_throughput,
            reference_latency=reference_latency, reference_prefix=list(reference_prefix),
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_gib=gpu_memory_gib,
        )  # fmt: skip
        write_runs(db, [bench], replace=replace)
        _report_lss(db, bench, as_json)

    _guarded(run)


def _report_lss(db: Path, bench: Any, as_json: bool) -> None:
    cfg = bench.config
    refs = bench.extra.get("reference_series", {})
    kinds = sorted(
        {f"{s}:{m}" for s, m in zip(refs.get("source", []), refs.get("metric", []), strict=True)}
    )
    lat = bench.extra.get("reference_latency", {}).get("framework", [])
    info = {
        "db": str(db),
        "run_id": bench.run_id,
        "requests": bench.num_requests,
        "instances": [
            {k: i[k] for k in ("model", "hardware", "tp", "role", "kv_blocks")}
            | {k: i["engine"][k] for k in ("max_num_seqs", "max_num_batched_tokens")}
            for i in cfg["instances"]
        ],
        "prefix_caching": cfg["prefix_caching"],
        "prefix_pool": cfg["prefix_pool"],
        "frontend": cfg["frontend"]["rule"],
        "reference_series": kinds,
        "reference_latency": lat,
        "assumptions": cfg["assumptions"],
    }
    if as_json:
        typer.echo(json_text(info))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"run {bench.run_id}: {bench.num_requests} requests into {db}")
    for col in ("instance", "model", "GPU", "TP", "role", "KV blocks", "max seqs", "tokens/iter"):
        t.add_column(col)
    for n, i in enumerate(info["instances"]):
        t.add_row(str(n), i["model"], i["hardware"], str(i["tp"]), i["role"], str(i["kv_blocks"]),
                  str(i["max_num_seqs"]), str(i["max_num_batched_tokens"]))  # fmt: skip
    console = Console()
    console.print(t)
    console.print(
        f"prefix caching {'on' if info['prefix_caching'] else 'off'}, pool {info['prefix_pool']}, "
        f"front end {info['frontend']}; references: {', '.join(kinds) or 'none'}"
        + (f"; latency rows: {', '.join(lat)}" if lat else "")
    )
    for a in info["assumptions"]:
        console.print(f"[dim]assumed: {a}[/dim]")
