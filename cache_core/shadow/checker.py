"""Shadow checks: verdicts on cached answers from the upstream model, never on the request's path.

Two kinds, both published as ``FeedbackEvent(source="shadow")`` on the feedback topic under the
request id of the lookup they judge:

* a **hit** (a share ``hit_rate`` of them): the upstream model is asked the same question again in
  the background and its answer compared with the one served. This costs one upstream call, so it is
  held to a budget per arm (``calls_per_minute``, a token bucket) besides the bounded queue.
* a **near-miss**: a miss whose nearest candidate was within ``near_miss_band`` below the threshold,
  whose upstream answer the service fetched anyway (the chat proxy's miss). Comparing it with that
  candidate's cached answer costs no call. A ``/v1/lookup`` near-miss has no upstream answer in hand
  (the application asks its model itself): a share ``near_miss_rate`` of them asks the upstream in
  the background, within the same budget as hits. The verdict refers to the miss's request id, and the miss's
  event carries the candidate's similarity, so the warehouse can draw the false-hit curve below the
  threshold: "had the threshold been this similarity, that hit would have been right / wrong".

The request path only calls ``after_hit`` / ``after_miss``, which sample, take a budget token and
``put_nowait`` onto a bounded queue: a full queue or an empty budget drops the check (counted in
``stats()``), nothing ever waits. ``concurrency`` worker threads run the checks (the upstream call,
the equivalence check, the publish); an upstream that stalls only occupies them.
A shadow verdict never takes an entry out of service (``cache_core.state.feedback`` applies user
verdicts only): it is a measurement.
"""
from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cache_core.decision.judge import JUDGE_VETO
from cache_core.events import FeedbackEvent
from cache_core.settings import ShadowSettings
from cache_core.shadow.equivalence import Equivalence
from cache_core.records import LookupResult

log = logging.getLogger(__name__)

Fetch = Callable[[str, Any], "str | None"]
"""``fetch(query, request)``: the upstream model's answer to ``query`` (``request``: the original chat
request when there is one, else None), or None when it gave no usable answer. Runs on a worker."""


class Budget:
    """A token bucket per key: ``per_minute`` tokens a minute, at most a minute's worth saved."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute)
        self.clock = clock
        self._tokens: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> bool:
        if self.per_minute <= 0:
            return False
        with self._lock:
            now = self.clock()
            tokens, at = self._tokens.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.per_minute / 60.0)
            if tokens < 1.0:
                self._tokens[key] = (tokens, now)
                return False
            self._tokens[key] = (tokens - 1.0, now)
            return True


@dataclass
class _Check:
    kind: str  # "hit" | "near_miss"
    request_id: str
    arm: str
    cached: str
    query: str | None = None
    request: Any = None
    fresh: str | None = None
    """Known already for a near-miss; fetched by the worker for a hit."""
    check_prob: float = 1.0
    """The rate lookups like this one are checked at (``hit_rate``, ``near_miss_rate``, 1 for a chat
    near-miss): an error-bounded arm weighs the verdict by its inverse."""


_STOP = object()


class ShadowChecker:
    def __init__(self, settings: ShadowSettings, equivalence: Equivalence, fetch: Fetch,
                 publish: Callable[[FeedbackEvent], None], *, clock: Callable[[], float] = time.monotonic,
                 sample: Callable[[], float] = random.random,
                 on_checked: Callable[[str, float], None] | None = None):
        """``on_checked(request_id, check_prob)``: called on the request path for each check queued,
        with the rate it was sampled at (the service: ``SemanticCache.checked``, so error-bounded
        arms weigh the verdict by its inverse; a budget or queue drop is not in that rate)."""
        self.settings = settings
        self.equivalence = equivalence
        self.fetch = fetch
        self.publish = publish
        self.sample = sample
        self.on_checked = on_checked
        self.budget = Budget(settings.calls_per_minute, clock)
        self._queue: queue.Queue = queue.Queue(maxsize=settings.queue_size)
        self._counts: Counter = Counter()
        self._upstream_s = 0.0
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.settings.hit_rate > 0 or self.settings.near_miss_band > 0

    def start(self) -> ShadowChecker:
        if self.enabled and not self._workers:
            for i in range(self.settings.concurrency):
                worker = threading.Thread(target=self._run, name=f"shadow-{i}", daemon=True)
                worker.start()
                self._workers.append(worker)
        return self

    # -- the request path: sample, budget, enqueue; never waits --------------------------------

    def after_hit(self, result: LookupResult, query: str, request: Any = None) -> str:
        """Maybe check this hit; returns what happened ("skipped", "queued", "dropped_budget",
        "dropped_queue")."""
        if not result.hit or result.answer is None or self.settings.hit_rate <= 0 or \
                self.sample() >= self.settings.hit_rate:
            return "skipped"
        if not self.budget.take(result.arm):
            return self._count("dropped_budget")
        return self._offer(_Check("hit", result.request_id, result.arm, result.answer, query=query,
                                  request=request, check_prob=self.settings.hit_rate))

    def is_near_miss(self, result: LookupResult) -> bool:
        """A miss just below the threshold (within the band), or a judged arm's miss the judge vetoed
        (its candidate passed the threshold, the judge's cut refused it: the verdict measures the
        false-hit rate below the judge's operating point, as the band does below a threshold). The
        verdict is on the nearest candidate's answer; with several judged candidates the judge's
        best may be another one (then the verdict is an approximation)."""
        band = self.settings.near_miss_band
        if band <= 0 or result.hit or result.nearest_answer is None or result.similarity is None \
                or result.threshold is None:
            return False
        if result.guard == JUDGE_VETO and result.judge_probability is not None:
            return True
        return result.threshold - band <= result.similarity < result.threshold

    def after_miss(self, result: LookupResult, fresh_answer: str | None) -> str:
        """Compare a miss's upstream answer with its nearest candidate's, if it was a near-miss."""
        if fresh_answer is None or not self.is_near_miss(result):
            return "skipped"
        return self._offer(_Check("near_miss", result.request_id, result.arm, result.nearest_answer,
                                  fresh=fresh_answer))

    def after_lookup_miss(self, result: LookupResult, query: str) -> str:
        """Maybe check a ``/v1/lookup`` near-miss by asking the upstream (a share ``near_miss_rate``,
        within the arm's budget); returns what happened, as ``after_hit``."""
        rate = self.settings.near_miss_rate
        if rate <= 0 or not self.is_near_miss(result) or self.sample() >= rate:
            return "skipped"
        if not self.budget.take(result.arm):
            return self._count("dropped_budget")
        return self._offer(_Check("near_miss", result.request_id, result.arm, result.nearest_answer, query=query,
                                  check_prob=rate))

    def _offer(self, check: _Check) -> str:
        if self._closed or not self._workers:
            return self._count("dropped_closed")
        try:
            self._queue.put_nowait(check)
        except queue.Full:
            return self._count("dropped_queue")
        if self.on_checked is not None:
            self.on_checked(check.request_id, min(1.0, check.check_prob))
        return self._count("queued")

    def _count(self, what: str) -> str:
        with self._lock:
            self._counts[what] += 1
        return what

    # -- the workers ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            check = self._queue.get()
            if check is _STOP:
                return
            try:
                self._check(check)
            except Exception:  # a failing check is counted, the worker lives on
                log.exception("shadow check failed", extra={"request_id": check.request_id})
                self._count("errors")

    def _check(self, check: _Check) -> None:
        fresh = check.fresh
        if fresh is None:
            started = time.perf_counter()
            try:
                fresh = self.fetch(check.query, check.request)
            except Exception as exc:
                log.info("shadow upstream call failed", extra={"request_id": check.request_id,
                                                                "reason": f"{type(exc).__name__}: {exc}"})
                fresh = None
            finally:
                with self._lock:
                    self._counts["upstream_calls"] += 1
                    self._upstream_s += time.perf_counter() - started
            if fresh is None:
                self._count("no_answer")
                return
        same = self.equivalence(check.cached, fresh).same
        self.publish(FeedbackEvent(request_id=check.request_id, verdict="correct" if same else "wrong",
                                   source="shadow"))
        self._count(f"{check.kind}_{'correct' if same else 'wrong'}")

    # -- lifecycle -----------------------------------------------------------------------------

    def stats(self) -> dict:
        with self._lock:
            return {**self._counts, "upstream_s": round(self._upstream_s, 3), "waiting": self._queue.qsize()}

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop taking checks; the workers finish the one in hand (queued ones are dropped, counted)."""
        if self._closed:
            return
        self._closed = True
        dropped = 0
        while True:
            try:
                self._queue.get_nowait()
                dropped += 1
            except queue.Empty:
                break
        if dropped:
            self._count("dropped_closed")
            with self._lock:
                self._counts["dropped_closed"] += dropped - 1
        for _ in self._workers:
            try:
                self._queue.put(_STOP, timeout=timeout_s)
            except queue.Full:
                break
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
