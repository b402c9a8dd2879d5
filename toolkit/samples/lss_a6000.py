"""The A6000 runs of LLMServingSim's ISPASS'26 artifact, imported in one call.

`lss_a6000_dir()` finds `lss_ispass26_a6000/` in the real data (cluster.data: a full copy
in $PDLAB_DATA_DIR or ../shared/data, else the copy bundled with pdlab); `import_lss_a6000(db)` imports its six setups with
`pdlab import lss-run`'s reader, each with the flags its name says (figure 5: MD, SD+PC,
PDD, SM with their throughput series and LLMServingSim's; figure 7: SD+PC and MD+PC+PS with
their per-instance and shared-pool prefix series). The same calls on the H100 copy of the
artifact need only another root and file names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from cluster.data import data_path

LLAMA = "sharegpt_req300_rate10_llama.jsonl"
PHI = "sharegpt_req300_rate10_phi.jsonl"
PULSE = "sharegpt_pulse_req50_n6_delay15_pc.jsonl"


class Setup(NamedTuple):
    run: str
    figure: str
    name: str  # the artifact's file stem
    dataset: str
    flags: dict[str, Any]
    prefix_files: tuple[str, ...] = ()


SETUPS = (
    Setup("a6000-fig5-MD", "figure_5", "MD", LLAMA, {}),
    Setup("a6000-fig5-SD-PC", "figure_5", "SD+PC", LLAMA, {"prefix_caching": True}),
    Setup("a6000-fig5-PDD", "figure_5", "PDD", LLAMA, {}),
    Setup("a6000-fig5-SM", "figure_5", "SM", PHI, {}),
    Setup("a6000-fig7-SD-PC", "figure_7", "SD+PC", PULSE, {"prefix_caching": True}, ("SD+PC",)),
    Setup(
        "a6000-fig7-MD-PC-PS", "figure_7", "MD+PC+PS", PULSE,
        {"prefix_caching": True, "prefix_storage": "cpu", "prefix_sharing": True},
        ("MD+PC+PS_inst0", "MD+PC+PS_inst1", "MD+PC+PS_shared_cpu"),
    ),
)  # fmt: skip


def lss_a6000_dir() -> Path:
    return data_path("lss_ispass26_a6000")


def import_lss_a6000(
    db: str | Path,
    root: str | Path | None = None,
    runs: list[str] | None = None,
    *,
    replace: bool = False,
    **engine: Any,
) -> list[str]:
    """Import the setups (all, or `runs`) into `db`; `engine`: max_num_seqs, ... flags;
    `replace`: a setup already imported is replaced (`pdlab import --replace`)."""
    from toolkit.importers import write_runs
    from toolkit.importers.lss_run import read_lss_run

    r = Path(root) if root is not None else lss_a6000_dir()
    out = []
    for s in SETUPS:
        if runs is not None and s.run not in runs:
            continue
        fig = r / s.figure
        bench = read_lss_run(
            fig / "config" / f"{s.name}_config.json",
            r / "datasets" / s.dataset,
            r / "profiles",
            r / "models",
            s.run,
            reference_throughput=fig / "reference" / f"{s.name}_throughput.tsv"
            if s.figure == "figure_5"
            else None,
            reference_prefix=[fig / "reference" / f"{p}.tsv" for p in s.prefix_files],
            **s.flags,
            **engine,
        )
        out += write_runs(db, [bench], replace=replace)
    return out
