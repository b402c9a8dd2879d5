"""docs/limits.md lists the ceilings of cluster/size_limits.py as they are in the code."""

from __future__ import annotations

from pathlib import Path

from cluster import size_limits

DOC = Path(__file__).resolve().parents[2] / "docs" / "limits.md"


def test_the_table_of_ceilings_matches_the_code() -> None:
    text = DOC.read_text()
    start = text.index("<!-- generated: python -m cluster.size_limits -->\n")
    end = text.index("<!-- end generated -->")
    table = text[start:end].split("\n", 1)[1]
    assert table == size_limits.markdown_table(), (
        "docs/limits.md is stale: paste `python -m cluster.size_limits` between its markers"
    )


def test_every_ceiling_is_a_closed_finite_range_with_a_unit_or_reason() -> None:
    for name, limit in size_limits.LIMITS.items():
        assert limit.lo <= limit.hi < float("inf"), name
        # the upper bound itself is allowed, one past it is refused
        limit.check(name, int(limit.hi) if limit.integer else limit.hi)
