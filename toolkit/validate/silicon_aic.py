"""AIConfigurator's own estimator on silicon rows: the peer figure beside pdlab's twin.

`python -m toolkit.validate.silicon_aic ROWS.jsonl OUT.jsonl` estimates rows (one JSON SiliconRow a
line) in a process of its own, one JSON line of results per row, so that
`pdlab validate silicon` runs it beside the twin (`start_worker`, `read_results`).

`AicEstimator.estimate(row)` calls `aiconfigurator.cli.api.cli_estimate` (package
`aiconfigurator`, the `pdlab[aic]` extra) with the row's system, backend, model, ISL, OSL,
quantization and parallelism (batch size and TP/PP/DP/MoE TP/EP for agg; the prefill and
decode workers' for disagg), as AIConfigurator's own silicon-sample regression script
does: with its database's default version when the row's version has none. The database
version is resolved once per (system, backend) (resolving it parses every YAML of the
database: ~1 s a call). Rows it cannot estimate return None with the reason. The model id
goes through the same aliases as pdlab's (`silicon_rows.MODEL_ALIASES`), the only
checkpoints whose config ships with AIConfigurator under another id.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from toolkit.validate.silicon_rows import SiliconRow

PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")


class AicEstimate(NamedTuple):
    ttft_ms: float | None
    tpot_ms: float | None
    error: str | None


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("aiconfigurator") is not None


class AicEstimator:
    """AIConfigurator's `cli_estimate` with the database version resolved once per system."""

    def __init__(self) -> None:
        from aiconfigurator.cli.api import cli_estimate
        from aiconfigurator_core.sdk.perf_database import get_latest_database_version

        self._estimate = cli_estimate
        self._latest = get_latest_database_version
        self._versions: dict[tuple[str, str], str | None] = {}
        logging.getLogger("aiconfigurator").setLevel(logging.ERROR)
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)

    def version(self, system: str, backend: str) -> str | None:
        key = (system, backend)
        if key not in self._versions:
            with contextlib.redirect_stdout(io.StringIO()):
                self._versions[key] = self._latest(system=system, backend=backend)
        return self._versions[key]

    def _args(self, row: SiliconRow) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model_path": row.model_id,
            "system_name": row.system,
            "mode": row.mode,
            "backend_name": row.backend,
            "backend_version": self.version(row.system, row.backend),
            "isl": row.isl,
            "osl": row.osl,
            "gemm_quant_mode": row.gemm_quant,
            "moe_quant_mode": row.moe_quant,
        }
        if row.mode == "agg":
            for f in ("batch_size", *PARALLEL):
                if row.agg.get(f):
                    args[f] = row.agg[f]
        else:
            for stage, cols in (("prefill", row.prefill), ("decode", row.decode)):
                for f in (*PARALLEL, "batch_size", "num_workers"):
                    if cols.get(f):
                        args[f"{stage}_{f}"] = cols[f]
        return args

    def estimate(self, row: SiliconRow) -> AicEstimate:
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                r = self._estimate(**self._args(row))
            return AicEstimate(float(r.ttft), float(r.tpot), None)
        except Exception as exc:  # AIConfigurator raises many kinds; each row's reason is kept
            return AicEstimate(
                None, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            )


def start_worker(rows: list[SiliconRow], workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Estimate `rows` in a child process (module docstring); (process, results file)."""
    src, out = workdir / "aic_rows.jsonl", workdir / "aic_results.jsonl"
    src.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    out.write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.validate.silicon_aic", str(src), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, out


def read_results(out: Path) -> list[AicEstimate]:
    return [AicEstimate(*json.loads(line)) for line in out.read_text().splitlines() if line]


def _main(argv: list[str]) -> None:
    rows = [SiliconRow(**json.loads(line)) for line in Path(argv[0]).read_text().splitlines()]
    est = AicEstimator()
    with Path(argv[1]).open("a") as f:
        for r in rows:
            f.write(json.dumps(list(est.estimate(r))) + "\n")
            f.flush()


if __name__ == "__main__":
    _main(sys.argv[1:])
