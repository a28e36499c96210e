"""A wrong verdict takes the entry that served it out of service, on every replica.

Without this, feedback only reached the warehouse: an answer users flagged as wrong went
on being served to every paraphrase until its TTL ran out. Now:

* the cache remembers, for its most recent hits (``ServedHits``, bounded), which entry
  answered which request;
* a verdict on one of them is applied (``SemanticCache.apply_feedback``): "wrong" counts
  against the entry, once per unit (user), and once ``invalidate_after_wrong`` units
  (default 1; 0 turns it off) have said so the entry is removed, logged to the write-ahead
  log and, with replication, dropped on the other replicas too (an entries-topic "drop").
  Counting units, not verdicts, keeps one user from taking out an entry that a higher
  setting asks several users to flag;
* feedback may reach any replica behind a load balancer, not the one that served the
  hit. So the replica that takes ``POST /v1/feedback`` applies it at once if it served
  the request, and every replica follows the feedback topic (``FeedbackFollower``) for
  the verdicts the others took. Each request's verdict counts once: at-least-once
  redelivery and the topic copy of a verdict applied locally find it already settled.

Scope and limits: only hits served by a live process can be traced (the map is in memory
and starts empty, so the follower starts at the topic's end); a later "correct" does not
bring back an entry a "wrong" removed; verdict counts are not persisted or replicated.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from kafka import TopicPartition

from cache_core.events import FeedbackEvent
from cache_core.follower import TopicFollower
from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)

OUTCOMES = ("invalidated", "counted", "correct", "kept", "gone", "unknown")
"""What a verdict did: removed its entry / counted toward removal / a correct verdict / the arm
does not invalidate / the entry was already gone / the request was not a hit served here."""


@dataclass(frozen=True)
class ServedHit:
    key: tuple[str, str, str]
    """The partition (namespace, experiment, arm or "*") the entry lives in."""
    experiment_id: str
    arm: str
    entry_id: str
    unit_id: str
    """Who was served: an entry's "wrong" verdicts count once per unit."""


class ServedHits:
    """The last ``capacity`` hits by request id (oldest forgotten first); thread-safe."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._hits: OrderedDict[str, ServedHit] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._hits)

    def remember(self, request_id: str, hit: ServedHit) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._hits[request_id] = hit
            if len(self._hits) > self.capacity:
                self._hits.popitem(last=False)

    def settle(self, request_id: str) -> ServedHit | None:
        """The hit ``request_id`` was, forgotten at once: a request's verdict counts once."""
        with self._lock:
            return self._hits.pop(request_id, None)


class FeedbackFollower(TopicFollower):
    """Applies the verdicts on the feedback topic to ``cache`` (see the module docstring)."""

    thread_name = "scache-feedback"

    def __init__(self, kafka: KafkaSettings, cache, *, poll_timeout_s: float = 0.5, retry_s: float = 1.0):
        super().__init__(kafka, kafka.feedback_topic, poll_timeout_s=poll_timeout_s, retry_s=retry_s,
                         counters=(*OUTCOMES, "malformed"))
        self.cache = cache

    def start_at_end(self) -> bool:
        return True  # the hits this process can trace were all served after it started

    def handle(self, record, tp: TopicPartition) -> None:
        event = self.parse(FeedbackEvent, record, tp)
        if event is not None:
            self._counts[self.cache.apply_feedback(event.request_id, event.verdict)] += 1


def log_invalidation(hit: ServedHit, request_id: str, wrong_units: int) -> None:
    log.info("entry invalidated by feedback", extra={
        "experiment_id": hit.experiment_id, "arm": hit.arm, "namespace": hit.key[0],
        "entry_id": hit.entry_id, "request_id": request_id, "wrong_units": wrong_units})
