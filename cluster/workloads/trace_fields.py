"""Validation of trace records at the boundary (paper 003 App. A traces; SPEC §5).

Every field a trace reader uses goes through one of these checks before any program is
built, so a bad record fails `make_workload` (and `pdlab simulate`) before the simulation
starts, with one line in the form `FILE:LINE: FIELD: what was wrong (allowed: ...)`.

Bounds: times must be finite (JSON's NaN and Infinity are refused) and, where they are
offsets from the trace's start, >= 0. Token counts must be integers (a float with an integral
value, as CSV exports write them, is accepted) from 0 up to `max_tokens`, whose default
`MAX_REQUEST_TOKENS` (2^20 = 1,048,576 tokens) is above the context window of the models
the presets stand for; a longer context is a corrupt record, not a request (one such
request would take a simulated prefill engine days of chunks). Pass `max_tokens` as a trace
parameter to raise it.
"""

from __future__ import annotations

import math
from typing import Any

from cluster.core import ConfigError

MAX_REQUEST_TOKENS = 1 << 20


def bad(where: str, field: str, what: str, allowed: str) -> ConfigError:
    return ConfigError(f"{where}: {field}: {what} (allowed: {allowed})")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def require(where: str, rec: dict[str, Any], key: str) -> Any:
    if key not in rec:
        raise ConfigError(f"{where}: {key}: missing (fields present: {', '.join(map(str, rec))})")
    return rec[key]


def text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise bad(where, key, f"{_show(value)} is not a string", "a non-empty string")
    return value


def number(where: str, key: str, value: Any, *, nonnegative: bool, unit: str = "seconds") -> float:
    """A finite number (>= 0 when `nonnegative`)."""
    allowed = f"a finite number of {unit}" + (" >= 0" if nonnegative else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(where, key, f"{_show(value)} is not a number", allowed)
    x = float(value)
    if not math.isfinite(x):
        raise bad(where, key, f"{value} is not finite", allowed)
    if nonnegative and x < 0:
        raise bad(where, key, f"{value:g} is negative", allowed)
    return x


def optional_number(where: str, key: str, value: Any) -> float:
    """A recorded measurement that may be absent or null (NaN then)."""
    if value is None:
        return math.nan
    return number(where, key, value, nonnegative=True)


def tokens(where: str, key: str, value: Any, max_tokens: int, *, low: int = 0) -> int:
    """A token count: an integer in [low, max_tokens] (integral floats accepted)."""
    allowed = f"an integer from {low} to {max_tokens:,} (max_tokens)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(where, key, f"{_show(value)} is not an integer", allowed)
    if isinstance(value, float):
        if not math.isfinite(value) or value != math.floor(value):
            raise bad(where, key, f"{value!r} is not an integer", allowed)
        value = int(value)
    if not low <= value <= max_tokens:
        raise bad(where, key, f"{value:,} is out of range", allowed)
    return value


def csv_number(where: str, key: str, raw: str | None) -> float:
    """A CSV cell as a float (still unchecked for range)."""
    try:
        return float(raw if raw is not None else "")
    except ValueError:
        raise bad(where, key, f"{_show(raw)} is not a number", "a finite number") from None


def hash_ids(where: str, value: Any, max_id: int) -> list[int]:
    allowed = f"a list of integers from 0 to {max_id:,}"
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(where, "hash_ids", f"{_show(value)} is not a list", allowed)
    for h in value:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= max_id:
            raise bad(where, "hash_ids", f"holds {_show(h)}", allowed)
    return value
