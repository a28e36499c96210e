"""Finishing cache events off the request path.

A lookup decides, answers, and hands a light record to an executor; the executor
builds the ``CacheEvent`` (running the sampled ANN-vs-exact check first, when the
request was sampled), observes metrics and publishes it. Exactly one event per
request still: the record is finished exactly once.

Ordering: ``EventWorker`` is one thread draining a FIFO queue, so one process
emits its events in decision order, checked or not (a checked event only makes
the ones behind it wait a few ms). Event time (``ts_ms``) is taken at decision
time, so downstream windows do not move.

Executors only need ``submit(job)``; ``backlog()`` is optional (the cache skips
ANN checks while the backlog is long, so a slow check cannot pile up work).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from cache_core.events import CacheEvent

log = logging.getLogger(__name__)

Job = Callable[[], None]
_STOP = object()


class PendingEvent:
    """The event of one request; ``result()`` waits until the executor has built it."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._event: CacheEvent | None = None

    def set(self, event: CacheEvent) -> None:
        self._event = event
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None = 10.0) -> CacheEvent:
        if not self._done.wait(timeout_s):
            raise TimeoutError("the cache event was not finished in time")
        assert self._event is not None
        return self._event


class InlineExecutor:
    """Runs every job in the caller's thread (the default: an in-process cache whose
    events are complete when ``lookup`` returns)."""

    def submit(self, job: Job) -> None:
        job()

    def backlog(self) -> int:
        return 0


class EventWorker:
    """One daemon thread running jobs in submission order (bounded queue; a full queue
    runs the job in the caller rather than lose the event)."""

    def __init__(self, max_queue: int = 10_000, name: str = "scache-events"):
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._closed:
            job()
            return
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            log.warning("event worker queue full: finishing the event in the request thread")
            job()

    def backlog(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every job submitted so far has run; False on timeout."""
        marker = threading.Event()
        self.submit(marker.set)
        return marker.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Run what is queued, then stop; later jobs run in the caller."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            try:
                job()
            except Exception:  # one broken event must not stop the others
                log.exception("finishing a cache event failed")
