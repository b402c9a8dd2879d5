"""Fixtures every test directory can use, and a report of slow tests as they happen."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

# A test slower than this is named, with its time, the moment it ends (not only in the
# durations table at the end of a run that may never end): what a CI log needs.
SLOW_TEST_S = 30.0


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound by the OS, then closed (a connection to it is
    refused at once). Better than a well-known port such as 9, which a machine may serve or
    filter."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    yield port


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.duration < SLOW_TEST_S:
        return
    import sys

    sys.stderr.write(f"\n[slow {report.when}] {report.nodeid}: {report.duration:.1f} s\n")
    sys.stderr.flush()
