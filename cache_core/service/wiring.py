"""The one place that builds the cache service's components, and starts and stops them.

``Components.for_service(settings, instance_id, spool_dir)`` is what ``python -m cache_core.service``
runs: the event publisher (Kafka, with its spool), the model, the experiment registry, the cache with
its event worker, ANN checker and expiry sweeper, persistence (``settings.cache.persist``), replication
(``settings.cache.replicate``), the control-topic listener and the feedback follower, the metrics and the
upstream HTTP client of the chat proxy. ``build_components(settings, publisher, embedder, ...)`` builds
the same without the Kafka followers, from parts a test or a benchmark passes in.

Lifecycle: ``start()`` restores and starts what runs in the background (persistence, the sweeper,
the topic followers, heartbeats); ``stop()`` drains and closes everything in dependency order (events
reach the publisher before it closes; the final snapshot comes last). Both are idempotent; the app's
lifespan calls them (``cache_core.service.app.create_app``), and routes receive the parts they use
through FastAPI dependencies (``cache_core.service.deps``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from cache_core.decision.judge import shelf_judges
from cache_core.decision.judge_model import JudgeShelf
from cache_core.decision.judge_tokens import token_encoder
from cache_core.decision.rule import HitRule
from cache_core.store.ann_check import AnnChecker
from cache_core.cache import SemanticCache
from cache_core.embedding.batching import BatchingEncoder
from cache_core.embedding.cache import EmbeddingCache
from cache_core.embedding.embedder import Embedder
from cache_core.shadow.checker import ShadowChecker
from cache_core.embedding.load import load_embedder
from cache_core.publish.event_worker import EventWorker
from cache_core.events import CacheEvent, ControlMessage, FeedbackEvent
from cache_core.lifetime import DEFAULT_INTERVAL_S, ExpirySweeper
from cache_core.state.persistence import Persistence
from cache_core.store.factory import Backends
from cache_core.store.milvus import MilvusConfig
from cache_core.registry import ExperimentRegistry
from cache_core.service.keys import KeyRing
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.shadow import build_checker
from cache_core.settings import CacheSettings, Settings
from cache_core.tracing import OFF, Tracing, build_tracing

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the service needs of the event publisher (``cache_core.publish.publisher.EventPublisher``)."""

    def publish_event(self, event: CacheEvent) -> None: ...

    def publish_feedback(self, event: FeedbackEvent) -> None: ...

    def stats(self) -> dict: ...


class Follower(Protocol):
    """A topic follower /readyz waits for (control listener, entries follower, feedback follower)."""

    def stats(self) -> dict: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...


FOLLOWER_ORDER = ("control", "entries", "feedback")


@dataclass(eq=False)
class Components:
    """Every long-lived part of one cache service instance, built once."""

    settings: Settings
    publisher: Publisher
    encoder: BatchingEncoder
    registry: ExperimentRegistry
    cache: SemanticCache
    metrics: ServiceMetrics
    control_publisher: Callable[[ControlMessage], None]
    """Sends an admin config change to the control topic, confirmed."""
    upstream: httpx.AsyncClient
    """The chat proxy's client for the upstream model (closed by the app's lifespan: ``aclose``)."""
    instance_id: str = ""
    """This replica's id in events."""
    keys: KeyRing | None = None
    """The client API keys (``cache_core.service.auth``)."""
    emit: Callable[[CacheEvent], None] | None = None
    """Counts and publishes a decision event (the cache's own sink), for decisions made outside the
    cache: the chat proxy's bypasses."""
    persistence: Persistence | None = None
    expiry: ExpirySweeper | None = None
    entry_follower: Any = None
    """``cache_core.state.replication.EntryFollower`` with replication on."""
    feedback_follower: Any = None
    """``cache_core.state.feedback.FeedbackFollower`` (the service only)."""
    followers: dict[str, Follower] = field(default_factory=dict)
    """Topic followers by name, started by ``start()`` (the service's: ``for_service``); /readyz waits
    until each has caught up."""
    shadow: ShadowChecker | None = None
    """Shadow checks (``cache_core.shadow``), started by ``start()`` when ``settings.shadow`` enables them."""
    heartbeat_s: float | None = None
    """Publisher heartbeats this often once started (the service only)."""
    tracing: Tracing = OFF
    """OpenTelemetry spans (``cache_core.tracing``), off unless ``settings.tracing`` names an exporter."""
    _closers: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    """What ``stop()`` closes besides the followers, in order (only what these components own)."""
    _started: bool = False
    _stopped: bool = False

    @classmethod
    def for_service(cls, settings: Settings, instance_id: str, spool_dir: Path,
                    embedder: Embedder | None = None, registry: ExperimentRegistry | None = None) -> Components:
        """The service as ``python -m cache_core.service`` runs it: everything from ``settings``.
        Raises ``EmbedderError``/``ValueError``/``yaml.YAMLError`` (model, experiments file), ``TracingError``
        (an exporter's package missing: checked first) and ``OSError`` (spool directory) for the caller to report."""
        from cache_core.publish.control_topic import ControlListener
        from cache_core.state.feedback import FeedbackFollower
        from cache_core.publish.publisher import MIB, EventPublisher

        tracing = build_tracing(settings.tracing, instance_id)
        registry = registry or ExperimentRegistry.from_file(settings.experiments_file)
        embedder = embedder or load_embedder(settings.cache)
        service = settings.service
        publisher = EventPublisher(settings.kafka, spool_dir=spool_dir, instance_id=instance_id,
                                   queue_size=service.publish_queue_size,
                                   max_spool_bytes=service.spool_max_mib * MIB,
                                   send_timeout_s=service.publish_timeout_s)
        persistence = None
        if settings.cache.persist:
            persistence = Persistence(settings.cache.snapshot_dir, fsync=settings.cache.wal_fsync,
                                      interval_s=settings.cache.snapshot_interval_s,
                                      max_log_records=settings.cache.snapshot_max_log_records)
        parts = build_components(settings, publisher, embedder, registry=registry, instance_id=instance_id,
                                 persistence=persistence, replicate=settings.cache.replicate,
                                 close_publisher=True, tracing=tracing)
        parts._closers.append(("tracing", tracing.shutdown))  # last: the publish spans of the drained events go too
        # /readyz: not before the live config is known, the entries replayed, the verdicts applied
        if parts.entry_follower is not None:  # entries the other replicas store
            parts.followers["entries"] = parts.entry_follower
        parts.followers["control"] = ControlListener(settings.kafka, on_record=registry.apply_record)
        if settings.cache.feedback_memory:  # verdicts other replicas took on hits served here
            parts.feedback_follower = FeedbackFollower(
                settings.kafka, parts.cache, state_dir=persistence.directory if persistence else None,
                max_age_s=settings.cache.feedback_resume_max_age_s,
                checkpoint_s=settings.cache.feedback_checkpoint_s)
            # resumed after a graceful stop, not ready before the verdicts posted meanwhile are applied
            parts.followers["feedback"] = parts.feedback_follower
        parts.heartbeat_s = settings.cache.heartbeat_interval_s
        return parts

    def start(self) -> Components:
        """Restore the cache and start the background work; a second call does nothing."""
        if self._started:
            return self
        self._started = True
        if self.persistence is not None:
            self.persistence.open(self.cache)  # restores the snapshot and replays the log
            self.persistence.start()
        if self.expiry is not None:
            self.expiry.start()
        if self.shadow is not None:
            self.shadow.start()
        for _name, follower in self._followers_in_order():
            follower.start()
        if self.heartbeat_s is not None:
            self.publisher.start_heartbeats(self.heartbeat_s)
        return self

    def stop(self) -> None:
        """Drain and close, in order: sweeper, ANN checks and events (every decided lookup's event
        reaches the publisher), followers, publisher, persistence (a final snapshot: the next start
        replays nothing), upstream client, encoder. One failing step does not skip the others."""
        if self._stopped:
            return
        self._stopped = True
        steps = list(self._closers)
        at = _index_of(steps, "followers")
        steps[at:at + 1] = [(f"follower {name}", follower.stop) for name, follower in self._followers_in_order()]
        for name, close in steps:
            try:
                close()
            except Exception:  # the flush after a failing step must still happen
                log.exception("stopping %s failed", name)
        log.info("cache service stopped", extra={"publisher": self.publisher.stats()})

    def _followers_in_order(self) -> list[tuple[str, Follower]]:
        """The live config first, then the entries, then the verdicts; any other after them."""
        order = {name: i for i, name in enumerate(FOLLOWER_ORDER)}
        return sorted(self.followers.items(), key=lambda item: order.get(item[0], len(order)))

    def ready(self) -> list[str]:
        """Names of the followers that have not replayed their topic yet (empty: ready)."""
        return sorted(name for name, follower in self.followers.items() if not follower.stats()["caught_up"])


def build_components(settings: Settings, publisher: Publisher, embedder: Embedder | None = None, *,
                     registry: ExperimentRegistry | None = None, clock: Callable[[], float] = time.time,
                     instance_id: str = "", persistence: Persistence | None = None,
                     control_publisher: Callable[[ControlMessage], None] | None = None,
                     event_executor=None, replicate: bool = False,
                     expiry_sweep_s: float | None = DEFAULT_INTERVAL_S,
                     close_publisher: bool = False, tracing: Tracing | None = None) -> Components:
    """The cache and what serves it, around ``publisher`` (``publish_event``, ``publish_feedback``,
    ``stats``; ``publish_entry`` with ``replicate``). Nothing starts until ``Components.start()``.

    ``embedder``: loaded from ``settings.cache`` unless given; concurrent requests share it through one
    micro-batching encoder (``settings.cache.encoder_workers`` threads; a ``BatchingEncoder`` given is used as
    is, not closed).
    ``persistence``: restores the cache at start, logs every change, snapshots in the background
    and once more at stop. ``control_publisher``: sends admin config changes (default:
    ``cache_core.publish.control_topic.publish_confirmed`` to ``settings.kafka``). ``event_executor``: finishes
    events, lookup metrics and sampled ANN checks after the answer (default: an ``EventWorker`` owned
    here, whose ANN checks are batched, ``settings.cache.ann_check_*``). ``replicate``: stored entries
    and clears go to the entries topic; ``entry_follower`` (built, not started) applies the other replicas'.
    ``expiry_sweep_s``: expired entries are removed this often in the background (None: only lazily).
    ``close_publisher``: ``stop()`` closes the publisher (after the followers, before the final snapshot).
    ``tracing``: spans go there (default: built from ``settings.tracing``, off unless it names an exporter;
    raises ``TracingError`` if that exporter's package is missing)."""
    closers: list[tuple[str, Callable[[], None]]] = []
    own_tracing = tracing is None
    tracing = build_tracing(settings.tracing, instance_id) if own_tracing else tracing
    own_encoder = not isinstance(embedder, BatchingEncoder)
    encoder = BatchingEncoder(embedder or load_embedder(settings.cache), max_batch=settings.cache.encoder_max_batch,
                              workers=settings.cache.encoder_workers, inline=settings.cache.encoder_inline) \
        if own_encoder else embedder
    registry = registry or ExperimentRegistry.from_file(settings.experiments_file)
    own_worker = event_executor is None
    event_executor = EventWorker() if own_worker else event_executor
    # An event waits for its batch, so batch only behind the components' own background worker.
    ann_checker = AnnChecker.from_settings(settings.cache) \
        if own_worker and settings.cache.ann_check_batch_size > 1 else None
    metrics: list[ServiceMetrics] = []  # the sink runs only after the metrics exist

    def sink(event: CacheEvent) -> None:
        metrics[0].observe_lookup(event)
        try:
            publisher.publish_event(event)
        except Exception:  # the answer must not fail because telemetry did; it is counted
            metrics[0].publish_errors.inc()
            log.exception("publish_event failed", extra={"request_id": event.request_id})

    cache = SemanticCache(
        encoder, registry, clock=clock, event_sink=sink, instance_id=instance_id,
        default_ttl_s=settings.cache.default_ttl_s, max_query_chars=settings.cache.max_query_chars,
        max_answer_chars=settings.cache.max_answer_chars,
        emit_query_text=settings.cache.emit_query_text, event_executor=event_executor,
        ann_checker=ann_checker, feedback_memory=settings.cache.feedback_memory,
        hit_rule=HitRule(judges=shelf_judges(JudgeShelf(
            settings.cache.judge_dir,
            tokens=lambda: token_encoder(settings.cache.model, settings.cache.models_dir)))),
        embedding_cache=EmbeddingCache(settings.cache.embedding_cache_entries)
        if settings.cache.embedding_cache_entries else None,
        backends=store_backends(settings.cache), tracing=tracing,
    )
    sweeper = ExpirySweeper(cache, expiry_sweep_s) if expiry_sweep_s else None
    entry_follower = _replication(settings, cache, publisher, instance_id, persistence) if replicate else None
    if control_publisher is None:
        from cache_core.publish.control_topic import publish_confirmed

        def control_publisher(message: ControlMessage) -> None:
            publish_confirmed(settings.kafka, message, base=registry.base())

    # No pool limit below the streams a replica holds open: each waits on its own connection.
    upstream = httpx.AsyncClient(limits=httpx.Limits(max_connections=settings.service.upstream_max_connections,
                                                     max_keepalive_connections=100))
    parts = Components(settings=settings, publisher=publisher, encoder=encoder, registry=registry, cache=cache,
                       metrics=None, control_publisher=control_publisher, upstream=upstream,  # type: ignore[arg-type]
                       emit=sink, keys=KeyRing.from_settings(settings.service), instance_id=instance_id,
                       persistence=persistence, expiry=sweeper, entry_follower=entry_follower,
                       tracing=tracing, _closers=closers)
    # Shadow checks ask the upstream from their own worker threads: a blocking client of their own.
    shadow_client = httpx.Client()
    parts.shadow = build_checker(settings, encoder.encode, shadow_client, publisher.publish_feedback,
                                 on_checked=cache.checked)  # error-bounded arms weigh verdicts by 1 / rate
    parts.metrics = ServiceMetrics(
        cache, publisher.stats, persistence.metrics if persistence else None,
        entry_follower.stats if entry_follower else None,
        feedback_stats=lambda: parts.feedback_follower.stats() if parts.feedback_follower else None,
        shadow_stats=parts.shadow.stats if parts.shadow.enabled else None)
    metrics.append(parts.metrics)
    if sweeper is not None:
        closers.append(("expiry sweeper", sweeper.stop))
    closers.append(("shadow checks", parts.shadow.close))  # before the publisher their verdicts go to
    closers.append(("shadow client", shadow_client.close))
    if ann_checker is not None:
        closers.append(("ANN checker", ann_checker.close))  # pending checks run now, their events go
    if own_worker:
        closers.append(("event worker", event_executor.close))  # every decided lookup's event is published
    closers.append(("followers", lambda: None))  # replaced by each follower's stop, in start order
    if close_publisher:
        closers.append(("publisher", publisher.close))
    if persistence is not None:
        closers.append(("persistence", persistence.close))
    if own_encoder:
        closers.append(("encoder", encoder.close))
    if own_tracing:
        closers.append(("tracing", tracing.shutdown))  # last: the publish spans of the drained events go too
    return parts


def store_backends(cache: CacheSettings) -> Backends:
    """Where out-of-process index kinds keep their vectors (no connection is made here: a
    Milvus collection is opened when an arm of kind ``milvus`` first stores or searches), and
    the stores their disk tiers (arms with ``disk_entries``), beside the snapshots."""
    uri = cache.milvus_uri or str(Path(cache.snapshot_dir) / "milvus.db")
    return Backends(milvus=MilvusConfig(uri=uri, token=cache.milvus_token.get_secret_value(),
                                        consistency=cache.milvus_consistency),
                    disk_dir=Path(cache.snapshot_dir) / "tiers")


def _index_of(steps: list[tuple[str, Callable[[], None]]], name: str) -> int:
    return next((i for i, (step, _) in enumerate(steps) if step == name), len(steps))


def _replication(settings: Settings, cache: SemanticCache, publisher, instance_id: str,
                 persistence: Persistence | None):
    """Attach the entry feed to ``cache`` (and its intent clusters) and build (not start) its follower. Its
    offsets live beside the write-ahead log: without one, every start replays the topic."""
    from cache_core.state.replication import EntryFollower, share

    model = settings.cache.model
    share(cache, publisher, instance_id, model)
    return EntryFollower(settings.kafka, cache, instance_id, model,
                         state_dir=persistence.directory if persistence is not None else None,
                         cluster_refresh_s=settings.cache.cluster_refresh_s)
