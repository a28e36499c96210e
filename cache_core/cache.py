"""SemanticCache: embed, search the unit's partition, decide, and describe the decision.

Partitions. ``partitioned`` experiments give every arm its own store
(namespace, experiment, arm), so arms never serve each other's entries and
their hit rates are independent; ``shared`` experiments give all arms one store
(namespace, experiment) and differ only in how they decide. Inside a store,
entries with a conversation ``scope`` live in an index of their own per scope:
a scoped lookup searches only its scope (a follow-up such as "what about it?"
depends on its conversation, so neither another conversation's entries nor
global ones may answer it); an unscoped lookup searches only unscoped entries.

Decision. ``cache_core.decision`` holds the whole hit rule (thresholds, re-ranking,
guards, judge); the cache hands it a search's live candidates (``HitRule.decide``). The
event's ``similarity`` stays the cosine of the entry served (or of the nearest), and on a
multi arm its ``score`` / ``score_margin`` carry the best-ranked candidate's mixed score and
its lead over the best candidate with another answer, so that a multi arm's thresholds can
be re-evaluated offline.

Lifetime. ``absolute``: alive until created_at + ttl. ``sliding``: every hit
renews the ttl, but never past created_at + max_age_s. Expired entries are
removed when a search meets them and when LRU eviction reaches them.

Admission tiers (DESIGN.md), by the new query's similarity to its nearest live
entry in the same store and scope. Our reading:
  * >= 0.85 ("near_duplicate"): a popular intent. Admit, with its eviction
    delayed: lifetime ttl + 30 s, and LRU skips it while it is alive.
  * 0.60-0.85 ("admitted"): admit under ordinary LRU (evicting if full).
  * < 0.60 ("novel"): a query unlike anything cached is most likely a one-off.
    It never pushes out a live entry: it is admitted only if there is room,
    after the eviction it triggers (expired entries at the LRU end are
    dropped); otherwise it is rejected ("novel_under_pressure"). An empty
    store admits anything, so a cold cache can fill.
The same query text in the same store and scope replaces the entry ("updated").
"""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from cache_core.clusters import OnlineClusters
from cache_core.decision.rule import HitRule
from cache_core.embedding.embedder import Embedder
from cache_core.publish.event_worker import InlineExecutor, PendingEvent
from cache_core.events import CacheEvent, Verdict
from cache_core.experiments import HOLDOUT_ARM, ArmConfig, ExperimentConfig, Variant, assign
from cache_core.state.feedback import ServedHit, ServedHits, log_invalidation
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.store.faiss import IndexMark, IndexSpec
from cache_core.store.partition import Partition
from cache_core.types import (CacheEntry, Candidate, EntryMatch, InvalidRequest, LookupResult, SearchOutcome,
                              StoreItem, StoreResult, entry_bytes)

NEAR_DUPLICATE_SIM = 0.85
NOVEL_SIM = 0.60
EVICTION_GRACE_S = 30.0
SHARED_ARM = "*"
DROPPED_IDS_REMEMBERED = 20_000  # entry ids feedback removed, refused if replayed (ids ~32 chars)
# Sampled ANN checks are skipped while this many events wait to be finished.
MAX_CHECK_BACKLOG = 64

log = logging.getLogger(__name__)

Clock = Callable[[], float]
EventSink = Callable[[CacheEvent], None]


@dataclass
class _Request:
    """What every decision needs: the experiment snapshot, the unit's arm, the embedding."""

    experiment: ExperimentConfig
    arm_name: str
    assignment_prob: float
    vec: np.ndarray
    l2_norm: float
    cluster: int
    embed_ms: float
    started: float
    variant: Variant = "base"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class _EventRecord:
    """What a decided lookup hands to the event executor: plain values and references,
    so the request path builds no pydantic model."""

    req: _Request
    query: str
    unit_id: str
    namespace: str
    decision: str
    threshold: float | None
    similarity: float | None
    index_kind: str
    search_ms: float
    guard: str | None
    entry: dict
    ts_ms: int
    latency_ms: float
    check: tuple[Partition, str | None, list, IndexMark | None] | None = None
    """(partition, scope, ANN answer, index mark) when this request was sampled for an ANN check."""
    check_future: Future | None = None
    """Instead of ``check``: the batched check's result to come (``AnnChecker``)."""
    similarity_mode: str = "cosine"
    score: float | None = None
    score_margin: float | None = None


class SemanticCache:
    """The online cache: ``lookup`` decides and emits one event; ``store`` admits.

    Events are finished by ``event_executor`` (default: inline, in the caller; the
    service passes a ``cache_core.publish.event_worker.EventWorker`` so that the event,
    metrics and a sampled ANN-vs-exact check run after the answer has left).

    ``ann_checker`` (a ``cache_core.store.ann_check.AnnChecker``, optional) batches the sampled
    checks; without it each one scans alone in the executor. The event waits for its
    batch (up to the checker's ``max_wait_ms``), so give it a background executor only."""

    def __init__(self, embedder: Embedder, registry: ExperimentRegistry, *,
                 clock: Clock = time.time, event_sink: EventSink | None = None,
                 instance_id: str = "",
                 default_ttl_s: float | None = None, max_query_chars: int = 4000,
                 max_answer_chars: int = 100_000, emit_query_text: bool = False,
                 cluster_radius: float = 0.55, seed: int | None = None,
                 event_executor=None, ann_checker=None, feedback_memory: int = 100_000,
                 hit_rule: HitRule | None = None):
        self.embedder = embedder
        self.event_executor = event_executor or InlineExecutor()
        self.ann_checker = ann_checker
        self.registry = registry
        self.clock = clock
        self.event_sink = event_sink
        self.instance_id = instance_id
        self.default_ttl_s = default_ttl_s
        self.max_query_chars = max_query_chars
        self.max_answer_chars = max_answer_chars
        self.emit_query_text = emit_query_text
        self.clusters = OnlineClusters(embedder.dim, radius=cluster_radius)
        self.hit_rule = hit_rule or HitRule()
        """Decides every lookup (cache_core.decision)."""
        self.served = ServedHits(feedback_memory)
        """Recent hits by request id, for feedback (``apply_feedback``)."""
        self.feedback_outcomes: dict[tuple[str, str, str], int] = {}
        """(experiment, arm, outcome) -> verdicts on the hits served here."""
        self._feedback_lock = threading.Lock()
        # Entries feedback took out, so a replayed "put" of one cannot bring it back (a restarted
        # replica may apply a verdict before its entries replay reaches the put).
        self._dropped_ids: OrderedDict[str, None] = OrderedDict()
        self._dropped_lock = threading.Lock()
        self._partitions: dict[tuple[str, str, str], Partition] = {}
        self._partitions_lock = threading.Lock()
        self._idle_marks: dict[tuple[str, str, str], int] = {}  # mutations at the last retire_idle_stores
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.journal = None
        """Set by ``attach_journal`` (cache_core.state.persistence): every change is logged."""
        self.entry_feed = None
        """Optional (``cache_core.state.replication.EntryFeed``): told of every stored entry and
        namespace clear, after they are durable, for the other replicas."""

    # -- public -----------------------------------------------------------------------

    def lookup(self, query: str, unit_id: str, experiment_id: str | None = None,
               namespace: str = "default", scope: str | None = None) -> LookupResult:
        """Decide hit / miss / bypass for ``query``; exactly one event per call.

        Raises InvalidRequest (bad query or ids) and UnknownExperiment.
        """
        self._check_query(query, unit_id, namespace, scope)
        started = time.perf_counter()
        experiment = self.registry.get(experiment_id)  # one snapshot for the whole request
        vecs, norms = self.embedder.encode_with_norms([query])
        req = self._request(experiment, unit_id, vecs[0], norms[0], started)
        return self._lookup_encoded(req, query, unit_id, namespace, scope)

    async def lookup_async(self, query: str, unit_id: str, experiment_id: str | None = None,
                           namespace: str = "default", scope: str | None = None) -> LookupResult:
        """``lookup`` for an event loop: awaits the encoder instead of holding a thread.

        The decision after the encode is short (search under the partition lock) and
        runs in the loop."""
        self._check_query(query, unit_id, namespace, scope)
        started = time.perf_counter()
        experiment = self.registry.get(experiment_id)
        submit = getattr(self.embedder, "submit", None)
        if submit is not None:
            vecs, norms = await asyncio.wrap_future(submit([query]))
        else:
            vecs, norms = await asyncio.to_thread(self.embedder.encode_with_norms, [query])
        req = self._request(experiment, unit_id, vecs[0], norms[0], started)
        return self._lookup_encoded(req, query, unit_id, namespace, scope)

    def ann_check_stats(self) -> dict | None:
        """The batched checker's counts (checks run, batches, drops by reason), if any."""
        return None if self.ann_checker is None else self.ann_checker.stats()

    def flush_events(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event handed to the executor so far has been emitted."""
        flush = getattr(self.event_executor, "flush", None)
        return True if flush is None else flush(timeout_s)

    def _lookup_encoded(self, req: _Request, query: str, unit_id: str, namespace: str,
                        scope: str | None) -> LookupResult:
        if req.arm_name == "holdout":
            return self._finish_bypass(req, query, unit_id, namespace)
        arm = req.experiment.arm(req.arm_name)
        partition = self._partition(namespace, req.experiment, arm)
        check_ann = self._sample(arm.ann_check_rate)
        if check_ann and self._backlog() >= MAX_CHECK_BACKLOG:
            check_ann = False
            if self.ann_checker is not None:
                self.ann_checker.count_drop("backlog")
        search_started = time.perf_counter()
        partition.lookup_waiting_since = search_started
        with partition.lock:
            partition.lookup_waiting_since = 0.0
            now = self.clock()
            outcome = partition.search(req.vec, scope, now)
            decision = self.hit_rule.decide(query, outcome.candidates, arm, req.cluster, req.variant)
            served, hit = decision.served, decision.hit
            if hit:
                partition.touch(served.entry, now)
            shown = served or outcome.best
            snapshot = self._entry_snapshot(shown, now)
        search_ms = (time.perf_counter() - search_started) * 1000
        record = _EventRecord(
            req=req, query=query, unit_id=unit_id, namespace=namespace,
            decision="hit" if hit else "miss", threshold=decision.threshold,
            similarity=shown.similarity if shown else None, index_kind=partition.spec.kind,
            search_ms=search_ms, guard=decision.guard, entry=snapshot, ts_ms=int(now * 1000),
            latency_ms=(time.perf_counter() - req.started) * 1000,
            similarity_mode=arm.similarity, score=decision.score, score_margin=decision.score_margin)
        if check_ann and outcome.raw:
            if self.ann_checker is None:
                record.check = (partition, scope, outcome.raw, outcome.mark)
            else:  # never blocks: a full checker drops the check (counted) and returns None
                record.check_future = self.ann_checker.submit(partition, scope, req.vec, outcome.raw,
                                                              outcome.mark)
        pending = self._hand_off(record)
        entry = served.entry if hit else None
        if entry is not None:
            self.served.remember(req.request_id, ServedHit(partition.key, req.experiment.experiment_id,
                                                           req.arm_name, entry.entry_id, unit_id))
        return LookupResult(
            request_id=req.request_id, decision=record.decision, hit=hit,
            answer=entry.answer if entry else None, similarity=record.similarity,
            threshold=decision.threshold, experiment_id=req.experiment.experiment_id, arm=req.arm_name,
            config_version=req.experiment.version, intent_cluster=req.cluster,
            entry_id=entry.entry_id if entry else None, pending=pending,
            provenance={"source": entry.provenance_source, "version": entry.provenance_version}
            if entry else None, variant=req.variant, guard=decision.guard,
            entry_age_s=snapshot["entry_age_s"], latency_ms=record.latency_ms,
            embed_ms=req.embed_ms, search_ms=search_ms, score=decision.score,
            score_margin=decision.score_margin,
        )

    def store(self, query: str, answer: str, unit_id: str, experiment_id: str | None = None,
              namespace: str = "default", scope: str | None = None, ttl_s: float | None = None,
              provenance_source: str = "", provenance_version: str = "") -> StoreResult:
        """Offer an answer for the partition of the unit's arm; admission by similarity tier."""
        item = StoreItem(query, answer, unit_id, experiment_id, namespace, scope, ttl_s,
                         provenance_source, provenance_version)
        return self.store_many([item])[0][0]

    def store_many(self, items: Sequence[StoreItem], *, every_arm: bool = False) -> list[list[StoreResult]]:
        """``store`` for many items: encoded in one batch, made durable with one sync.

        Per item, a list of results: one for the unit's arm, or with ``every_arm`` one per
        store of the experiment (each arm's own, or the shared one), so that seeding a cache
        warms every arm alike rather than the seeding unit's arm only. Every item is checked
        first: a bad one (InvalidRequest naming its index, UnknownExperiment) stores nothing."""
        experiments = [self._checked(n, item, len(items)) for n, item in enumerate(items)]
        started = time.perf_counter()
        vecs, norms = self.embedder.encode_with_norms([item.query for item in items])
        results: list[list[StoreResult]] = []
        stored: list[tuple[Partition, CacheEntry]] = []
        for item, experiment, vec, norm in zip(items, experiments, vecs, norms):
            requests = self._store_requests(experiment, item.unit_id, vec, norm, started, every_arm)
            results.append([self._store_one(req, item, stored) for req in requests])
        if stored:
            self.sync_journal()  # acknowledged = durable: fsync before the caller hears "stored"
            if self.entry_feed is not None:
                for partition, entry in stored:
                    self.entry_feed.stored(partition.key, entry)
        return results

    def _checked(self, n: int, item: StoreItem, count: int) -> ExperimentConfig:
        """The experiment ``item`` stores into, after checking its fields."""
        try:
            self._check_query(item.query, item.unit_id, item.namespace, item.scope)
            self._check_answer(item.answer, item.ttl_s)
        except InvalidRequest as exc:
            raise InvalidRequest(f"item {n}: {exc}" if count > 1 else str(exc)) from None
        return self.registry.get(item.experiment_id)  # one snapshot for the whole item

    def _store_requests(self, experiment: ExperimentConfig, unit_id: str, vec: np.ndarray, norm: float,
                        started: float, every_arm: bool) -> list[_Request]:
        req = self._request(experiment, unit_id, vec, norm, started, update_clusters=False)
        if not every_arm:
            return [req]
        arms = experiment.arms[:1] if experiment.partition_mode == "shared" else experiment.arms
        probabilities = experiment.arm_probabilities()
        return [replace(req, arm_name=arm.name, assignment_prob=probabilities[arm.name], variant="base")
                for arm in arms]

    def _store_one(self, req: _Request, item: StoreItem, stored: list) -> StoreResult:
        """Admit ``item`` into ``req``'s store; a stored entry is appended to ``stored``."""
        result = StoreResult(stored=False, reason="holdout", experiment_id=req.experiment.experiment_id,
                             arm=req.arm_name, config_version=req.experiment.version,
                             intent_cluster=req.cluster)
        if req.arm_name == HOLDOUT_ARM:
            return result
        arm = req.experiment.arm(req.arm_name)
        with self._live(lambda: self._partition(item.namespace, req.experiment, arm)) as partition:
            now = self.clock()
            entry = self._new_entry(req, arm, item.query, item.answer, item.namespace, item.scope, item.ttl_s,
                                    now, item.provenance_source, item.provenance_version)
            result = self._admit(partition, entry, result, now)
        if result.stored:
            stored.append((partition, entry))
        return result

    def clear_namespace(self, namespace: str) -> int:
        """Remove every entry of ``namespace`` (all experiments and arms); returns how many."""
        cleared_at = self.clock()
        with self._partitions_lock:
            doomed = [key for key in self._partitions if key[0] == namespace]
            partitions = [self._partitions.pop(key) for key in doomed]
        removed = 0
        for partition in partitions:
            with partition.lock:
                partition.retired = True
                removed += len(partition)
                partition.journal = None  # one "clear" record stands for all these removals
                partition.entries.clear()
                partition.indexes.clear()
                partition.by_text.clear()
                partition.bytes = 0
        if self.journal is not None:
            self.journal.record_clear(namespace)
            self.journal.sync()
        if self.entry_feed is not None:
            self.entry_feed.cleared(namespace, cleared_at)
        return removed

    def purge(self, namespace: str, match: EntryMatch) -> int:
        """Remove the entries of ``namespace`` (every experiment and arm) that ``match`` names:
        the answers of a source (and version) that changed, or one question's answers.
        Replicated like a clear: the other replicas remove what matches and was created
        before now. Returns how many were removed here."""
        purged_at = self.clock()
        removed = self._remove_in_namespace(namespace, lambda e: match.matches(e) and e.created_at <= purged_at)
        if self.entry_feed is not None:
            self.entry_feed.purged(namespace, purged_at, match)
        return removed

    # -- feedback (cache_core.state.feedback) --------------------------------------------------

    def apply_feedback(self, request_id: str, verdict: Verdict) -> str:
        """Count a verdict on a hit served here; at the arm's ``invalidate_after_wrong``
        units saying "wrong" (counted across replicas: with replication a vote that does not
        remove the entry goes to the others, ``apply_replicated_vote``) the entry is removed
        here and (a drop) on the other replicas. Returns the outcome (cache_core.state.feedback.OUTCOMES); those of hits served
        here are counted per experiment and arm in ``feedback_outcomes``. "unknown" is not:
        every replica sees every verdict, most of them on the others' hits."""
        hit = self.served.settle(request_id)
        if hit is None:
            return "unknown"
        outcome = self._judge(hit, request_id, verdict)
        with self._feedback_lock:
            counted = (hit.experiment_id, hit.arm, outcome)
            self.feedback_outcomes[counted] = self.feedback_outcomes.get(counted, 0) + 1
        return outcome

    def _judge(self, hit: ServedHit, request_id: str, verdict: Verdict) -> str:
        if verdict != "wrong":
            return "correct"
        limit = self._invalidate_after(hit.experiment_id, hit.arm)
        partition = self._partitions.get(hit.key)
        if partition is None:
            return "gone"
        with partition.lock:
            if hit.entry_id not in partition.entries:
                return "gone"
            if not limit:
                return "kept"  # never removed, so not counted: its set, the log and the topic stay small
            entry, new_vote = partition.vote(hit.entry_id, hit.unit_id)
            invalidated = len(entry.wrong_units) >= limit
            if invalidated:
                partition.remove(hit.entry_id)
                self._note_dropped(hit.entry_id)
        if not invalidated:
            if new_vote:  # durable before the 202, like a store: a crash must not forget the unit
                self.sync_journal()
            # The other replicas count it too (their own hits' votes come back the same way),
            # so the arm's limit is reached by units served anywhere, not per replica.
            if new_vote and self.entry_feed is not None:
                self.entry_feed.voted(hit.key, hit.entry_id, hit.unit_id, hit.arm)
            return "counted"
        self.sync_journal()
        log_invalidation(hit, request_id, len(entry.wrong_units))
        if self.entry_feed is not None:
            self.entry_feed.dropped(hit.key, hit.entry_id)
        return "invalidated"

    def _invalidate_after(self, experiment_id: str, arm: str) -> int:
        """The arm's ``invalidate_after_wrong`` as configured now (1 if the arm is gone)."""
        try:
            return self.registry.get(experiment_id).arm(arm).invalidate_after_wrong
        except (KeyError, UnknownExperiment):
            return ArmConfig(name="gone").invalidate_after_wrong

    # -- replication (cache_core.state.replication) -------------------------------------------

    def apply_replicated(self, key: tuple[str, str, str], entry: CacheEntry) -> str:
        """Insert an entry another replica admitted, into the store of the same key (so arms
        stay apart). Its admission tier was decided there; this replica's capacity and LRU
        still apply. Returns the outcome: applied, duplicate, stale, expired, too_large or
        dropped_before (feedback took this entry out here already)."""
        if not entry.alive(self.clock()):
            return "expired"
        if entry.entry_id in self._dropped_ids:
            return "dropped_before"
        with self._live(lambda: self._partition_by_key(key)) as partition:
            now = self.clock()
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

    def apply_replicated_clear(self, namespace: str, cleared_at: float) -> int:
        """Remove the entries of ``namespace`` created before ``cleared_at`` (a clear made on
        another replica; what was stored after it survives). Returns how many."""
        return self._remove_in_namespace(namespace, lambda e: e.created_at < cleared_at)

    def apply_replicated_purge(self, namespace: str, purged_at: float, match: EntryMatch) -> int:
        """Remove the entries of ``namespace`` that ``match`` names and that were created
        before ``purged_at`` (a purge made on another replica). Returns how many."""
        return self._remove_in_namespace(namespace, lambda e: match.matches(e) and e.created_at < purged_at)

    def apply_replicated_drop(self, key: tuple[str, str, str], entry_id: str) -> bool:
        """Remove an entry another replica invalidated (False: not here)."""
        self._note_dropped(entry_id)  # also when not here yet: its put may still be on its way
        partition = self._partitions.get(key)
        if partition is None:
            return False
        with partition.lock:
            removed = partition.remove(entry_id) is not None
        if removed:
            self.sync_journal()
        return removed

    def apply_replicated_vote(self, key: tuple[str, str, str], entry_id: str, unit_id: str,
                              experiment_id: str, arm: str) -> str:
        """Count a "wrong" verdict another replica resolved (or this one's, come back): at the
        serving arm's ``invalidate_after_wrong`` units the entry is removed here, durably. No drop
        is sent: every replica counts the same votes. Returns "votes" (counted), "voted_out"
        (removed now) or "duplicate" (the unit counted already, or the entry is not here)."""
        partition = self._partitions.get(key)
        if partition is None:
            return "duplicate"
        limit = self._invalidate_after(experiment_id, arm)
        with partition.lock:
            entry, new_vote = partition.vote(entry_id, unit_id)
            if not new_vote:
                return "duplicate"
            if not limit or len(entry.wrong_units) < limit:
                return "votes"
            partition.remove(entry_id)
            self._note_dropped(entry_id)
        self.sync_journal()
        log.info("entry invalidated by feedback votes", extra={
            "namespace": key[0], "experiment_id": experiment_id, "arm": arm, "entry_id": entry_id,
            "wrong_units": len(entry.wrong_units)})
        return "voted_out"

    def _note_dropped(self, entry_id: str) -> None:
        with self._dropped_lock:
            self._dropped_ids[entry_id] = None
            while len(self._dropped_ids) > DROPPED_IDS_REMEMBERED:
                self._dropped_ids.popitem(last=False)

    def sync_journal(self) -> None:
        """Make every change logged so far durable (no-op without persistence)."""
        if self.journal is not None:
            self.journal.sync()

    # -- persistence (cache_core.state.persistence) ------------------------------------------

    def attach_journal(self, journal) -> None:
        """Log every later insert/removal of every partition (existing and new) to ``journal``."""
        with self._partitions_lock:
            self.journal = journal
            for partition in self._partitions.values():
                partition.journal = journal

    def restore_put(self, key: tuple[str, str, str], entry: CacheEntry) -> None:
        """Re-insert a persisted entry as it was (no admission tiers, no eviction)."""
        partition = self._partition_by_key(key)
        with partition.lock:
            partition.insert(entry)

    def restore_remove(self, key: tuple[str, str, str], entry_id: str) -> None:
        partition = self._partitions.get(key)
        if partition is not None:
            with partition.lock:
                partition.remove(entry_id)

    def restore_vote(self, key: tuple[str, str, str], entry_id: str, unit_id: str) -> None:
        partition = self._partitions.get(key)
        if partition is not None:
            with partition.lock:
                partition.vote(entry_id, unit_id)

    def restore_clear(self, namespace: str) -> None:
        with self._partitions_lock:
            for key in [k for k in self._partitions if k[0] == namespace]:
                del self._partitions[key]

    def drop_expired(self) -> int:
        """Remove entries that are no longer alive (after a restore); returns how many."""
        now = self.clock()
        return self._remove_where(lambda e: not e.alive(now), self.partitions())

    def _remove_in_namespace(self, namespace: str, matches: Callable[[CacheEntry], bool]) -> int:
        """Remove the entries of ``namespace`` that ``matches``, durably; returns how many."""
        removed = self._remove_where(matches, [p for p in self.partitions() if p.key[0] == namespace])
        self.sync_journal()
        return removed

    @staticmethod
    def _remove_where(matches: Callable[[CacheEntry], bool], partitions: list[Partition]) -> int:
        """Remove the entries of ``partitions`` that ``matches``; returns how many."""
        removed = 0
        for partition in partitions:
            with partition.lock:
                for entry_id in [e.entry_id for e in partition.entries.values() if matches(e)]:
                    partition.remove(entry_id)
                    removed += 1
        return removed

    def _partition_by_key(self, key: tuple[str, str, str]) -> Partition:
        """The partition for a persisted key; its layout follows the experiment in force
        if it is still configured (``_partition`` re-aligns it on the next request)."""
        with self._partitions_lock:
            partition = self._partitions.get(key)
            if partition is not None:
                return partition
        namespace, experiment_id, arm_key = key
        try:
            experiment = self.registry.get(experiment_id)
            arm = experiment.arms[0] if arm_key == SHARED_ARM else experiment.arm(arm_key)
        except (KeyError, UnknownExperiment):
            arm = ArmConfig(name="restored")
        spec = IndexSpec.for_arm(arm)
        with self._partitions_lock:
            partition = self._partitions.setdefault(key, Partition(
                key, self.embedder.dim, spec, arm.capacity_entries, arm.capacity_bytes))
            partition.journal = self.journal
            return partition

    def partition_for(self, namespace: str, experiment_id: str, arm: str) -> Partition | None:
        """The store a (namespace, experiment, arm) reads from, if it exists yet."""
        experiment = self.registry.get(experiment_id)
        arm_key = SHARED_ARM if experiment.partition_mode == "shared" else arm
        return self._partitions.get((namespace, experiment_id, arm_key))

    def partitions(self) -> list[Partition]:
        with self._partitions_lock:
            return list(self._partitions.values())

    @contextmanager
    def _live(self, get: Callable[[], Partition]) -> Iterator[Partition]:
        """``get()``'s partition with its lock held. One that a clear or ``retire_idle_stores``
        took out of the map meanwhile is fetched again: an insert into it would be acknowledged
        and logged, yet served by nothing."""
        while True:
            partition = get()
            with partition.lock:
                if not partition.retired:
                    yield partition
                    return

    def retire_idle_stores(self) -> int:
        """Take the stores that are empty and that no insert or removal touched since the
        last call out of the map; returns how many. Without this a namespace or experiment
        no one uses any more kept its stores, indexes and two metric series each for the life
        of the process (bench/soak.py: one more store per short-lived namespace). A request
        for the key later makes a new store."""
        with self._partitions_lock:
            candidates = list(self._partitions.items())
        retired = 0
        for key, partition in candidates:
            seen, self._idle_marks[key] = self._idle_marks.get(key), partition.mutations
            if len(partition) or seen != partition.mutations:
                continue
            with partition.lock:
                if len(partition) or partition.mutations != seen:
                    continue
                with self._partitions_lock:
                    if self._partitions.get(key) is partition:
                        del self._partitions[key]
                        partition.retired = True
                        retired += 1
        with self._partitions_lock:
            for key in [k for k in self._idle_marks if k not in self._partitions]:
                del self._idle_marks[key]
        return retired

    # -- preparation ------------------------------------------------------------------

    def _check_query(self, query: str, unit_id: str, namespace: str, scope: str | None) -> None:
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query must be a non-empty string")
        if len(query) > self.max_query_chars:
            raise InvalidRequest(f"query has {len(query)} characters; the limit is {self.max_query_chars}")
        if not isinstance(unit_id, str) or not unit_id:
            raise InvalidRequest("unit_id must be a non-empty string")
        if not namespace:
            raise InvalidRequest("namespace must be a non-empty string")
        if scope is not None and not scope:
            raise InvalidRequest("scope, when given, must be a non-empty string")

    def _check_answer(self, answer: str, ttl_s: float | None) -> None:
        if not isinstance(answer, str) or not answer.strip():
            raise InvalidRequest("answer must be a non-empty string")
        if len(answer) > self.max_answer_chars:
            raise InvalidRequest(f"answer has {len(answer)} characters; the limit is {self.max_answer_chars}")
        if ttl_s is not None and not ttl_s > 0:
            raise InvalidRequest(f"ttl_s must be positive, got {ttl_s}")

    def _request(self, experiment: ExperimentConfig, unit_id: str, vec: np.ndarray, norm: float,
                 started: float, update_clusters: bool = True) -> _Request:
        embed_ms = (time.perf_counter() - started) * 1000
        assignment = assign(experiment, unit_id)
        return _Request(experiment=experiment, arm_name=assignment.arm,
                        assignment_prob=assignment.probability, vec=vec, l2_norm=float(norm),
                        cluster=self.clusters.assign(vec, update=update_clusters),
                        embed_ms=embed_ms, started=started, variant=assignment.variant)

    def _partition(self, namespace: str, experiment: ExperimentConfig, arm: ArmConfig) -> Partition:
        shared = experiment.partition_mode == "shared"
        key = (namespace, experiment.experiment_id, SHARED_ARM if shared else arm.name)
        known = self._partitions.get(key)
        if known is not None and known.applied is experiment:
            return known  # aligned to this very snapshot already: no lock, no rebuild check
        # A shared store follows its experiment's first arm for structure and the
        # largest capacity of its arms, since every arm fills it.
        layout = experiment.arms[0] if shared else arm
        arms = experiment.arms if shared else [arm]
        spec = IndexSpec.for_arm(layout)
        cap_entries = max(a.capacity_entries for a in arms)
        cap_bytes = max(a.capacity_bytes for a in arms)
        with self._partitions_lock:
            partition = self._partitions.get(key)
            if partition is None:
                partition = Partition(key, self.embedder.dim, spec, cap_entries, cap_bytes)
                partition.journal = self.journal
                self._partitions[key] = partition
        with partition.lock:
            partition.reconfigure(spec, cap_entries, cap_bytes)
            partition.applied = experiment
        return partition

    def _backlog(self) -> int:
        backlog = getattr(self.event_executor, "backlog", None)
        return 0 if backlog is None else backlog()

    def _sample(self, rate: float) -> bool:
        with self._rng_lock:
            return self._rng.random() < rate

    # -- admission --------------------------------------------------------------------

    def _new_entry(self, req: _Request, arm: ArmConfig, query: str, answer: str, namespace: str,
                   scope: str | None, ttl_s: float | None, now: float,
                   provenance_source: str, provenance_version: str) -> CacheEntry:
        if ttl_s is None:
            explicit = "ttl_s" in arm.model_fields_set
            ttl_s = arm.ttl_s if explicit or self.default_ttl_s is None else self.default_ttl_s
        vec = req.vec.copy()
        return CacheEntry(
            entry_id=uuid.uuid4().hex, query=query, embedding=vec, answer=answer, created_at=now,
            ttl_s=float(ttl_s), ttl_policy=arm.ttl_policy, max_age_s=arm.max_age_s,
            namespace=namespace, intent_cluster=req.cluster, scope=scope,
            provenance_source=provenance_source, provenance_version=provenance_version,
            approx_bytes=entry_bytes(query, answer, vec),
        )

    def _admit(self, partition: Partition, entry: CacheEntry, result: StoreResult,
               now: float) -> StoreResult:
        if entry.approx_bytes > partition.capacity_bytes:
            result.reason = "too_large"
            return result
        same = partition.existing_same_text(entry.scope, entry.query)
        if same is not None:
            partition.remove(same.entry_id)
            return self._insert(partition, entry, result, "updated", 1.0, now)
        nearest = partition.nearest_alive(entry.embedding, entry.scope, now)
        similarity = nearest.similarity if nearest else None
        result.similarity = similarity
        if similarity is not None and similarity >= NEAR_DUPLICATE_SIM:
            entry.grace_s, entry.protected = EVICTION_GRACE_S, True
            return self._insert(partition, entry, result, "near_duplicate", similarity, now)
        if similarity is not None and similarity < NOVEL_SIM:
            if not partition.has_room(entry.approx_bytes):
                partition.drop_expired_lru(now)
            if not partition.has_room(entry.approx_bytes):
                result.reason = "novel_under_pressure"
                return result
        return self._insert(partition, entry, result, "admitted", similarity, now)

    @staticmethod
    def _insert(partition: Partition, entry: CacheEntry, result: StoreResult, reason: str,
                similarity: float | None, now: float) -> StoreResult:
        partition.evict_for(entry.approx_bytes, now)
        partition.insert(entry)
        result.stored, result.reason, result.entry_id = True, reason, entry.entry_id
        result.similarity = similarity
        return result

    # -- events -----------------------------------------------------------------------

    @staticmethod
    def _entry_snapshot(best: Candidate | None, now: float) -> dict:
        if best is None:
            return {"entry_id": None, "entry_age_s": None, "entry_ttl_s": None}
        entry = best.entry
        return {"entry_id": entry.entry_id, "entry_age_s": max(0.0, now - entry.created_at),
                "entry_ttl_s": entry.expires_at() - entry.created_at}

    def _finish_bypass(self, req: _Request, query: str, unit_id: str, namespace: str) -> LookupResult:
        latency_ms = (time.perf_counter() - req.started) * 1000
        record = _EventRecord(
            req=req, query=query, unit_id=unit_id, namespace=namespace, decision="bypass",
            threshold=None, similarity=None, index_kind="none", search_ms=0.0, guard=None,
            entry=self._entry_snapshot(None, 0.0), ts_ms=int(self.clock() * 1000),
            latency_ms=latency_ms)
        return LookupResult(
            request_id=req.request_id, decision="bypass", hit=False, answer=None, similarity=None,
            threshold=None, experiment_id=req.experiment.experiment_id, arm=req.arm_name,
            config_version=req.experiment.version, intent_cluster=req.cluster, entry_id=None,
            pending=self._hand_off(record), variant=req.variant, latency_ms=latency_ms,
            embed_ms=req.embed_ms,
        )

    def _hand_off(self, record: _EventRecord) -> PendingEvent:
        pending = PendingEvent()
        self.event_executor.submit(lambda: self._finish_event(record, pending))
        return pending

    def _finish_event(self, record: _EventRecord, pending: PendingEvent) -> None:
        """Run the sampled ANN check (if any), build the event, emit it (executor side)."""
        outcome = SearchOutcome(best=None)
        if record.check is not None:
            partition, scope, raw, mark = record.check
            try:
                outcome = partition.ann_check(record.req.vec, scope, raw, mark)
            except Exception:  # a failed check must not cost the event; it stays unchecked
                log.exception("ANN check failed", extra={"request_id": record.req.request_id})
        elif record.check_future is not None:
            # Events leave in order, so this wait holds the ones behind it: past half the
            # backlog at which sampling stops, the batch runs now rather than at its deadline.
            outcome = self.ann_checker.wait(
                record.check_future, hurry=lambda: self._backlog() >= MAX_CHECK_BACKLOG // 2) or outcome
        event = self._event(record, outcome)
        pending.set(event)
        self._emit(event)

    def _event(self, record: _EventRecord, outcome: SearchOutcome) -> CacheEvent:
        req = record.req
        return CacheEvent(
            request_id=req.request_id, ts_ms=record.ts_ms, instance_id=self.instance_id,
            namespace=record.namespace, experiment_id=req.experiment.experiment_id,
            arm=req.arm_name, unit_id=record.unit_id, assignment_prob=req.assignment_prob,
            partition_mode=req.experiment.partition_mode, config_version=req.experiment.version,
            variant=req.variant, guard=record.guard, decision=record.decision,
            hit=record.decision == "hit", threshold=record.threshold, similarity=record.similarity,
            similarity_mode=record.similarity_mode, score=record.score,
            score_margin=record.score_margin,
            intent_cluster=req.cluster, embedding_l2_norm=req.l2_norm, **record.entry,
            index_kind=record.index_kind, ann_checked=outcome.ann_checked,
            ann_agree=outcome.ann_agree, ann_recall_at_k=outcome.ann_recall_at_k,
            embed_ms=req.embed_ms, search_ms=record.search_ms, latency_ms=record.latency_ms,
            query_chars=len(record.query),
            query_text=record.query if self.emit_query_text else None,
        )

    def _emit(self, event: CacheEvent) -> None:
        if self.event_sink is not None:
            self.event_sink(event)
