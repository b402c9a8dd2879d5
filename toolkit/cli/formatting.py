"""How commands print numbers: JSON without NaN or Infinity, percentages of any size.

JSON has no NaN or Infinity (Python's json writes them, and strict readers — jq, browsers,
DuckDB's read_json — refuse the document), so `--json` output goes through `json_text`,
which writes a non-finite number as null. A MAPE of a fit that failed can be 1e23 or
infinite; `percent` prints it as 1.0e+25% or inf% instead of a 26-digit number.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(v: Any) -> Any:
    """`v` with non-finite floats as None, through dicts, lists and tuples."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite_or_none(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite_or_none(x) for x in v]
    return v


def json_text(doc: Any) -> str:
    """`doc` as strict JSON (non-finite numbers as null)."""
    return json.dumps(finite_or_none(doc), allow_nan=False)


PLAIN_PERCENT_BELOW = 1e5  # larger percentages print in scientific notation


def percent(fraction: float | None, digits: int = 2) -> str:
    """A fraction as a percentage: '12.34%', '1.0e+25%', 'inf%', '-' for None or NaN."""
    if fraction is None or math.isnan(fraction):
        return "-"
    pct = 100 * fraction
    if math.isinf(pct):
        return "inf%" if pct > 0 else "-inf%"
    if abs(pct) >= PLAIN_PERCENT_BELOW:
        return f"{pct:.1e}%"
    return f"{pct:.{digits}f}%"
