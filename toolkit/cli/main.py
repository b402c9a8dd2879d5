"""The `pdlab` command line (SPEC §7): typer commands over the library, rich output."""

from __future__ import annotations

import typer

from toolkit.cli.advise import advise_command
from toolkit.cli.attach import attach_command
from toolkit.cli.bench import bench_command
from toolkit.cli.collect import collect_app
from toolkit.cli.dashboards import dashboards_app
from toolkit.cli.data import data_app
from toolkit.cli.engine import engine_command
from toolkit.cli.export import export_command
from toolkit.cli.fit import fit_command, synth_logs_command
from toolkit.cli.import_runs import import_app
from toolkit.cli.lab import lab_command
from toolkit.cli.profile import profile_app
from toolkit.cli.recover import recover_command
from toolkit.cli.report import report_command
from toolkit.cli.runs import runs_app
from toolkit.cli.serve import serve_command
from toolkit.cli.simulate import experiment_command, simulate_command
from toolkit.cli.style import HELP_STYLE
from toolkit.cli.sweep import sweep_command
from toolkit.cli.twin import twin_command
from toolkit.cli.validate import validate_command

app = typer.Typer(
    name="pdlab",
    help="Analytics, modeling and control for agent-adaptive PD-disaggregated LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    **HELP_STYLE,
)


@app.callback()
def _main(
    allow_special_files: bool = typer.Option(
        False,
        "--allow-special-files",
        help="Read input files that are not regular files (FIFOs, devices, e.g. "
        "<(zcat run.jsonl.gz)); still capped by --max-input-mb.",
    ),
    max_input_mb: float | None = typer.Option(
        None,
        "--max-input-mb",
        help="Largest data file read (request logs, benchmark results, traces, profile "
        "CSVs), MiB (default 512). See docs/limits.md.",
    ),
) -> None:
    """pdlab: simulate, fit, analyze and control PD-disaggregated serving of agents."""
    import os

    from cluster.input_files import ALLOW_SPECIAL_ENV, MAX_INPUT_MB_ENV, data_cap_bytes

    # Environment variables, so worker processes (sweeps, partitions) read files alike.
    if allow_special_files:
        os.environ[ALLOW_SPECIAL_ENV] = "1"
    if max_input_mb is not None:
        os.environ[MAX_INPUT_MB_ENV] = repr(max_input_mb)
        try:
            data_cap_bytes()
        except ValueError as exc:
            typer.echo(f"error: --max-input-mb: {exc}", err=True)
            raise typer.Exit(2) from None


@app.command()
def version() -> None:
    """Print the pdlab version and the telemetry schema version."""
    from importlib.metadata import version as dist_version

    from telemetry.schema import SCHEMA_VERSION

    typer.echo(f"pdlab {dist_version('pdlab')} (telemetry schema {SCHEMA_VERSION})")


app.command("simulate")(simulate_command)
app.command("experiment")(experiment_command)
app.command("sweep")(sweep_command)
app.command("fit")(fit_command)
app.command("synth-logs")(synth_logs_command)
app.command("bench")(bench_command)
app.command("report")(report_command)
app.command("recover")(recover_command)
app.command("serve")(serve_command)
app.command("lab")(lab_command)
app.command("engine")(engine_command)
app.command("twin")(twin_command)
app.command("advise")(advise_command)
app.command("validate")(validate_command)
app.command("attach")(attach_command)
app.command("export")(export_command)
app.add_typer(collect_app, name="collect")
app.add_typer(dashboards_app, name="dashboards")
app.add_typer(import_app, name="import")
app.add_typer(profile_app, name="profile")
app.add_typer(runs_app, name="runs")
app.add_typer(data_app, name="data")


if __name__ == "__main__":  # pragma: no cover
    app()
