"""The twin's vectorized NaN-skipping percentile agrees with numpy's own."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from toolkit.twin.metrics import nan_percentile

VALUES = st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(
    x=arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 12)), elements=VALUES),
    q=st.sampled_from([0.0, 2.5, 50.0, 90.0, 99.0, 100.0]),
)
def test_nan_percentile_is_numpys_nanpercentile(x: np.ndarray, q: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on an all-NaN row
        want = np.nanpercentile(x, q, axis=-1)
        want_row = np.nanpercentile(x[0], q)
    np.testing.assert_allclose(nan_percentile(x, q), want, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(nan_percentile(x[0], q), want_row, rtol=1e-12, atol=1e-9)
