"""One way in for every change to the cache's contents that does not come from a lookup or
a store: ``SemanticCache.apply(change, origin)``.

Changes: ``Put`` (an entry), ``Remove`` (an entry out), ``Clear`` (a namespace, or what
of it was created before a time), ``Purge`` (what of a namespace matches, created before
a time) and ``Vote`` (a unit's "wrong" verdict on an entry). Origins:

* ``log``: replaying this replica's own snapshot and log (cache_core.state.persistence):
  applied as it was — no admission, no eviction, nothing logged again;
* ``replica``: another replica's change from the entries topic (cache_core.state.replication):
  this replica's capacity and LRU apply, removals are made durable, and an entry feedback
  took out here is not brought back by a late put;
``Judged`` (a verdict on the entry a lookup of an error-bounded arm served or found nearest,
at its similarity: cache_core.decision.error_bound, cache_core.state.learning) is recorded in
the hit rule's ``VerdictBook`` from every origin; a local or replica one is logged, a local one
sent to the other replicas.

* ``local``: a verdict on a hit this replica served (cache_core.state.feedback): at the
  arm's ``invalidate_after_wrong`` units the entry is removed here and (a drop) on the
  other replicas; a vote that does not remove it goes to them too, so the limit counts
  units served anywhere.

Each returns its outcome, named as the metrics count them (cache_core.state.replication.OUTCOMES,
cache_core.state.feedback.OUTCOMES).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from cache_core.decision.error_bound import Judged
from cache_core.decision.rule import HitRule
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.store.stores import Stores
from cache_core.state.feedback import ServedHit, log_invalidation
from cache_core.records import CacheEntry, EntryMatch

DROPPED_IDS_REMEMBERED = 20_000  # entry ids feedback removed, refused if replayed (ids ~32 chars)

log = logging.getLogger(__name__)

Key = tuple[str, str, str]
Origin = Literal["log", "replica", "local"]


@dataclass(frozen=True)
class Put:
    key: Key
    entry: CacheEntry


@dataclass(frozen=True)
class Remove:
    key: Key
    entry_id: str


@dataclass(frozen=True)
class Clear:
    namespace: str
    before: float | None = None
    """Only entries created before this (a clear made on another replica); None: all."""


@dataclass(frozen=True)
class Purge:
    namespace: str
    before: float
    match: EntryMatch


@dataclass(frozen=True)
class Vote:
    key: Key
    entry_id: str
    unit_id: str
    experiment_id: str = ""
    arm: str = ""
    """The arm that served the hit: its ``invalidate_after_wrong`` is the limit."""
    request_id: str = ""
    """Local votes: the request the hit answered (for the log)."""


StateChange = Put | Remove | Clear | Purge | Vote | Judged


class JudgedSink(Protocol):
    """The journal (cache_core.state.persistence): verdicts are durable with its next sync."""

    def record_judged(self, judged: Judged) -> None: ...


class EntryFeed(Protocol):
    """Replication's feed to the other replicas (cache_core.state.replication)."""

    def judged(self, judged: Judged) -> None: ...
    def voted(self, key: Key, entry_id: str, unit_id: str, arm: str) -> None: ...
    def dropped(self, key: Key, entry_id: str) -> None: ...


class CacheState(Protocol):
    """What the applier reads and writes of a cache (``SemanticCache`` is the one): typed here so
    that this module need not import the cache that calls it."""

    stores: Stores
    registry: ExperimentRegistry
    hit_rule: HitRule
    journal: JudgedSink | None
    entry_feed: EntryFeed | None
    clock: Callable[[], float]

    def sync_journal(self) -> None: ...


class StateApplier:
    """Applies changes to ``cache``'s stores (``SemanticCache.apply`` calls it)."""

    def __init__(self, cache: CacheState):
        self.cache = cache
        # Entries feedback took out, so a replayed "put" of one cannot bring it back (a restarted
        # replica may apply a verdict before its entries replay reaches the put).
        self._dropped_ids: OrderedDict[str, None] = OrderedDict()
        self._dropped_lock = threading.Lock()

    def apply(self, change: StateChange, origin: Origin) -> str:
        if isinstance(change, Judged):
            return self._judged(change, origin)
        if origin == "log":
            return self._replay(change)
        if isinstance(change, Put):
            return self._put(change)
        if isinstance(change, Remove):
            return self._drop(change)
        if isinstance(change, Clear):
            self._remove_durably(change.namespace, lambda e: change.before is None or e.created_at < change.before)
            return "clears"
        if isinstance(change, Purge):
            self._remove_durably(change.namespace,
                                 lambda e: change.match.matches(e) and e.created_at < change.before)
            return "purges"
        if isinstance(change, Vote):
            return self._local_vote(change) if origin == "local" else self._vote(change)
        raise TypeError(f"not a state change: {change!r}")

    def _judged(self, change: Judged, origin: Origin) -> str:
        """Outcomes: replayed (from the log) or judged."""
        cache = self.cache
        reading = cache.hit_rule.verdicts.record(change)
        if origin == "log":
            return "replayed"
        # The log and the other replicas get the audit's reading made here, so a replay and every
        # replica's audit see this verdict as this replica did (error_bound.Judged.audit).
        measured = change if change.audit is not None else replace(change, audit=reading)
        if cache.journal is not None:  # durable with the next sync, like a vote
            cache.journal.record_judged(measured)
        if origin == "local" and cache.entry_feed is not None:
            cache.entry_feed.judged(measured)
        return "judged"

    # -- as logged ----------------------------------------------------------------------

    def _replay(self, change: StateChange) -> str:
        stores = self.cache.stores
        if isinstance(change, Put):
            partition = stores.for_key(change.key)
            with partition.lock:
                partition.insert(change.entry)
        elif isinstance(change, Clear):
            stores.forget_namespace(change.namespace)
        elif isinstance(change, Purge):
            stores.remove_where(lambda e: change.match.matches(e) and e.created_at < change.before,
                                change.namespace)
        elif (partition := stores.get(change.key)) is not None:
            with partition.lock:
                if isinstance(change, Remove):
                    partition.remove(change.entry_id)
                else:
                    partition.vote(change.entry_id, change.unit_id)
        return "replayed"

    # -- from another replica -----------------------------------------------------------

    def _put(self, change: Put) -> str:
        """Insert an entry another replica admitted, into the store of the same key (so arms
        stay apart). Its admission tier was decided there; this replica's capacity and LRU
        still apply. Outcomes: applied, duplicate, stale, expired, too_large or
        dropped_before (feedback took this entry out here already)."""
        entry = change.entry
        if not entry.alive(self.cache.clock()):
            return "expired"
        stores = self.cache.stores
        with stores.live(lambda: stores.for_key(change.key)) as partition:
            # Under the lock that a verdict's removal holds: checked before it, a put replayed while
            # the feedback thread removes the entry would pass and bring the entry back.
            if entry.entry_id in self._dropped_ids:
                return "dropped_before"
            now = self.cache.clock()
            if entry.entry_id in partition.entries:
                return "duplicate"
            same = partition.existing_same_text(entry.scope, entry.query)
            if same is not None:
                if same.created_at > entry.created_at:
                    return "stale"  # this replica already holds a newer answer to the same text
                partition.remove(same.entry_id)
            if entry.approx_bytes > partition.capacity_bytes:
                return "too_large"
            partition.evict_for(entry.approx_bytes, now)
            partition.insert(entry)
        return "applied"

    def _drop(self, change: Remove) -> str:
        """Remove an entry another replica invalidated: dropped, or duplicate (not here)."""
        self.note_dropped(change.entry_id)  # also when not here yet: its put may still be on its way
        partition = self.cache.stores.get(change.key)
        if partition is None:
            return "duplicate"
        with partition.lock:
            removed = partition.remove(change.entry_id) is not None
        if removed:
            self.cache.sync_journal()
        return "dropped" if removed else "duplicate"

    def _vote(self, change: Vote) -> str:
        """Count a "wrong" verdict another replica resolved (or this one's, come back): at the
        serving arm's limit the entry is removed here, durably. No drop is sent: every replica
        counts the same votes. Outcomes: votes (counted), voted_out (removed now) or duplicate
        (the unit counted already, or the entry is not here)."""
        partition = self.cache.stores.get(change.key)
        if partition is None:
            return "duplicate"
        limit = self.invalidate_after(change.experiment_id, change.arm)
        with partition.lock:
            entry, new_vote = partition.vote(change.entry_id, change.unit_id)
            if not new_vote:
                return "duplicate"
            if not limit or len(entry.wrong_units) < limit:
                return "votes"
            partition.remove(change.entry_id)
            self.note_dropped(change.entry_id)
        self.cache.sync_journal()
        log.info("entry invalidated by feedback votes", extra={
            "namespace": change.key[0], "experiment_id": change.experiment_id, "arm": change.arm,
            "entry_id": change.entry_id, "wrong_units": len(entry.wrong_units)})
        return "voted_out"

    # -- a verdict on a hit served here -------------------------------------------------

    def _local_vote(self, change: Vote) -> str:
        """Outcomes: kept (the arm never removes), counted, invalidated or gone."""
        cache = self.cache
        limit = self.invalidate_after(change.experiment_id, change.arm)
        partition = cache.stores.get(change.key)
        if partition is None:
            return "gone"
        with partition.lock:
            if change.entry_id not in partition.entries:
                return "gone"
            if not limit:
                return "kept"  # never removed, so not counted: its set, the log and the topic stay small
            entry, new_vote = partition.vote(change.entry_id, change.unit_id)
            invalidated = len(entry.wrong_units) >= limit
            if invalidated:
                partition.remove(change.entry_id)
                self.note_dropped(change.entry_id)
        if not invalidated:
            if new_vote:  # durable before the 202, like a store: a crash must not forget the unit
                cache.sync_journal()
            # The other replicas count it too (their own hits' votes come back the same way),
            # so the arm's limit is reached by units served anywhere, not per replica.
            if new_vote and cache.entry_feed is not None:
                cache.entry_feed.voted(change.key, change.entry_id, change.unit_id, change.arm)
            return "counted"
        cache.sync_journal()
        log_invalidation(ServedHit(change.key, change.experiment_id, change.arm, change.entry_id, change.unit_id),
                         change.request_id, len(entry.wrong_units))
        if cache.entry_feed is not None:
            cache.entry_feed.dropped(change.key, change.entry_id)
        return "invalidated"

    def invalidate_after(self, experiment_id: str, arm: str) -> int:
        """The arm's ``invalidate_after_wrong`` as configured now (1 if the arm is gone)."""
        try:
            return self.cache.registry.get(experiment_id).arm(arm).invalidate_after_wrong
        except (KeyError, UnknownExperiment):
            return ArmConfig(name="gone").invalidate_after_wrong

    def note_dropped(self, entry_id: str) -> None:
        with self._dropped_lock:
            self._dropped_ids[entry_id] = None
            while len(self._dropped_ids) > DROPPED_IDS_REMEMBERED:
                self._dropped_ids.popitem(last=False)

    def _remove_durably(self, namespace: str, matches) -> int:
        removed = self.cache.stores.remove_where(matches, namespace)
        self.cache.sync_journal()
        return removed
