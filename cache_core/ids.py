"""Random request ids (32 hex characters, as ``uuid.uuid4().hex``) without a system call per id.

``uuid.uuid4()`` reads 16 bytes from ``os.urandom`` on every call, and ``os.urandom`` releases the GIL
around its system call. On the event loop that release is where an encoder thread (which wants the GIL
after each encode) takes it, and the loop then waits for it to be handed back: the two ids of a
lookup (the access log's and the decision's) were ~0.3 ms of the loop's wall time per request in a
wall-clock profile of bench/front_throughput.py (concurrency 1 and 32), for a few microseconds of CPU.
Here the bytes are read 4 KiB at a time (one release per 256 ids) and are as unpredictable as uuid4's.
"""
from __future__ import annotations

import os
import threading

_PER_READ = 256


class IdPool:
    """Hex ids cut from one ``os.urandom`` read at a time; safe across threads and forks."""

    def __init__(self, per_read: int = _PER_READ):
        self._per_read = per_read
        self._ids: list[str] = []
        self._lock = threading.Lock()
        # a forked child must not hand out the ids its parent still holds
        os.register_at_fork(after_in_child=self._ids.clear)

    def take(self) -> str:
        while True:
            try:
                return self._ids.pop()  # atomic under the GIL: no lock on the common path
            except IndexError:
                self._refill()

    def _refill(self) -> None:
        with self._lock:
            if not self._ids:
                raw = os.urandom(16 * self._per_read).hex()
                self._ids.extend(raw[i:i + 32] for i in range(0, len(raw), 32))


_POOL = IdPool()


def new_id() -> str:
    """A fresh random id: 32 hex characters (128 random bits)."""
    return _POOL.take()
