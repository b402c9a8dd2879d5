"""A fit whose held-out MAPE is huge or infinite prints as such, not as a 26-digit number.

`pdlab fit` printed a 1e23 MAPE as `100000000000000000000000000.00%` (issue 28); the
percentages of `fit`, `profile import` and `twin` go through toolkit.cli.formatting.percent.
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from toolkit.cli.fit import _print_table
from toolkit.fit.run import NodeFit, PhaseFit, RunFit


@pytest.mark.parametrize(
    ("mape", "shown"), [(1e23, "1.0e+25%"), (float("inf"), "inf%"), (0.1234, "12.34%")]
)
def test_fit_table_prints_any_mape_readably(
    capsys: pytest.CaptureFixture[str], mape: float, shown: str
) -> None:
    pre = PhaseFit("prefill", (1e-3, 2e-6, 3e-9, 4e-7), 100, 20, mape)
    dec = PhaseFit("decode", (1e-3, 2e-5, 3e-8), 100, 20, None)
    _print_table(RunFit("r", (NodeFit(0, pre, dec),), 0.2, datetime(2026, 1, 1)), None)
    out = capsys.readouterr().out
    assert shown in out, out
    assert not re.search(r"\d{10,}", out), out  # no run of digits as long as the probe's
