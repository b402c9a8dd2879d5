"""Columns of `silicon_validation` (`pdlab validate silicon`, docs/silicon.md), as data.

One row per row of a silicon CSV (AIConfigurator's silicon sample of real deployments):
the measured mean TTFT and TPOT beside pdlab's twin and AIConfigurator's estimator.
`telemetry.schema` builds the table's `Column`s from these keyword sets (kept apart so the
schema module stays one screenful per concern).
"""

from __future__ import annotations

from typing import Any

_MS: dict[str, Any] = {"unit": "ms", "nonnegative": True}
_OPT_MS: dict[str, Any] = {"unit": "ms", "nullable": True, "nonnegative": True}

SILICON_VALIDATION_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "row_id", "sql": "VARCHAR", "doc": "the CSV row's id"},
    {"name": "partition", "sql": "VARCHAR", "doc": "system/backend/mode/model family"},
    {"name": "system", "sql": "VARCHAR", "doc": "AIConfigurator system (h100_sxm, b200_sxm, gb200, ...)"},
    {"name": "backend", "sql": "VARCHAR", "doc": "serving engine: vllm, sglang or trtllm"},
    {"name": "mode", "sql": "VARCHAR", "doc": "aggregated or PD-disaggregated", "allowed": ("agg", "disagg")},
    {"name": "family", "sql": "VARCHAR", "doc": "model family (llama, qwen3, qwen3-moe, minimax, ...)"},
    {"name": "model", "sql": "VARCHAR", "doc": "the row's model id"},
    {"name": "isl", "sql": "INTEGER", "doc": "input sequence length", "unit": "tokens", "positive": True},
    {"name": "osl", "sql": "INTEGER", "doc": "output sequence length", "unit": "tokens", "positive": True},
    {"name": "concurrency", "sql": "INTEGER", "doc": "clients of the closed loop", "positive": True},
    {"name": "ttft_ms", "sql": "DOUBLE", "doc": "measured mean time to first token", **_MS},
    {"name": "tpot_ms", "sql": "DOUBLE", "doc": "measured mean time per output token", **_MS},
    {"name": "pdlab_ttft_ms", "sql": "DOUBLE", "doc": "the twin's mean TTFT; NULL: unsupported", **_OPT_MS},
    {"name": "pdlab_tpot_ms", "sql": "DOUBLE", "doc": "the twin's mean TPOT; NULL: unsupported", **_OPT_MS},
    {"name": "aic_ttft_ms", "sql": "DOUBLE", "doc": "AIConfigurator's TTFT; NULL: none", **_OPT_MS},
    {"name": "aic_tpot_ms", "sql": "DOUBLE", "doc": "AIConfigurator's TPOT; NULL: none", **_OPT_MS},
    {"name": "unsupported", "sql": "VARCHAR", "doc": "why pdlab does not replay the row", "nullable": True},
    {"name": "aic_error", "sql": "VARCHAR", "doc": "why AIConfigurator gave no estimate", "nullable": True},
    {"name": "profile", "sql": "VARCHAR", "doc": "the composed profile(s) replayed", "nullable": True},
    {"name": "requests", "sql": "INTEGER", "doc": "requests the closed loop ran", "nullable": True,
     "nonnegative": True},
    {"name": "tpot_floor_ms", "sql": "DOUBLE", "doc": "least TPOT the row's own TTFT, TPOT and "
     "concurrency allow (weights and KV read at memory bandwidth); NULL: not replayed", **_OPT_MS},
)  # fmt: skip
