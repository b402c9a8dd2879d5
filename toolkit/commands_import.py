"""`pdlab import vllm-bench DIR` and `pdlab import sglang-bench FILE` (SPEC §9).

A recorded serving run goes into the documented tables (toolkit.importers) in one
transaction, with the engine settings in the run's config; the command then prints the
run's measured TTFT, TPOT and E2E (mean, P50, P90, P95, P99) and throughput, read back from
the database (toolkit.queries.serving). Malformed files are a clean error naming the file,
line and field (exit code 2), and the database is left as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolkit.formatting import json_text

EXIT_INPUT = 2

import_app = typer.Typer(
    help="Import serving runs recorded by other tools (vLLM, SGLang benchmarks).",
    no_args_is_help=True,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _write_and_report(db: Path, runs: list[Any], as_json: bool) -> None:
    from toolkit.importers import write_runs
    from toolkit.queries.serving import as_table, serving_metrics

    ids = write_runs(db, runs)
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
    directory: Path = typer.Argument(..., help="Bench run directory (meta.json, requests.jsonl)."),
    db: Path = typer.Option(..., "--db", help="DuckDB telemetry database (created if absent)."),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: vllm-<dir name>)."),
    model_config: Path | None = typer.Option(
        None, "--model-config", help="The model's HF config.json (MoE shape of the nodes)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Import a vLLM serving run recorded by LLMServingSim's bench (meta.json + requests.jsonl)."""
    from toolkit.importers import read_vllm_bench

    _guarded(
        lambda: _write_and_report(
            db, [read_vllm_bench(directory, run_id=run_id, model_config=model_config)], as_json
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
        )
    )
