"""`pdlab profile import DIR --model-config CONFIG.json [--tp N] -o PROFILE.json` (SPEC §9), and
`pdlab profile import --aiconfigurator --system S --backend B [--version V] --model-config C
--quant Q [--tp N --dp N --ep N --moe-tp N] -o PROFILE.json` (SPEC §10, extra `pdlab[aic]`).

An LLMServingSim operator profile (its dense.csv layout, or the layers.csv + attention.csv
layout of its ispass26 artifact; `--format`, detected by default) plus the model's HF config
become a pdlab profile
(cluster.hardware.operator_profile): iteration times over the measured grid, each phase's
model forms fitted and chosen by cross-validation, KV bytes per token and weight bytes,
and the operator tables for exact pricing. The file works as `--profile` wherever a
profile is accepted. The command prints, per phase, held-out MAPE of the paper form and
of the chosen form, and the chosen coefficients with their intervals.

With `--aiconfigurator` the operator tables are composed from AIConfigurator's measured
kernel database instead of an LLMServingSim directory
(cluster.hardware.aiconfigurator_profile); the profile names the tables and rows it used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from toolkit.cli.formatting import json_text, percent
from toolkit.cli.style import HELP_STYLE

EXIT_INPUT = 2
GIB = 1024**3

profile_app = typer.Typer(
    help="Hardware profiles from measured operator timings.",
    no_args_is_help=True,
    **HELP_STYLE,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def summary(profile: Any, output: Path) -> dict[str, Any]:
    """The `--json` object: per phase the points, paper and chosen forms and their MAPE."""
    fits = {}
    for phase, f in profile.fits.items():
        best = f.best
        fits[phase] = {
            "points": f.points,
            "paper_mape": f.paper.mape,
            "chosen": f.chosen,
            "chosen_mape": best.mape,
            "terms": list(best.terms),
            "coef": list(best.coef),
            "ci": None if best.ci is None else [list(c) for c in best.ci],
        }
    doc = profile.to_json()
    return {
        "profile": str(output),
        "name": profile.name,
        "model": profile.shape.name,
        "tp": profile.parallel.tp,
        "kv_bytes_per_token": doc["kv_bytes_per_token"],
        "kv_bytes_per_token_total": doc["kv_bytes_per_token_total"],
        "weight_bytes": doc["weight_bytes"],
        "weight_bytes_total": doc["weight_bytes_total"],
        "kv_tokens": profile.kv_tokens,
        "fits": fits,
        "notes": list(profile.notes),
    }


def _print(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from toolkit.cli.fit import form_key

    table = Table(
        title=f"profile {info['name']} (TP {info['tp']}) -> {info['profile']}",
        caption="held-out MAPE (5-fold) over the measured grid; coefficients in seconds with 95% intervals",
        show_lines=True,
    )
    for col in ("phase", "points", "paper MAPE", "chosen form", "MAPE", "coefficients"):
        table.add_column(col, overflow="fold")
    for phase, f in info["fits"].items():
        coefs = "\n".join(
            f"{t} = {c:.4e}" + ("" if f["ci"] is None else f"  [{lo:.3e}, {hi:.3e}]")
            for t, c, (lo, hi) in zip(
                f["terms"], f["coef"], f["ci"] or [(0, 0)] * len(f["terms"]), strict=True
            )
        )
        table.add_row(
            phase,
            str(f["points"]),
            percent(f["paper_mape"]),
            f["chosen"],
            percent(f["chosen_mape"]),
            coefs,
        )
    console = Console()
    console.print(table)
    console.print(
        f"KV {info['kv_bytes_per_token']} bytes/token per rank ({info['kv_bytes_per_token_total']} in all); "
        f"weights {info['weight_bytes'] / GIB:.2f} GiB per rank ({info['weight_bytes_total'] / GIB:.2f} GiB in all)"
        + (f"; KV capacity {info['kv_tokens']} tokens" if info["kv_tokens"] else "")
    )
    for line in form_key((phase, f["chosen"]) for phase, f in info["fits"].items()):
        console.print(line, highlight=False)
    for note in info["notes"]:
        console.print(f"[dim]{note}[/dim]")


def _import_aic(opts: dict[str, Any]) -> Any:
    """The profile composed from AIConfigurator's kernel tables (`--aiconfigurator`)."""
    from cluster.core import ConfigError
    from cluster.hardware.aiconfigurator_db import KernelDatabase
    from cluster.hardware.aiconfigurator_profile import (
        AicTarget,
        build_aic_profile,
        unsupported_reason,
    )
    from cluster.hardware.model_shape import ModelShape
    from cluster.input_files import load_json_document

    for name in ("system", "backend"):
        if not opts[name]:
            raise ConfigError(f"--aiconfigurator needs --{name}")
    config, _ = load_json_document(opts["model_config"], what="model config")
    why = unsupported_reason(config)
    if why:
        raise ConfigError(f"{opts['model_config']}: {why}")
    shape = ModelShape.load(opts["model_config"])
    target = AicTarget(
        opts["system"], opts["backend"], opts["version"], opts["quant"], opts["moe_quant"],
        opts["tp"], opts["dp"] if shape.is_moe else 1, opts["moe_tp"] if shape.is_moe else None,
        opts["ep"] if shape.is_moe else 1, opts["distribution"],
        "fp8" if opts["kv_fp8"] else "bfloat16",
    )  # fmt: skip
    db = KernelDatabase(target.system, target.backend, target.version, opts["aic_systems"])
    return build_aic_profile(db, shape, target, name=opts["name"])


@profile_app.command("import")
def import_command(
    directory: Path | None = typer.Argument(
        None,
        help="LLMServingSim profile directory: dense.csv, per_sequence.csv, attention.csv[, "
        "moe.csv], or layers.csv + attention.csv (the ispass26 layout); none with "
        "--aiconfigurator.",
    ),
    layout: str = typer.Option(
        "auto", "--format", help="Profile layout: auto (detected), dense or layers."
    ),
    memory_gbps: float | None = typer.Option(
        None,
        "--memory-gbps",
        help="GPU memory bandwidth, GB/s: attention never reads its KV faster (default: no floor).",
    ),
    model_config: Path = typer.Option(
        ..., "--model-config", help="The model's Hugging Face config.json."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Profile JSON to write."),
    tp: int = typer.Option(
        1, "--tp", min=1, help="Tensor-parallel degree served (a TP 1 profile is scaled)."
    ),
    profiled_tp: int | None = typer.Option(
        None,
        "--profiled-tp",
        min=1,
        help="TP the profile was measured at (default: from a tp<N> directory name, else 1).",
    ),
    dp: int = typer.Option(1, "--dp", min=1, help="Data-parallel engines (DP ranks)."),
    ep: int = typer.Option(
        1, "--ep", min=1, help="Expert-parallel degree (1: experts split by TP)."
    ),
    link_gbps: float = typer.Option(
        25.0, "--link-gbps", help="Bandwidth of TP/EP collectives, GB/s (no profile measures it)."
    ),
    link_latency_us: float = typer.Option(
        10.0, "--link-latency-us", help="Latency of one collective, microseconds."
    ),
    expert_load_skew: float = typer.Option(
        1.0, "--expert-load-skew", help="Busiest EP rank's tokens over the mean (1: balanced)."
    ),
    gpu_memory_gib: float | None = typer.Option(
        None, "--gpu-memory-gib", help="GPU memory per GPU, GiB (for the KV capacity)."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None,
        "--gpu-memory-utilization",
        help="Fraction of GPU memory the engine may use (vLLM default 0.9).",
    ),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Engine batch limit."),
    max_num_batched_tokens: int | None = typer.Option(
        None, "--max-num-batched-tokens", help="Engine token budget per iteration."
    ),
    hardware: str = typer.Option("", "--hardware", help="Hardware name to record."),
    name: str | None = typer.Option(None, "--name", help="Profile name (default: <model>-tp<N>)."),
    aiconfigurator: bool = typer.Option(
        False,
        "--aiconfigurator",
        help="Compose from AIConfigurator's kernel database (pdlab[aic]).",
    ),
    system: str | None = typer.Option(
        None, "--system", help="AIConfigurator system (h200_sxm, ...)."
    ),
    backend: str | None = typer.Option(None, "--backend", help="vllm, sglang or trtllm."),
    version: str | None = typer.Option(
        None, "--version", help="Backend version of the tables (default: the database's current)."
    ),
    quant: str = typer.Option("bf16", "--quant", help="GEMM weights: bf16, fp8, fp8_block, fp4."),
    moe_quant: str | None = typer.Option(
        None, "--moe-quant", help="MoE weights (default: --quant)."
    ),
    moe_tp: int | None = typer.Option(
        None, "--moe-tp", min=1, help="MoE TP (default TP x DP / EP)."
    ),
    distribution: str = typer.Option(
        "power_law_1.01",
        "--distribution",
        help="MoE routing table: balanced, power_law_1.01, power_law_1.2.",
    ),
    kv_fp8: bool = typer.Option(False, "--kv-fp8", help="FP8 KV cache (default bf16)."),
    aic_systems: Path | None = typer.Option(
        None,
        "--aic-systems",
        help="AIConfigurator systems/ directory (default: the installed one).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the summary)."),
) -> None:
    """Fit a pdlab profile from an operator profile (or AIConfigurator's kernel tables) and a model config."""
    from cluster import size_limits as limits
    from cluster.core import ConfigError
    from cluster.hardware.engine_settings import EngineSettings
    from cluster.hardware.model_shape import ModelShape
    from cluster.hardware.operator_profile import build_profile
    from cluster.hardware.pricer import Parallelism
    from models.fitting import FitError

    if aiconfigurator:
        try:
            profile = _import_aic(locals())
        except (ConfigError, FitError, ValueError, OSError) as exc:
            _fail(str(exc).splitlines()[0])
            return
        _write(profile, output, as_json, [])
        return
    if directory is None:
        _fail("pass a profile directory, or --aiconfigurator")
        return
    src = directory
    if profiled_tp is None and (directory / f"tp{tp}").is_dir() and tp != 1:
        src = directory / f"tp{tp}"  # the bundle measured at the served TP
    elif (
        profiled_tp is None and not directory.name.startswith("tp") and (directory / "tp1").is_dir()
    ):
        src = directory / "tp1"  # a model folder of the layers layout: scale its TP 1 bundle
    try:
        limits.check("--gpu-memory-gib", gpu_memory_gib, limits.GPU_MEMORY_GIB)
        limits.check("--profiled-tp", profiled_tp, limits.TENSOR_PARALLEL)
        limits.check("--max-num-seqs", max_num_seqs, limits.MAX_NUM_SEQS)
        limits.check("--max-num-batched-tokens", max_num_batched_tokens, limits.BATCHED_TOKENS)
        limits.check("--gpu-memory-utilization", gpu_memory_utilization, limits.UTILIZATION)
        shape = ModelShape.load(model_config)
        engine = None
        if gpu_memory_gib or max_num_seqs or max_num_batched_tokens or gpu_memory_utilization:
            engine = EngineSettings(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                tensor_parallel_size=tp,
                data_parallel_size=dp,
                expert_parallel_size=ep,
                gpu_memory_utilization=gpu_memory_utilization,
                gpu_memory_bytes=None if gpu_memory_gib is None else int(gpu_memory_gib * GIB),
                hardware=hardware or None,
            )
        par = Parallelism(tp, dp, ep, link_gbps, link_latency_us * 1e-6, expert_load_skew)
        profile = build_profile(
            src, shape, tp=tp, profiled_tp=profiled_tp, parallel=par, engine=engine,
            hardware=hardware, name=name, layout=layout, memory_gbps=memory_gbps,
        )  # fmt: skip
    except (ConfigError, FitError, ValueError) as exc:
        _fail(str(exc))
        return
    _write(
        profile, output, as_json, [f"used {src} (measured at TP {tp})"] if src != directory else []
    )


def _write(profile: Any, output: Path, as_json: bool, extra_notes: list[str]) -> None:
    try:  # JSON has no NaN or Infinity: a profile holding one is refused, not written
        text = json.dumps(profile.to_json(), allow_nan=False)
    except ValueError:
        _fail(f"the profile holds a non-finite number; nothing written to {output}")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, output)  # readers see the old profile or the new one, never half of one
    info = summary(profile, output)
    info["notes"][:0] = extra_notes
    if profile.source.startswith("aiconfigurator:"):
        info["tables"] = json.loads(profile.source.removeprefix("aiconfigurator:"))
    if as_json:
        typer.echo(json_text(info))
    else:
        _print(info)
