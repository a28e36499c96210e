"""SemanticCache: embed -> search -> decide -> admit -> emit.

A lookup embeds the query (cache_core.embedding), assigns the unit its arm
(cache_core.experiments), searches the arm's store (cache_core.store: which store is
``store.stores``, the search ``store.partition``), lets the hit rule decide
(cache_core.decision), and hands the decision to the event emitter (cache_core.emit),
which finishes the event after the answer has left. Holdout units bypass the cache. A
store is admitted by similarity tier (cache_core.admission) with a lifetime by the arm's
ttl policy (cache_core.lifetime). Persistence, replication and feedback change the
contents through one interface, ``apply`` (cache_core.state.changes).

The event's ``similarity`` is the cosine of the entry served (or of the nearest); on a
multi arm its ``score`` / ``score_margin`` carry the best-ranked candidate's mixed score
and its lead over the best candidate with another answer, so that a multi arm's
thresholds can be re-evaluated offline.

Over 500 lines because ``SemanticCache`` is the facade every caller goes through (its class
docstring says why it stays one class); it is nearly all of the module.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from cache_core import admission
from cache_core.adaptive_ttl import AdaptiveLifetimes
from cache_core.clusters import OnlineClusters
from cache_core.decision.judge import judge_config
from cache_core.decision.rule import HitRule
from cache_core.emit import MAX_CHECK_BACKLOG, EventEmitter, EventSink, LookupRecord, entry_snapshot
from cache_core.embedding.cache import CachedEmbedding, EmbeddingCache
from cache_core.embedding.embedder import Embedder
from cache_core.events import Verdict
from cache_core.experiments import HOLDOUT_ARM, ExperimentConfig, assign
from cache_core.registry import ExperimentRegistry
from cache_core.state.changes import Origin, StateApplier, StateChange, Vote
from cache_core.decision.error_bound import Judged
from cache_core.state.feedback import ServedHit, ServedHits
from cache_core.state.learning import LookupsToLearnFrom
from cache_core.store.factory import Backends
from cache_core.store.partition import Partition
from cache_core.store.stores import Stores
from cache_core.tracing import OFF, Tracing, annotate
from cache_core.records import (CacheEntry, EntryMatch, InvalidRequest, LookupResult, Request, StoreItem,
                              StoreResult)

Clock = Callable[[], float]

INLINE_MAX_CHARS = 2000
"""A lone lookup's query up to this long may be encoded in the event loop (``lookup_async``)."""


class SemanticCache:
    """The online cache: ``lookup`` decides and emits one event; ``store`` admits.

    Events are finished by ``event_executor`` (default: inline, in the caller; the
    service passes a ``cache_core.publish.event_worker.EventWorker`` so that the event,
    metrics and a sampled ANN-vs-exact check run after the answer has left).

    ``ann_checker`` (a ``cache_core.store.ann_check.AnnChecker``, optional) batches the sampled
    checks; without it each one scans alone in the executor. The event waits for its
    batch (up to the checker's ``max_wait_ms``), so give it a background executor only.

    Why one class of ~450 lines: it is the facade every caller (service, replicas, journal,
    benches) holds, and its methods are short hand-offs to the rooms that do the work (search
    in ``store``, the hit rule in ``decision``, events in ``emit``, state in ``state``). What
    stays here is the lookup and store sequence and the input checks at its door; split by
    operation, each piece would need the same registry, stores and emitter passed around."""

    def __init__(self, embedder: Embedder, registry: ExperimentRegistry, *,
                 clock: Clock = time.time, event_sink: EventSink | None = None,
                 instance_id: str = "",
                 default_ttl_s: float | None = None, max_query_chars: int = 4000,
                 max_answer_chars: int = 100_000, emit_query_text: bool = False,
                 cluster_radius: float = 0.55, seed: int | None = None,
                 event_executor=None, ann_checker=None, feedback_memory: int = 100_000,
                 hit_rule: HitRule | None = None, embedding_cache: EmbeddingCache | None = None,
                 backends: Backends | None = None, tracing: Tracing = OFF):
        self.embedder = embedder
        self.tracing = tracing
        """Spans of the lookup path (cache_core.tracing; off by default)."""
        self.embedding_cache = embedding_cache
        """Exact-text LRU in front of ``embedder`` (None: every text is encoded)."""
        self.lifetimes = AdaptiveLifetimes()
        """The adaptive TTL policy's state per store (cache_core.adaptive_ttl)."""
        self.registry = registry
        self.clock = clock
        self.default_ttl_s = default_ttl_s
        self.max_query_chars = max_query_chars
        self.max_answer_chars = max_answer_chars
        self.ann_checker = ann_checker
        self.emitter = EventEmitter(executor=event_executor, sink=event_sink, instance_id=instance_id,
                                    emit_query_text=emit_query_text, ann_checker=ann_checker, tracing=tracing)
        self.clusters = OnlineClusters(embedder.dim, radius=cluster_radius)
        self.hit_rule = hit_rule or HitRule()
        """Decides every lookup (cache_core.decision)."""
        self.stores = Stores(embedder.dim, registry, backends)
        self.state = StateApplier(self)
        self.served = ServedHits(feedback_memory)
        """Recent hits by request id, for feedback (``apply_feedback``)."""
        self.learnable = LookupsToLearnFrom(feedback_memory)
        """Recent lookups of error-bounded arms by request id, for their verdicts (``learn``)."""
        self.feedback_outcomes: dict[tuple[str, str, str], int] = {}
        """(experiment, arm, outcome) -> verdicts on the hits served here."""
        self._feedback_lock = threading.Lock()
        self._async_lookups = 0
        """``lookup_async`` calls in flight (on the event loop)."""
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.journal = None
        """Set by ``attach_journal`` (cache_core.state.persistence): every change is logged."""
        self.entry_feed = None
        """Optional (``cache_core.state.replication.EntryFeed``): told of every stored entry and
        namespace clear, after they are durable, for the other replicas."""

    # -- lookup -------------------------------------------------------------------------

    def lookup(self, query: str, unit_id: str, experiment_id: str | None = None,
               namespace: str = "default", scope: str | None = None) -> LookupResult:
        """Decide hit / miss / bypass for ``query``; exactly one event per call.

        Raises InvalidRequest (bad query or ids) and UnknownExperiment.
        """
        with self.tracing.span("scache.lookup", {"scache.namespace": namespace}) as span:
            self._check_query(query, unit_id, namespace, scope)
            started = time.perf_counter()
            experiment = self.registry.get(experiment_id)  # one snapshot for the whole request
            cached = self._cached_embedding(query)
            if cached is not None:
                return _traced(span, self._lookup_encoded(self._request_cached(experiment, unit_id, cached, started),
                                                          query, unit_id, namespace, scope))
            with self.tracing.span("scache.embed"):
                vecs, norms = self.embedder.encode_with_norms([query])
            self._remember([query], vecs, norms, started)
            req = self._request(experiment, unit_id, vecs[0], norms[0], started)
            return _traced(span, self._lookup_encoded(req, query, unit_id, namespace, scope))

    async def lookup_async(self, query: str, unit_id: str, experiment_id: str | None = None,
                           namespace: str = "default", scope: str | None = None) -> LookupResult:
        """``lookup`` for an event loop: awaits the encoder instead of holding a thread.

        The decision after the encode is short (search under the partition lock) and
        runs in the loop. A lookup alone in flight, with the encoder's workers idle, encodes in the
        loop itself (``BatchingEncoder.encode_now``, a query of at most ``INLINE_MAX_CHARS``): the
        loop has nothing else to do meanwhile."""
        self._async_lookups += 1
        try:
            return await self._lookup_async(query, unit_id, experiment_id, namespace, scope)
        finally:
            self._async_lookups -= 1

    async def _lookup_async(self, query: str, unit_id: str, experiment_id: str | None,
                            namespace: str, scope: str | None) -> LookupResult:
        with self.tracing.span("scache.lookup", {"scache.namespace": namespace}) as span:
            self._check_query(query, unit_id, namespace, scope)
            started = time.perf_counter()
            experiment = self.registry.get(experiment_id)
            cached = self._cached_embedding(query)
            if cached is not None:
                return _traced(span, self._lookup_encoded(self._request_cached(experiment, unit_id, cached, started),
                                                          query, unit_id, namespace, scope))
            submit = getattr(self.embedder, "submit", None)
            with self.tracing.span("scache.embed"):
                encoded = None
                if self._async_lookups == 1 and len(query) <= INLINE_MAX_CHARS and hasattr(self.embedder, "encode_now"):
                    # requests that arrived with it start first (else each would be alone in turn, all
                    # encoded one by one in the loop, the workers idle)
                    await asyncio.sleep(0)
                    if self._async_lookups == 1:  # alone, and the encoder idle: encode here
                        encoded = self.embedder.encode_now([query])
                if encoded is not None:
                    vecs, norms = encoded
                elif submit is not None:
                    vecs, norms = await asyncio.wrap_future(submit([query]))
                else:
                    vecs, norms = await asyncio.to_thread(self.embedder.encode_with_norms, [query])
            self._remember([query], vecs, norms, started)
            req = self._request(experiment, unit_id, vecs[0], norms[0], started)
            return _traced(span, self._lookup_encoded(req, query, unit_id, namespace, scope))

    def _lookup_encoded(self, req: Request, query: str, unit_id: str, namespace: str,
                        scope: str | None) -> LookupResult:
        if req.arm_name == HOLDOUT_ARM:
            record = LookupRecord(
                req=req, query=query, unit_id=unit_id, namespace=namespace, decision="bypass",
                threshold=None, similarity=None, index_kind="none", search_ms=0.0, guard=None,
                entry=entry_snapshot(None, 0.0), ts_ms=int(self.clock() * 1000),
                latency_ms=(time.perf_counter() - req.started) * 1000)
            return record.result(self.emitter.hand_off(record))
        arm = req.experiment.arm(req.arm_name)
        partition = self.stores.for_arm(namespace, req.experiment, arm)
        check_ann = self._sample(arm.ann_check_rate) and self._ann_check_admitted()
        search_started = time.perf_counter()
        partition.lookup_waiting_since = search_started
        judged = judge_config(arm, req.variant) is not None
        tracing = self.tracing
        with partition.lock:
            partition.lookup_waiting_since = 0.0
            now = self.clock()
            with tracing.span("scache.search", {"scache.index_kind": partition.spec.kind}) as span:
                outcome = partition.search(req.vec, scope, now)
                annotate(span, candidates=len(outcome.candidates))
            if not judged:
                with tracing.span("scache.decide"):
                    decision = self.hit_rule.decide(query, outcome.candidates, arm, req.cluster, req.variant,
                                                    experiment_id=req.experiment.experiment_id)
                ttl_fields, tier = self._touch(partition, decision, outcome, arm, now, req.vec, scope)
        if judged:  # a judge reads the encoder (milliseconds): not while holding the store's lock
            with tracing.span("scache.decide"), tracing.span("scache.judge") as span:
                decision = self.hit_rule.decide(query, outcome.candidates, arm, req.cluster, req.variant,
                                                experiment_id=req.experiment.experiment_id)
                annotate(span, judge_version=decision.judge_version, judge_probability=decision.judge_probability)
            with partition.lock:
                ttl_fields, tier = self._touch(partition, decision, outcome, arm, now, req.vec, scope)
        shown = decision.served or outcome.best
        snapshot = entry_snapshot(shown, now)
        ask_rate = arm.feedback_sample_rate if decision.hit else 0.0  # a random sample of hits gets asked
        asked = ask_rate > 0 and self._sample(ask_rate)
        record = LookupRecord(
            req=req, query=query, unit_id=unit_id, namespace=namespace,
            decision="hit" if decision.hit else "miss", threshold=decision.threshold,
            similarity=shown.similarity if shown else None, index_kind=partition.spec.kind,
            search_ms=(time.perf_counter() - search_started) * 1000, guard=decision.guard, entry=snapshot,
            ts_ms=int(now * 1000), latency_ms=(time.perf_counter() - req.started) * 1000,
            similarity_mode=arm.similarity, score=decision.score, score_margin=decision.score_margin,
            judge_version=decision.judge_version, judge_probability=decision.judge_probability,
            judge_ms=decision.judge_ms, threshold_source=decision.threshold_source, ttl_fields=ttl_fields,
            tier=tier, feedback_requested=asked, feedback_prob=ask_rate if ask_rate > 0 else None)
        if check_ann and outcome.raw:
            if self.ann_checker is None:
                record.check = (partition, scope, outcome.raw, outcome.mark)
            else:  # never blocks: a full checker drops the check (counted) and returns None
                record.check_future = self.ann_checker.submit(partition, scope, req.vec, outcome.raw,
                                                              outcome.mark)
        pending = self.emitter.hand_off(record)
        served = decision.served.entry if decision.hit else None
        if decision.threshold_source is not None and shown is not None:  # an error-bounded arm
            self.learnable.remember(req.request_id, Judged(
                req.experiment.experiment_id, req.arm_name, shown.entry.entry_id, shown.entry.intent_cluster,
                float(shown.similarity), False), asked_at=ask_rate if asked else 0.0)
        if served is not None:
            self.served.remember(req.request_id, ServedHit(partition.key, req.experiment.experiment_id,
                                                           req.arm_name, served.entry_id, unit_id))
        return record.result(pending, served, nearest=shown.entry if shown is not None else None)

    def _touch(self, partition: Partition, decision, outcome, arm, now: float, vec=None,
               scope: str | None = None) -> tuple[dict, str | None]:
        """Under the store's lock, after the decision: the adaptive TTL learns from the lookup and
        renews the served entry's lifetime, then the served entry (if still there) is touched
        (promoted, if it was on disk). Returns the adaptive TTL's event fields (none on other arms)
        and the tier that served the hit ("memory" / "disk"; None on a miss)."""
        served = decision.served.entry if decision.hit else None
        if served is not None and not partition.holds(served.entry_id):
            served = None  # removed while a judge ran
        tier = None if served is None else "memory" if served.entry_id in partition.entries else "disk"
        ttl_fields = self.lifetimes.after_lookup(partition, arm, outcome, decision.threshold, served, now,
                                                 vec=vec, scope=scope)
        if served is not None:
            partition.touch(served, now)
        return ttl_fields, tier

    def ann_check_stats(self) -> dict | None:
        """The batched checker's counts (checks run, batches, drops by reason), if any."""
        return None if self.ann_checker is None else self.ann_checker.stats()

    def flush_events(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event handed to the executor so far has been emitted."""
        return self.emitter.flush(timeout_s)

    # -- store --------------------------------------------------------------------------

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
        with self.tracing.span("scache.store", {"scache.items": len(items)}) as span:
            experiments = [self._checked(n, item, len(items)) for n, item in enumerate(items)]
            started = time.perf_counter()
            with self.tracing.span("scache.embed"):
                vecs, norms = self._encode_many([item.query for item in items])
            results: list[list[StoreResult]] = []
            stored: list[tuple[Partition, CacheEntry, np.ndarray]] = []
            for item, experiment, vec, norm in zip(items, experiments, vecs, norms):
                req = self._request(experiment, item.unit_id, vec, norm, started, update_clusters=False)
                results.append([self._store_one(r, item, stored) for r in self._every_arm(req, every_arm)])
            annotate(span, stored=len(stored))
        if stored:
            self.sync_journal()  # acknowledged = durable: fsync before the caller hears "stored"
            if self.entry_feed is not None:
                for partition, entry, vec in stored:
                    self.entry_feed.stored(partition.key, entry, vec)
        return results

    def _checked(self, n: int, item: StoreItem, count: int) -> ExperimentConfig:
        """The experiment ``item`` stores into, after checking its fields."""
        try:
            self._check_query(item.query, item.unit_id, item.namespace, item.scope)
            self._check_answer(item.answer, item.ttl_s)
        except InvalidRequest as exc:
            raise InvalidRequest(f"item {n}: {exc}" if count > 1 else str(exc)) from None
        return self.registry.get(item.experiment_id)  # one snapshot for the whole item

    @staticmethod
    def _every_arm(req: Request, every_arm: bool) -> list[Request]:
        """``req``, or with ``every_arm`` one request per store of its experiment."""
        experiment = req.experiment
        if not every_arm:
            return [req]
        arms = experiment.arms[:1] if experiment.partition_mode == "shared" else experiment.arms
        probabilities = experiment.arm_probabilities()
        return [replace(req, arm_name=arm.name, assignment_prob=probabilities[arm.name], variant="base")
                for arm in arms]

    def _store_one(self, req: Request, item: StoreItem, stored: list) -> StoreResult:
        """Admit ``item`` into ``req``'s store; a stored entry is appended to ``stored``."""
        result = StoreResult(stored=False, reason="holdout", experiment_id=req.experiment.experiment_id,
                             arm=req.arm_name, config_version=req.experiment.version,
                             intent_cluster=req.cluster)
        if req.arm_name == HOLDOUT_ARM:
            return result
        arm = req.experiment.arm(req.arm_name)
        with self.stores.live(lambda: self.stores.for_arm(item.namespace, req.experiment, arm)) as partition:
            now = self.clock()
            entry = admission.new_entry(item, arm, req.vec, req.cluster, now, self.default_ttl_s)
            self.lifetimes.on_store(partition, arm, entry, item.ttl_s is not None, now)
            result = admission.admit(partition, entry, result, now)
        if result.stored:  # with the vector: a compressed store's entry keeps none
            stored.append((partition, entry, req.vec))
        return result

    # -- removal ------------------------------------------------------------------------

    def clear_namespace(self, namespace: str) -> int:
        """Remove every entry of ``namespace`` (all experiments and arms); returns how many."""
        cleared_at = self.clock()
        removed = self.stores.take_namespace(namespace)
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
        removed = self.stores.remove_where(lambda e: match.matches(e) and e.created_at <= purged_at, namespace)
        self.sync_journal()
        if self.entry_feed is not None:
            self.entry_feed.purged(namespace, purged_at, match)
        return removed

    def drop_expired(self) -> int:
        """Remove entries that are no longer alive (after a restore, and by the sweeper)."""
        now = self.clock()
        swept = self.stores.remove_where(lambda e: not e.alive(now), cold=False, on_removed=self.lifetimes.expired)
        return swept + self.stores.drop_expired_cold(now)

    # -- state changes: persistence, replication, feedback (cache_core.state) -----------

    def apply(self, change: StateChange, origin: Origin) -> str:
        """Apply a change from this replica's log, another replica or a verdict; its outcome."""
        return self.state.apply(change, origin)

    def apply_feedback(self, request_id: str, verdict: Verdict) -> str:
        """Count a verdict on a hit served here (cache_core.state.feedback). Returns the outcome
        (cache_core.state.feedback.OUTCOMES); those of hits served here are counted per experiment
        and arm in ``feedback_outcomes``. "unknown" is not: every replica sees every verdict,
        most of them on the others' hits."""
        hit = self.served.settle(request_id)
        if hit is None:
            return "unknown"
        outcome = "correct" if verdict != "wrong" else self.apply(
            Vote(hit.key, hit.entry_id, hit.unit_id, hit.experiment_id, hit.arm, request_id), "local")
        with self._feedback_lock:
            counted = (hit.experiment_id, hit.arm, outcome)
            self.feedback_outcomes[counted] = self.feedback_outcomes.get(counted, 0) + 1
        return outcome

    def learn(self, request_id: str, verdict: Verdict) -> str:
        """Teach an error-bounded arm a verdict (user or shadow) on one of its lookups made here
        (cache_core.state.learning): "judged", or "unknown" (not such a lookup of this replica's,
        or judged already)."""
        judged = self.learnable.judged(request_id, verdict == "wrong")
        return "unknown" if judged is None else self.apply(judged, "local")

    def checked(self, request_id: str, check_prob: float) -> None:
        """A shadow check sampled this replica's lookup ``request_id`` at rate ``check_prob``: an
        error-bounded arm weighs its verdict by the inverse (cache_core.state.learning)."""
        self.learnable.checked(request_id, check_prob)

    def attach_journal(self, journal) -> None:
        """Log every later insert/removal of every partition (existing and new) to ``journal``."""
        self.journal = journal
        self.stores.attach_journal(journal)

    def sync_journal(self) -> None:
        """Make every change logged so far durable (no-op without persistence)."""
        if self.journal is not None:
            self.journal.sync()

    # -- stores -------------------------------------------------------------------------

    def partitions(self) -> list[Partition]:
        return self.stores.all()

    def partition_for(self, namespace: str, experiment_id: str, arm: str) -> Partition | None:
        """The store a (namespace, experiment, arm) reads from, if it exists yet."""
        return self.stores.partition_for(namespace, experiment_id, arm)

    def retire_idle_stores(self) -> int:
        """Take the stores idle and empty since the last call out (``Stores.retire_idle``)."""
        return self.stores.retire_idle()

    # -- preparation --------------------------------------------------------------------

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
                 started: float, update_clusters: bool = True) -> Request:
        embed_ms = (time.perf_counter() - started) * 1000
        assignment = assign(experiment, unit_id)
        return Request(experiment=experiment, arm_name=assignment.arm,
                       assignment_prob=assignment.probability, vec=vec, l2_norm=float(norm),
                       cluster=self.clusters.assign(vec, update=update_clusters),
                       embed_ms=embed_ms, started=started, variant=assignment.variant)

    # -- embedding cache ----------------------------------------------------------------

    def _cached_embedding(self, query: str) -> CachedEmbedding | None:
        return None if self.embedding_cache is None else self.embedding_cache.get(query)

    def _remember(self, texts: list[str], vecs: np.ndarray, norms: np.ndarray, started: float) -> None:
        if self.embedding_cache is not None:
            self.embedding_cache.put_many(texts, vecs, norms, (time.perf_counter() - started) * 1000)

    def _request_cached(self, experiment: ExperimentConfig, unit_id: str, cached: CachedEmbedding,
                        started: float) -> Request:
        req = self._request(experiment, unit_id, cached.vec, cached.norm, started)
        req.embed_cached, req.embed_saved_ms = True, cached.saved_ms
        return req

    def _encode_many(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode_with_norms`` through the embedding cache: only the texts it lacks are encoded."""
        if self.embedding_cache is None:
            return self.embedder.encode_with_norms(texts)
        found = [self.embedding_cache.get(text) for text in texts]
        missing = [i for i, hit in enumerate(found) if hit is None]
        vecs = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        norms = np.zeros(len(texts), dtype=np.float32)
        if missing:
            started = time.perf_counter()
            fresh, fresh_norms = self.embedder.encode_with_norms([texts[i] for i in missing])
            self._remember([texts[i] for i in missing], fresh, fresh_norms, started)
            vecs[missing], norms[missing] = fresh, fresh_norms
        for i, hit in enumerate(found):
            if hit is not None:
                vecs[i], norms[i] = hit.vec, hit.norm
        return vecs, norms

    def _ann_check_admitted(self) -> bool:
        """A sampled ANN check runs unless events are backing up behind checks or the checks are
        over their CPU budget (either skip is counted as a drop)."""
        if self.emitter.backlog() >= MAX_CHECK_BACKLOG:
            reason = "backlog"
        elif self.ann_checker is not None and not self.ann_checker.within_budget():
            reason = "budget"
        else:
            return True
        if self.ann_checker is not None:
            self.ann_checker.count_drop(reason)
        return False

    def _sample(self, rate: float) -> bool:
        with self._rng_lock:
            return self._rng.random() < rate


def _traced(span, result: LookupResult) -> LookupResult:
    """The lookup span's attributes: the decision's request id (the one ``/v1/feedback`` takes) and the
    nearest similarity, hit or not, as RedisVL records on its lookups."""
    annotate(span, request_id=result.request_id, decision=result.decision, similarity=result.similarity,
             threshold=result.threshold, arm=result.arm, experiment_id=result.experiment_id,
             config_version=result.config_version, guard=result.guard)
    return result
