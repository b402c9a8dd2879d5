"""The control plane's lock: re-entrant, and it tells its holder when another thread waits.

A live cluster's background thread (the paced simulator's pacing step, SPEC §6) holds the lock
for a slice of wall time at a time; REST handlers and engine callbacks wait for it. Python's
locks are not fair: on a loaded machine a waiter that is not scheduled within the holder's
short pause loses the lock again and again (a REST fuzz of 250 calls took minutes, not
seconds). `contended` lets the holder end its slice early while someone waits.
"""

from __future__ import annotations

import threading
from types import TracebackType


class ContendedRLock:
    """`threading.RLock` that counts the threads blocked on it (`contended`)."""

    __slots__ = ("_count", "_lock", "_waiting")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1.0) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        with self._count:
            self._waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count:
                self._waiting -= 1

    def release(self) -> None:
        self._lock.release()

    @property
    def contended(self) -> bool:
        """Another thread is blocked waiting for the lock."""
        return self._waiting > 0

    def __enter__(self) -> ContendedRLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
