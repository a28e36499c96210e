"""A registrable counter of data errors found by the pure UDFs.

The pure functions never raise on bad data (a crash would restart the streaming job
and replay the same bad record forever); they return None and count the error here.
The Flink wrappers register a listener that forwards each count to a Flink metric.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

Listener = Callable[[str, int], None]


class DataErrorCounter:
    """Counts data errors by reason; listeners see every increment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._listeners: list[Listener] = []

    def count(self, reason: str, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            self._counts[reason] += n
            listeners = list(self._listeners)
        for listener in listeners:
            listener(reason, n)

    def get(self, reason: str) -> int:
        with self._lock:
            return self._counts[reason]

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


DATA_ERRORS = DataErrorCounter()
"""Process-wide counter (one per Python worker in Flink)."""
