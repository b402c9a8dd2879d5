"""Running independent simulations as Ray tasks (paper 000 App. D.2; paper 003 §5.2).

Partitions of a large cluster and the points of a sweep are independent simulations, so the
same function runs as a local process or as a Ray task. `ray_session` connects to an
existing cluster (`address`, e.g. "ray://head:10001" or "auto") or starts a local runtime
bounded to `num_cpus`, and shuts down what it started (a connection to an existing cluster
is only closed, the cluster keeps running). Workers of a local runtime inherit the driver's
environment, PYTHONPATH included, so they import the same code; the nodes of an existing
cluster need pdlab installed. Ray is an optional extra: without it the session raises a
ConfigError naming the extra to install.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import TypeVar

from cluster.core import ConfigError

RAY_EXTRA = "pip install 'pdlab[ray]' (ray[default]>=2.30)"
STARTUP_ATTEMPTS = 3
_AGENT_WAIT = "RAY_agent_register_timeout_ms"

J = TypeVar("J")
R = TypeVar("R")


def import_ray() -> ModuleType:
    """The `ray` module, or a ConfigError saying which extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"backend 'ray' needs Ray: {RAY_EXTRA}") from None
    return ray


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, initialised: an already-initialised session is used as it is (and left running);
    otherwise connect to `address`, or start a local runtime with `num_cpus` CPUs (default:
    this machine's count), and shut it down on exit."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"the number of Ray CPUs must be >= 1, got {num_cpus}")
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as err:
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {err}") from None
    else:
        _start_local(ray, num_cpus or os.cpu_count() or 1)
    try:
        yield ray
    finally:
        ray.shutdown()


def _start_local(ray: ModuleType, num_cpus: int) -> None:
    """Start a local Ray runtime. On a busy machine its agents can miss Ray's startup
    deadlines (the raylet waits `agent_register_timeout_ms` for them, the driver a fixed
    30 s for the raylet): the agents get a longer wait and a start that times out is retried
    up to STARTUP_ATTEMPTS times in all, each failure shut down before the next try."""
    saved = os.environ.get(_AGENT_WAIT)
    os.environ.setdefault(_AGENT_WAIT, "120000")  # inherited by the raylet ray.init spawns
    try:
        for attempt in range(1, STARTUP_ATTEMPTS + 1):
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
                return
            except Exception as err:
                if "timed out during startup" not in str(err) or attempt == STARTUP_ATTEMPTS:
                    raise
                ray.shutdown()
                warnings.warn(
                    f"the local Ray runtime did not start in time (attempt {attempt} of "
                    f"{STARTUP_ATTEMPTS}, a busy machine?); trying again",
                    RuntimeWarning,
                    stacklevel=2,
                )
    finally:
        if saved is None:
            os.environ.pop(_AGENT_WAIT, None)


def run_tasks(
    fn: Callable[[J], R],
    jobs: Sequence[J],
    address: str | None = None,
    num_cpus: int | None = None,
    on_done: Callable[[R], None] | None = None,
) -> list[R]:
    """`fn` over `jobs` as Ray tasks; results in completion order, each passed to `on_done`
    as it arrives."""
    with ray_session(address, num_cpus) as ray:
        task = ray.remote(fn)
        pending = [task.remote(j) for j in jobs]
        results: list[R] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results.append(ray.get(done[0]))
            if on_done is not None:
                on_done(results[-1])
    return results
