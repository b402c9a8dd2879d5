"""The fuzz tests run with their address space capped, so a regression fails the test.

Many examples run commands in-process (fast); a value that slipped past its ceiling (a
hundred million agents, a DP of 2^70) would allocate until the kernel's OOM killer ends
something on a machine others share. During each test the process's soft RLIMIT_AS is its
current size plus `HEADROOM_GB`: the allocation fails there with a MemoryError instead. The
limit is lowered and restored per test (a soft limit may go back up to the hard one).
"""

from __future__ import annotations

import resource
from collections.abc import Iterator

import psutil
import pytest

HEADROOM_GB = 3


@pytest.fixture(autouse=True)
def bounded_address_space() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + (HEADROOM_GB << 30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
