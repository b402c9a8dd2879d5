"""docs/telemetry.md, generated from the schema (`telemetry.schema.TABLES`, SPEC §3).

    python -m telemetry.schema_doc > docs/telemetry.md

A test keeps the file equal to this output, so the reference lists every table and column
with the types, constraints, meaning and units the writer enforces.
"""

from __future__ import annotations

from telemetry.engine_meanings import VLLM_COLUMNS, VLLM_NOT_REPORTED, VLLM_SOURCE
from telemetry.schema import (
    FINALIZED_TABLE,
    META_TABLE,
    RUN_STATUS_TABLE,
    SCHEMA_VERSION,
    TABLES,
    Column,
)

# What each table holds (one row per ...), for docs/telemetry.md.
TABLE_DOCS: dict[str, str] = {
    "runs": "One row per run: a simulation, a live cluster's session, a collector's session.",
    "nodes": "One row per node (engine) of a run, with its hardware and MoE shape.",
    "prefill_iterations": "One row per prefill (or mixed) forward pass of a node; Eq. 1's "
    "features are sums over the pass's requests (or chunks).",
    "prefill_iteration_requests": "One row per request (chunk) in a prefill iteration.",
    "decode_iterations": "One row per decode forward pass of a node (Eq. 2).",
    "dp_passes": "One row per forward pass of a DP rank of an engine group, dummy passes "
    "included (`pdlab engine --dp N --ep N`); passes at equal (wave, step) on the ranks ran "
    "their MoE all-to-alls together.",
    "moe_layer_loads": "One row per MoE layer of a DP rank's pass under expert parallelism: "
    "the tokens it received after the dispatch and the experts it ran.",
    "requests": "One row per finished LLM call (turn of an agent program).",
    "request_stages": "One row per request a live PD proxy answered: when it passed each "
    "stage between the proxy and the engines (their serving overheads, fitted by `pdlab fit` into overhead_fits; "
    "models.overheads). Join `requests` on request_id for t_arrival, t_first_token, t_done.",
    "branch_events": "One row per event of an agent branch (Alg. E.1's branch table).",
    "kv_events": "One row per KV block stored or removed, or per tier cleared, on a node "
    "(the events that build the KV directory).",
    "branch_counts": "One row per change of a block's branch count R_{b,n} on a node (Alg. E.2).",
    "evictions": "One row per KV block evicted from a node's tier.",
    "phase_switches": "One row per phase switch of a node (paper 000 §4.1-4.2).",
    "planner_windows": "One row per candidate split evaluated by the planner's gain test "
    "(Eq. 6) at the end of a window.",
    "router_decisions": "One row per routing decision (Alg. E.3's inner loop).",
    "model_fits": "One row per node and phase fitted by `pdlab fit` (Eq. 1, Eq. 2).",
    "overhead_fits": "One row per stage of a PD cluster run's serving overheads fitted as a "
    "distribution (models.overheads): what the passes do not account for.",
    "programs": "One row per finished agent program (paper 003 §3.1).",
    "cluster_instances": "One row per engine instance of an imported cluster run "
    "(`pdlab import lss-run`): what it serves, on what, and its memory, links and prefix tiers.",
    "request_tokens": "One row per request of an imported run whose token ids are known "
    "(prefix caching replays hash them into vLLM's 16-token blocks).",
    "operator_profiles": "One row per operator profile an import read (per model, GPU and "
    "TP), as the document `pdlab profile import` writes.",
    "reference_series": "One row per tick of a measured or simulated series of an imported "
    "run (generation throughput, GPU memory, prefix hits; an LLMServingSim bench run's "
    "running and waiting requests and KV use), the real run's and its peers' "
    "(`pdlab validate` compares the twin with them; `pdlab report` draws them).",
    "reference_latency": "One row per framework of an imported run's mean-latency table: the "
    "real run's ('vLLM') and simulators' figures for it.",
    "engine_metrics": "One row per sample of an engine's Prometheus /metrics scraped by "
    "`pdlab attach` (gauges and counters; histogram buckets are not kept).",
    "silicon_validation": "One row per row of a silicon CSV checked by `pdlab validate "
    "silicon` (docs/silicon.md): measured TTFT and TPOT beside the twin's and "
    "AIConfigurator's.",
}

_INTRO = """\
# Telemetry reference (DuckDB schema version {version})

Every pdlab run writes its telemetry into one DuckDB file (`--db`); a database holds many
runs, and every table has `run_id`. Times are seconds (DOUBLE) since the run's start;
`runs.started_at` anchors them to wall time. Rows are validated when written: a bad row is
rejected with an error naming the table, the row and the column. Tables gain columns in later
schema versions; they never lose or rename one.

`pdlab fit` and `pdlab report` also read databases written by other tools. Their tables
must have the required columns below; a column stored as another type is cast (text holding
numbers, integral DOUBLE ids), and values that cannot be cast, missing columns and NULL ids
are reported before anything is analysed. Nullable columns may be missing.

Reading a run while it is written: rows are flushed every few wall seconds into Parquet
segments under `<db>.live/<run_id>/`, which readers see together with the database. A
writer that dies leaves its segments there; `pdlab recover DB` folds them in.

Generated by `python -m telemetry.schema_doc` from `telemetry/schema.py`; do not edit.
"""

_BOOKKEEPING = f"""\
## Bookkeeping tables

| table | holds |
|---|---|
| `{META_TABLE}` | `key`, `value`: the schema version (`schema_version`) |
| `{FINALIZED_TABLE}` | `run_id`, `finalized_at`: runs whose live segments were folded into the database |
| `{RUN_STATUS_TABLE}` | `run_id`, `status`, `ended_at`, `detail`: how a run ended: `finished` (closed), `failed` (the writing process raised; its rows so far are kept and `detail` holds the error), `recovered` (its writer died and `pdlab recover` folded its segments in) |

A run without a status row is `running` while its writer holds the lock on its live
directory, `crashed` once that writer is gone (`pdlab recover` then folds it in), and
`unknown` when it was written by another tool. `TelemetryReader.runs()` shows the status
of every run; `pdlab fit` and `pdlab report` warn about runs that did not finish.
"""


def _constraint(col: Column) -> str:
    parts = ["nullable" if col.nullable else "required"]
    if col.positive:
        parts.append("> 0")
    elif col.nonnegative:
        parts.append(">= 0")
    if col.sql == "DOUBLE" or col.sql == "DOUBLE[]":
        parts.append("finite")
    if col.allowed is not None:
        parts.append("one of " + ", ".join(f"'{a}'" for a in col.allowed))
    if col.node_ref:
        parts.append("a node of the run")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _vllm_section(table: str) -> list[str]:
    """What the table's columns mean when vLLM wrote them (telemetry.engine_meanings)."""
    cols, missing = VLLM_COLUMNS.get(table), VLLM_NOT_REPORTED.get(table)
    if not cols and not missing:
        return []
    out = ["**From vLLM** (sources under [Tables](#tables)):\n"]
    if cols:
        out += ["| column | from vLLM |", "|---|---|"]
        out += [f"| `{c}` | {_cell(text)} |" for c, text in cols.items()]
        out.append("")
    if missing:
        out.append(f"Not reported by vLLM: {missing}.\n")
    return out


def schema_markdown() -> str:
    out = [_INTRO.format(version=SCHEMA_VERSION)]
    out.append("## Tables\n")
    out.append(
        f"Rows from vLLM come from {VLLM_SOURCE}. What each column then means, and what vLLM "
        "does not report, follows each table's reference.\n"
    )
    out.append(" · ".join(f"[{t}](#{t})" for t in TABLES) + "\n")
    for table, cols in TABLES.items():
        out.append(f"### {table}\n")
        out.append(TABLE_DOCS[table] + "\n")
        out.append("| column | type | unit | constraints | meaning |")
        out.append("|---|---|---|---|---|")
        for col in cols:
            out.append(
                f"| `{col.name}` | {col.sql} | {_cell(col.unit) or '-'} | {_constraint(col)} "
                f"| {_cell(col.doc)} |"
            )
        out.append("")
        out.extend(_vllm_section(table))
    out.append(_BOOKKEEPING)
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(schema_markdown(), end="")
