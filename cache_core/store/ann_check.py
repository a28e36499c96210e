"""Batched ANN-vs-exact checks: one exact scan per batch of sampled requests.

A sampled lookup hands its query, scope and ANN answer to ``AnnChecker.submit``
(never blocking: a bounded pending set; a full one drops the check, counted and
logged, and the event goes out unchecked). One background thread groups pending
checks by (partition, scope) and runs a group as one ``Partition.ann_check_many``
once it holds ``batch_size`` checks or its oldest has waited ``max_wait_ms``. The
request's event still waits for its own result (``wait``) in the event executor,
so events keep their decision order and carry ann_checked / ann_agree /
ann_recall_at_k as with single checks. That wait holds the events behind it: when
the event backlog grows past half the level at which the cache stops sampling
checks (looked at every few ms while waiting), the waiting event hurries its group:
it runs before its deadline.

A CPU budget (``cpu_share`` of one core, on average) bounds what the scans cost: an exact scan
reads every row, so its cost grows with the index (~1.5 ms of CPU a check at 10^4 entries,
~12 ms at 10^5, bench/ann_check_cost.py) and with the lookup rate, and at a fixed sampling rate a large,
busy replica would spend most of a core measuring its index. Past the budget, ``within_budget``
says no and the cache skips the draw (counted as dropped, reason ``budget``) until the spend
has decayed back under it. Which lookups are checked then depends on time only, not on the
query, so index precision stays an unbiased estimate, over fewer checks.

``close`` drains: every pending group runs at once (no waiting for its deadline),
then the thread stops; a check submitted after that is dropped ("closed").
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

# Drops are logged at most this often (with the count since the last line).
DROP_LOG_INTERVAL_S = 10.0
DROP_REASONS = ("queue_full", "closed", "backlog", "timeout", "failed", "budget")
# Skips that are the design working, not a fault: counted, never logged as warnings.
QUIET_REASONS = frozenset({"budget"})
# The budget lets the spend run this many seconds' worth of it ahead before checks are skipped.
BUDGET_BURST_S = 5.0
# How often a waiting event looks whether it should hurry its batch.
HURRY_POLL_S = 0.005


@dataclass
class _Pending:
    vec: np.ndarray
    raw: list
    future: Future
    mark: object = None
    """The lookup's ``IndexMark``: the check judges the entries it could see."""


@dataclass
class _Group:
    partition: object
    scope: str | None
    opened: float
    items: list[_Pending] = field(default_factory=list)
    hurry: bool = False
    """An event waits on it while the event backlog grows: run it without its deadline."""


class AnnChecker:
    """Collects sampled ANN checks and runs them in per-partition batches (one thread)."""

    def __init__(self, batch_size: int = 64, max_wait_ms: float = 50.0, max_pending: int = 1024,
                 result_timeout_s: float | None = None, name: str = "scache-ann-check",
                 cpu_share: float = 0.0, clock: Callable[[], float] = time.monotonic):
        """``cpu_share``: of one core, what the scans may use on average (0: no budget);
        ``clock``: the budget's time (the batches' deadlines keep ``time.monotonic``)."""
        if batch_size < 1 or max_pending < 1 or max_wait_ms < 0 or cpu_share < 0:
            raise ValueError("batch_size and max_pending must be >= 1, max_wait_ms and cpu_share >= 0")
        self.batch_size = batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.max_pending = max_pending
        # How long an event waits for its result before going out unchecked: a batch's
        # deadline plus ample time for the scan (only a wedged checker runs into it).
        self.result_timeout_s = self.max_wait_s + 10.0 if result_timeout_s is None else result_timeout_s
        self._cond = threading.Condition()
        self._groups: dict[tuple[int, str], _Group] = {}
        self._pending = 0
        self._closed = False
        self._counts: Counter = Counter()
        self._dropped: Counter = Counter()
        self._dropped_unlogged = 0
        self._last_drop_log = float("-inf")
        self.cpu_share = cpu_share
        self._clock = clock
        self._debt_s, self._debt_at = 0.0, clock()  # CPU spent beyond the budget, and when last charged
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, cache_settings) -> "AnnChecker":
        return cls(batch_size=cache_settings.ann_check_batch_size,
                   max_wait_ms=cache_settings.ann_check_batch_wait_ms,
                   max_pending=cache_settings.ann_check_max_pending,
                   cpu_share=cache_settings.ann_check_cpu_share)

    # -- request side -----------------------------------------------------------------

    def submit(self, partition, scope: str | None, vec: np.ndarray,
               raw: list[tuple[str, float]], mark=None) -> Future | None:
        """Queue one check; None if it was dropped (the event then goes out unchecked)."""
        with self._cond:
            if self._closed or self._pending >= self.max_pending:
                reason = "closed" if self._closed else "queue_full"
            else:
                reason = None
                key = (id(partition), scope or "")
                group = self._groups.get(key)
                first = group is None and not self._groups
                if group is None:
                    group = self._groups[key] = _Group(partition, scope, time.monotonic())
                future: Future = Future()
                future.scache_group = group  # lets ``wait(hurry=True)`` find it
                group.items.append(_Pending(vec, raw, future, mark))
                self._pending += 1
                self._counts["submitted"] += 1
                if first or len(group.items) == self.batch_size:
                    self._cond.notify()  # the worker sleeps until the oldest deadline or a full group
        if reason is not None:
            self.count_drop(reason)
            return None
        return future

    def within_budget(self) -> bool:
        """Whether a new check fits the CPU budget (always, without one). Read without the lock:
        a stale answer costs one check more or less."""
        return not self.cpu_share or self._debt_now(self._clock()) < self.cpu_share * BUDGET_BURST_S

    def _debt_now(self, now: float) -> float:
        return max(0.0, self._debt_s - self.cpu_share * (now - self._debt_at))

    def count_drop(self, reason: str, count: int = 1) -> None:
        """Count a sampled check that was not run (also used by the cache for ``backlog``
        and ``budget``)."""
        now = time.monotonic()
        with self._cond:
            self._dropped[reason] += count
            if reason in QUIET_REASONS:
                return
            self._dropped_unlogged += count
            due = now - self._last_drop_log >= DROP_LOG_INTERVAL_S
            if due:
                self._last_drop_log, unlogged = now, self._dropped_unlogged
                self._dropped_unlogged = 0
                totals = dict(self._dropped)
        if due:
            log.warning("ANN checks dropped: events go out unchecked",
                        extra={"reason": reason, "dropped_since_last_log": unlogged,
                               "dropped_total": totals, "max_pending": self.max_pending})

    # -- event side -------------------------------------------------------------------

    def wait(self, future: Future, hurry: Callable[[], bool] | None = None):
        """The check's SearchOutcome, or None (unchecked) if it did not come in time.

        ``hurry`` (polled while waiting): True once the caller's queue is filling up
        behind this wait (events leave in order); the check's group then runs at once
        instead of at its deadline."""
        deadline = time.monotonic() + self.result_timeout_s
        hurried = hurry is None
        while True:
            if not hurried and hurry():
                hurried = True
                self._hurry(future)
            remaining = deadline - time.monotonic()
            try:
                return future.result(timeout=max(0.0, remaining if hurried else min(remaining, HURRY_POLL_S)))
            except FutureTimeout:
                if time.monotonic() >= deadline:
                    self.count_drop("timeout")
                    return None

    def _hurry(self, future: Future) -> None:
        with self._cond:
            group = getattr(future, "scache_group", None)
            if group is not None and not group.hurry:
                group.hurry = True
                self._counts["hurried"] += 1
                self._cond.notify()

    # -- lifecycle and figures --------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Run every pending check now, then stop; later submissions are dropped."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def stats(self) -> dict:
        with self._cond:
            out = {"submitted": self._counts["submitted"], "checked": self._counts["checked"],
                   "batches": self._counts["batches"], "pending": self._pending,
                   "hurried": self._counts["hurried"],
                   "cpu_s": self._counts["cpu_us"] / 1e6}
            out["dropped"] = {reason: self._dropped[reason] for reason in DROP_REASONS}
        return out

    # -- worker -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                group = self._next_group()
                if group is None:
                    return
            self._run_group(group)

    def _next_group(self) -> _Group | None:
        """The group to run next (waits for one to fill or reach its deadline); None: stop."""
        while True:
            now = time.monotonic()
            due = None
            for key, group in self._groups.items():
                if (self._closed or group.hurry or len(group.items) >= self.batch_size
                        or now - group.opened >= self.max_wait_s):
                    due = key
                    break
            if due is not None:
                group = self._groups.pop(due)
                if len(group.items) > self.batch_size:  # the rest opens a new group, due at once
                    rest = _Group(group.partition, group.scope, group.opened,
                                  group.items[self.batch_size:], hurry=group.hurry)
                    for pending in rest.items:
                        pending.future.scache_group = rest
                    group.items = group.items[:self.batch_size]
                    self._groups[due] = rest
                return group
            if self._closed:
                return None
            oldest = min((g.opened for g in self._groups.values()), default=None)
            self._cond.wait(None if oldest is None else max(0.0, oldest + self.max_wait_s - now))

    def _run_group(self, group: _Group) -> None:
        started = time.thread_time()
        outcomes = None
        try:
            outcomes = group.partition.ann_check_many(
                np.vstack([p.vec for p in group.items]), group.scope, [p.raw for p in group.items],
                [p.mark for p in group.items])
        except Exception:  # a failed batch must not cost the events; they go out unchecked
            log.exception("batched ANN check failed", extra={"checks": len(group.items)})
        cpu_s = time.thread_time() - started
        cpu_us = int(cpu_s * 1e6)
        with self._cond:
            self._pending -= len(group.items)
            self._counts["cpu_us"] += cpu_us
            if self.cpu_share:
                now = self._clock()
                self._debt_s, self._debt_at = self._debt_now(now) + cpu_s, now
            if outcomes is None:
                self._dropped["failed"] += len(group.items)
            else:
                self._counts["checked"] += len(group.items)
                self._counts["batches"] += 1
        for i, pending in enumerate(group.items):
            pending.future.scache_group = None  # no cycle future -> group -> future
            pending.future.set_result(None if outcomes is None else outcomes[i])
