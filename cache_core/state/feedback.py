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
* the units are counted fleet-wide: a "wrong" that does not remove the entry yet goes to
  the entries topic as a "vote" (entry, unit, serving arm), and every replica adds the unit
  to the entry's ``wrong_units`` (a set: the own echo and redeliveries count once) and
  removes the entry itself when the count reaches the limit (``SemanticCache.apply`` of a replica's ``Vote``,
  counted ``voted_out``). So with a limit of 2, one user served by replica A and another
  served by replica B take the entry out everywhere. A drop that finds the entry removed by
  votes already is counted ``duplicate``, as is a vote on an entry that is gone;
* feedback may reach any replica behind a load balancer, not the one that served the
  hit. So the replica that takes ``POST /v1/feedback`` applies it at once if it served
  the request, and every replica follows the feedback topic (``FeedbackFollower``) for
  the verdicts the others took. Each request's verdict counts once: at-least-once
  redelivery and the topic copy of a verdict applied locally find it already settled.

Restarts. ``wrong_units`` are persisted with the entry (snapshot meta, and a "vote" record
in the write-ahead log), so a restart keeps partial counts. With persistence, a graceful
stop (``FeedbackFollower.stop``) also writes the served-hit map and the follower's offsets
to ``feedback-state.json`` beside the log (at most ``feedback_memory`` hits; temporary file,
fsync, rename); the next start reads it (and deletes it: it describes one stop), restores
the map and resumes the feedback topic from those offsets, so verdicts posted while the
replica was down are applied to the hits it served before. A file older than
``SCACHE_CACHE__FEEDBACK_RESUME_MAX_AGE_S`` (capped by the feedback topic's retention,
``SCACHE_KAFKA__EVENTS_RETENTION_MS``) is discarded: the follower starts at the topic's end
with an empty map, as it does with no file (first start, or no persistence). While running,
the same file is checkpointed every ``SCACHE_CACHE__FEEDBACK_CHECKPOINT_S`` (default 30 s),
so a crash loses only the hits served since the last checkpoint. Re-reading a verdict that
was applied before the stop (or the checkpoint) is harmless (the hit is settled, or its
unit is in the set already; a "correct" one is counted again).

Scope and limits: a later "correct" does not bring back an entry a "wrong" removed; a
replica from before votes (schema change "vote") skips them as malformed and counts only
its own hits' verdicts; the limit applied is the serving arm's as configured on each
replica when the vote arrives; an arm at 0 counts nothing (raised later, its count starts at
zero), so ``wrong_units`` stay within the largest limit in force.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from kafka import TopicPartition

from cache_core.events import FeedbackEvent
from cache_core.state.follower import TopicFollower
from cache_core.durable import replace_durably
from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)

STATE_FILE = "feedback-state.json"
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
        self.changes = 0
        """Hits remembered or settled so far: a checkpoint with nothing new is skipped."""

    def __len__(self) -> int:
        return len(self._hits)

    def remember(self, request_id: str, hit: ServedHit) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._hits[request_id] = hit
            self.changes += 1
            if len(self._hits) > self.capacity:
                self._hits.popitem(last=False)

    def settle(self, request_id: str) -> ServedHit | None:
        """The hit ``request_id`` was, forgotten at once: a request's verdict counts once."""
        with self._lock:
            self.changes += 1
            return self._hits.pop(request_id, None)

    def export(self) -> list[list]:
        """Every remembered hit, oldest first, as JSON-ready rows (``restore`` reads them)."""
        with self._lock:  # only the copy under the lock: request threads remember hits meanwhile
            items = list(self._hits.items())
        return [[request_id, list(hit.key), hit.experiment_id, hit.arm, hit.entry_id, hit.unit_id]
                for request_id, hit in items]

    def restore(self, rows: list[list]) -> int:
        """Remember ``export``'s rows (the newest ``capacity`` of them) before what is remembered
        now; returns how many. Raises ValueError / TypeError on a row of another shape (a field
        of another type only gives a hit that no verdict finds, or whose entry is "gone")."""
        rows = rows[-self.capacity:] if self.capacity else []
        hits = [(request_id, ServedHit(tuple(key), experiment_id, arm, entry_id, unit_id))
                for request_id, key, experiment_id, arm, entry_id, unit_id in rows]
        if any(len(hit.key) != 3 for _, hit in hits):
            raise ValueError("a served hit's key is (namespace, experiment, arm)")
        with self._lock:
            now = list(self._hits.items())
            self._hits = OrderedDict(hits)
            for request_id, hit in now:
                self._hits[request_id] = hit
            while len(self._hits) > self.capacity:
                self._hits.popitem(last=False)
        return len(hits)


class FeedbackFollower(TopicFollower):
    """Applies the verdicts on the feedback topic to ``cache`` (see the module docstring).

    ``state_dir`` (the persistence directory; None: nothing kept): a graceful ``stop``, and a
    checkpoint every ``checkpoint_s`` (0: none), save the served hits and offsets there and
    ``start`` resumes from them, if they are at most ``max_age_s`` old (capped by the topic's
    retention) by ``clock`` (default: the cache's)."""

    thread_name = "scache-feedback"

    def __init__(self, kafka: KafkaSettings, cache, *, state_dir: Path | None = None,
                 max_age_s: float = 3600.0, checkpoint_s: float = 0.0, clock=None,
                 poll_timeout_s: float = 0.5, retry_s: float = 1.0):
        super().__init__(kafka, kafka.feedback_topic, poll_timeout_s=poll_timeout_s, retry_s=retry_s,
                         counters=(*OUTCOMES, "malformed", "restored_hits", "resumed", "checkpoints", "judged"))
        self.checkpoint_s = checkpoint_s
        self.cache = cache
        self.state_path = Path(state_dir) / STATE_FILE if state_dir is not None else None
        self.max_age_s = min(max_age_s, kafka.events_retention_ms / 1000)  # older offsets may be gone
        self.clock = clock or cache.clock
        self._resume_at: dict[TopicPartition, int] = {}
        self._checkpointed_at = self.clock()
        self._checkpointed: tuple | None = None  # (served.changes, positions) of the last checkpoint

    def start(self):
        if self._thread is None:
            self._restore_state()  # before the thread: it starts from these offsets
        return super().start()

    def start_offsets(self) -> dict[TopicPartition, int]:
        return dict(self._resume_at)

    def start_at_end(self) -> bool:
        # Without saved offsets, the hits this process can trace were all served after it started.
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        if self.state_path is not None and self._thread is not None and not self.stats()["alive"]:
            try:
                self.save_state()
            except OSError:  # the next start begins at the topic's end, as after a crash
                log.exception("saving the feedback state failed", extra={"path": str(self.state_path)})

    def handle(self, record, tp: TopicPartition) -> None:
        event = self.parse(FeedbackEvent, record, tp)
        # Shadow verdicts (cache_core.shadow) are measurements: they neither take an entry out nor
        # settle the hit, so a user's later verdict on the same request still counts.
        if event is not None and self.cache.learn(event.request_id, event.verdict) == "judged":
            self._counts["judged"] += 1  # an error-bounded arm's lookup made here (cache_core.state.learning)
        if event is not None and event.source == "user":
            self._counts[self.cache.apply_feedback(event.request_id, event.verdict)] += 1
        elif event is not None:
            self._counts["not_applied_shadow"] += 1

    def after_poll(self) -> None:
        """A checkpoint when due, from this thread: the offsets saved are those of the hits saved."""
        if self.state_path is None or not self.checkpoint_s or self.clock() - self._checkpointed_at < self.checkpoint_s:
            return
        self._checkpointed_at = self.clock()
        mark = (self.cache.served.changes, self.positions)
        if mark == self._checkpointed:
            return  # nothing served, settled or read since the last one
        try:
            self.save_state(quiet=True)
            self._checkpointed = mark
            self._counts["checkpoints"] += 1
        except OSError:  # the next one may succeed; a crash meanwhile resumes from an older one
            log.exception("feedback checkpoint failed", extra={"path": str(self.state_path)})

    # -- state across a restart --------------------------------------------------------

    def save_state(self, quiet: bool = False) -> Path:
        """Write the served hits and the offsets read so far (temporary file, fsync, rename)."""
        offsets = {str(tp.partition): offset for tp, offset in self.positions.items()}
        hits = self.cache.served.export()
        head = json.dumps({"topic": self.topic, "saved_at": self.clock(), "offsets": offsets}, separators=(",", ":"))
        # One write (json.dump would write piece by piece), the hits dumped in chunks: one json.dumps
        # of 100,000 holds the GIL ~0.2 s, a pause for every request thread.
        replace_durably(self.state_path, (head[:-1] + ',"hits":' + _json_list(hits) + "}").encode())
        (log.debug if quiet else log.info)("feedback state saved", extra={
            "path": str(self.state_path), "hits": len(hits), "offsets": offsets})
        return self.state_path

    def _restore_state(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            saved = json.loads(self.state_path.read_text())
            age_s = self.clock() - float(saved["saved_at"])
            if saved.get("topic") != self.topic:
                log.warning("feedback state of another topic ignored", extra={"path": str(self.state_path)})
            elif age_s > self.max_age_s:
                log.warning("feedback state too old, starting at the topic's end", extra={
                    "path": str(self.state_path), "age_s": round(age_s, 1), "max_age_s": self.max_age_s})
            else:
                offsets = {TopicPartition(self.topic, int(p)): int(o) for p, o in saved["offsets"].items()}
                self._counts["restored_hits"] = self.cache.served.restore(saved["hits"])
                self._resume_at, self._counts["resumed"] = offsets, 1
                log.info("feedback state restored", extra={
                    "hits": self._counts["restored_hits"], "offsets": saved["offsets"], "age_s": round(age_s, 1)})
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            log.warning("unreadable feedback state, starting at the topic's end",
                        extra={"path": str(self.state_path), "error": str(exc)})
        # It describes one stop: a later crash resumes from a checkpoint after this start, or from the end.
        self.state_path.unlink(missing_ok=True)


def _json_list(rows: list, chunk: int = 2_000) -> str:
    """``json.dumps(rows)``, compact, letting other threads run between chunks."""
    parts = []
    for start in range(0, len(rows), chunk):
        parts.append(json.dumps(rows[start:start + chunk], separators=(",", ":"))[1:-1])
        time.sleep(0)
    return "[" + ",".join(parts) + "]"


def log_invalidation(hit: ServedHit, request_id: str, wrong_units: int) -> None:
    log.info("entry invalidated by feedback", extra={
        "experiment_id": hit.experiment_id, "arm": hit.arm, "namespace": hit.key[0],
        "entry_id": hit.entry_id, "request_id": request_id, "wrong_units": wrong_units})
