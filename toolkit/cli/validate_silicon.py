"""`pdlab validate silicon [CSV]`: the twin and AIConfigurator on real deployments (SPEC §10).

Parse, call `toolkit.validate.silicon`, print (`toolkit.cli.validate` dispatches here
when its first argument is `silicon`; CSV default: the installed aiconfigurator-core's
`silicon_sample.csv`). `--json` prints `{"all", "partitions", "unsupported", "rows_total",
...}` (MAPE as fractions); otherwise a table per partition. `--db` stores the run,
`--figure` writes the predicted-vs-measured figure (HTML).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

EXIT_INPUT = 2


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _plain(doc: Any) -> Any:
    """JSON-safe: numpy scalars to floats, NaN to null."""
    if isinstance(doc, dict):
        return {k: _plain(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_plain(v) for v in doc]
    if hasattr(doc, "item"):
        doc = doc.item()
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _print(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    aic = summary["aiconfigurator_installed"]
    table = Table(
        title="pdlab twin vs AIConfigurator on real deployments (MAPE over rows both predicted)",
        caption="rows: compared; pdlab: rows replayed",
    )
    width = max([len("partition"), *(len(p["partition"]) for p in summary["partitions"])])
    table.add_column("partition", no_wrap=True, min_width=width)
    for col in ("rows", "pdlab", "pdlab TTFT", "pdlab TPOT", "AIC TTFT", "AIC TPOT"):
        table.add_column(col, justify="right")

    def add(name: str, s: dict[str, Any], bold: bool = False) -> None:
        a = s["aiconfigurator"] or {}
        cells = [name, str(s["rows"]), str(s["rows_pdlab"]), _pct(s["pdlab"]["ttft_mape"]),
                 _pct(s["pdlab"]["tpot_mape"]), _pct(a.get("ttft_mape")), _pct(a.get("tpot_mape"))]  # fmt: skip
        table.add_row(*cells, style="bold" if bold else None)

    for p in summary["partitions"]:
        add(p["partition"], p)
    add("all", summary["all"], bold=True)
    console = Console()
    console.print(table)
    cov = summary["coverage"]
    console.print(
        f"replayed {cov['rows']} of {summary['rows_total']} rows ({100 * cov['share']:.1f}%); "
        f"disaggregated {cov['disagg_rows']} of {cov['disagg_total']} "
        f"({100 * cov['disagg_share']:.1f}%); {summary.get('runtime_s', 0):.0f} s"
    )
    for reason, n in summary["unsupported"].items():
        console.print(f"[dim]unsupported ({n}): {escape(reason)}[/dim]")
    if not aic:
        hint = escape("AIConfigurator's estimator not installed (pip install 'pdlab[aic]')")
        console.print(f"[dim]{hint}[/dim]")


def run_silicon(
    csv_path: Path | None,
    *,
    aic_systems: Path | None,
    model_configs: list[Path],
    use_aic: bool,
    db: Path | None,
    figure: Path | None,
    as_json: bool,
    cpu_overhead: float = 0.0,
) -> None:
    """`pdlab validate silicon [CSV]` (the options are `validate_command`'s)."""
    from cluster.core import ConfigError

    if figure is not None and db is None:
        _fail("--figure reads the stored run: pass --db too")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from toolkit.validate.silicon import store, validate_silicon

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), transient=True, disable=as_json,
    ) as bar:  # fmt: skip
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage:15s}", total=total)
            bar.update(tasks[stage], completed=done)

        try:
            results, summary = validate_silicon(
                csv_path, systems_dir=aic_systems, model_dirs=model_configs, use_aic=use_aic,
                progress=progress, cpu_overhead=cpu_overhead,
            )  # fmt: skip
        except ConfigError as exc:
            _fail(str(exc))
            return
    summary = _plain(summary)
    if db is not None:
        summary["run_id"] = store(db, results, summary, str(csv_path or "silicon_sample.csv"))
        if figure is not None:
            from toolkit.plots.silicon import silicon_scatter

            figure.parent.mkdir(parents=True, exist_ok=True)
            silicon_scatter(db, summary["run_id"]).write_html(figure, include_plotlyjs="cdn")
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print(summary)
