"""The rows and table `pdlab validate` gives (toolkit.validate.run has the definitions)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import polars as pl

PEER_ORDER = ("LLMServingSim", "Vidur", "APEX", "TokenSim")


TICKS_COVERED = 0.95  # a per-tick row is covered when this share of ticks is in the band


class ValidationRow(NamedTuple):
    run: str
    metric: str
    real: float | None
    twin: float | None
    error: float
    ci95: tuple[float, float]
    covered: bool
    peers: dict[str, float]  # peer simulator -> its error, same definition as `error`
    kind: str  # relative | fraction | points
    # A relative row: whether its interval is bounded, and its half-width; a per-tick row:
    # the share of ticks whose real value lies in the twin's per-tick 95% band (toolkit.
    # validate: covered when >= TICKS_COVERED).
    known: bool = True
    half_width: float | None = None
    ticks_covered: float | None = None
    sources: dict[str, tuple[float, float]] | None = None  # source -> (down, up), log units

    def to_json(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else float(x)

        return {
            "run": self.run,
            "metric": self.metric,
            "real": num(self.real),
            "twin": num(self.twin),
            "error": num(self.error),
            "ci95": [num(self.ci95[0]), num(self.ci95[1])],
            "covered": bool(self.covered),
            "peers": {k: num(v) for k, v in self.peers.items()},
            "kind": self.kind,
            "known": self.known,
            "half_width": num(self.half_width),
            "ticks_covered": num(self.ticks_covered),
            "sources": None
            if self.sources is None
            else {k: [num(d), num(u)] for k, (d, u) in self.sources.items()},
        }


def make_row(
    run: str,
    metric: str,
    real: float | None,
    twin: float | None,
    error: float,
    ci95: tuple[float, float],
    peers: dict[str, float] | None = None,
    kind: str = "relative",
    *,
    sources: dict[str, tuple[float, float]] | None = None,
    ticks_covered: float | None = None,
    per_tick: bool = False,
) -> ValidationRow:
    """One row; `per_tick`: covered by its ticks, `ticks_covered` None when the twin's band is
    not known (ValidationRow)."""
    lo, hi = ci95
    known = bool(math.isfinite(lo) and math.isfinite(hi) and (kind != "relative" or lo > -1.0))
    if per_tick:
        known = ticks_covered is not None
        covered = bool(ticks_covered is not None and ticks_covered >= TICKS_COVERED)
        half = None
    else:
        covered = bool(known and lo <= 0.0 <= hi)
        half = (hi - lo) / 2.0 if known else None
    ordered = {p: (peers or {})[p] for p in sorted(peers or {}, key=_peer_key)}
    return ValidationRow(
        run, metric, real, twin, error, (lo, hi), covered, ordered, kind, known, half,
        ticks_covered, sources,
    )  # fmt: skip


def _peer_key(name: str) -> tuple[int, str]:
    return (PEER_ORDER.index(name) if name in PEER_ORDER else len(PEER_ORDER), name)


class ValidationTable(NamedTuple):
    rows: list[ValidationRow]
    skipped: list[tuple[str, str]]  # (run, why)
    series: dict[str, pl.DataFrame]  # run -> t, metric, node_id, source, value (for figures)
    notes: dict[str, list[str]]  # run -> what the replay assumed

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [r.to_json() for r in self.rows],
            "skipped": [{"run": r, "why": w} for r, w in self.skipped],
            "notes": self.notes,
        }

    def frame(self) -> pl.DataFrame:
        """The rows as a table (peers as columns `peer:<name>`)."""
        peers = sorted({p for r in self.rows for p in r.peers}, key=_peer_key)
        return pl.DataFrame(
            [
                {
                    "run": r.run, "metric": r.metric, "real": r.real, "twin": r.twin,
                    "error": r.error, "ci95_lo": r.ci95[0], "ci95_hi": r.ci95[1],
                    "covered": r.covered, "kind": r.kind, "known": r.known,
                    "half_width": r.half_width, "ticks_covered": r.ticks_covered,
                    **{f"peer:{p}": r.peers.get(p) for p in peers},
                }
                for r in self.rows
            ],
            infer_schema_length=None,
        )  # fmt: skip


class RunRows(NamedTuple):
    """What validating one run gives."""

    rows: list[ValidationRow]
    series: pl.DataFrame
    notes: list[str]
