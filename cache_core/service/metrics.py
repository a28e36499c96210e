"""Prometheus metrics of one app instance (own registry, so apps in tests do not clash)."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cache_core.cache import SemanticCache
from cache_core.events import CacheEvent
from cache_core.state.feedback import OUTCOMES as FEEDBACK_OUTCOMES
from cache_core.state.replication import OUTCOMES

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
PUBLISHER_GAUGES = {"queue_depth": "Events waiting in memory for Kafka",
                    "queue_size": "Bound of that queue (SCACHE_SERVICE__PUBLISH_QUEUE_SIZE)",
                    "spool_bytes": "Bytes waiting in the on-disk spool",
                    "broker_healthy": "1 while Kafka takes the events directly, 0 while they go to the spool"}
PUBLISHER_COUNTERS = {"published": "Events Kafka acknowledged",
                      "spooled": "Events written to the on-disk spool (Kafka away, stalled or slower than the offers)",
                      "replayed": "Spooled events sent afterwards",
                      "spilled": "Events moved from the in-memory queue to the spool because it was half full",
                      "reordered": "Events of a stalled batch spooled behind newer ones (order may bend, none lost)",
                      "dropped": "Events lost: spool full, or queue full faster than it could be spilled"}
# Persistence figures (cache_core.persistence stats) -> (family name, type, help); counters drop ``_total``,
# which the exposition adds back.
PERSISTENCE_FAMILIES = {
    "log_records": ("log_records", "counter", "Log records written since start"),
    "log_records_since_snapshot": ("log_records_since_snapshot", "gauge", "Log records the next restart replays"),
    "log_bytes_since_snapshot": ("log_bytes_since_snapshot", "gauge", "Bytes of those records"),
    "log_segment": ("log_segment", "gauge", "The log segment being written"),
    "fsyncs": ("fsyncs", "counter", "fsyncs of the log"),
    "fsync_seconds_total": ("fsync_seconds", "counter", "Time spent in fsyncs of the log"),
    "fsync_seconds_max": ("fsync_seconds_max", "gauge", "The slowest fsync"),
    "snapshots": ("snapshots", "counter", "Snapshots written since start"),
    "last_snapshot_at": ("last_snapshot_timestamp_seconds", "gauge", "Unix time of the last snapshot"),
    "last_snapshot_seconds": ("last_snapshot_seconds", "gauge", "How long the last snapshot took"),
    "last_snapshot_entries": ("last_snapshot_entries", "gauge", "Entries in the last snapshot"),
    "restored_entries": ("restored_entries", "gauge", "Entries restored at start"),
    "restore_seconds": ("restore_seconds", "gauge", "How long the restore took"),
    "restore_torn_records": ("restore_torn_records", "gauge", "Torn log records cut off at start"),
}


class ServiceMetrics:
    """Counters and histograms updated per request, gauges read at scrape time."""

    def __init__(self, cache: SemanticCache, publisher_stats: Callable[[], dict],
                 persistence_stats: Callable[[], dict] | None = None,
                 replication_stats: Callable[[], dict] | None = None,
                 feedback_stats: Callable[[], dict | None] | None = None,
                 shadow_stats: Callable[[], dict | None] | None = None):
        self.registry = CollectorRegistry()
        labels = ["experiment", "arm"]
        self.requests = Counter("scache_requests", "Lookups by decision", labels + ["decision"],
                                registry=self.registry)
        self.hits = Counter("scache_hits", "Lookups served from the cache", labels, registry=self.registry)
        self.latency = Histogram("scache_lookup_latency_seconds", "Lookup latency inside the service",
                                 labels, buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.embed = Histogram("scache_embed_seconds", "Embedding time per lookup",
                               buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.search = Histogram("scache_search_seconds", "Index search time per lookup",
                                ["index_kind"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.stores = Counter("scache_stores", "Store requests by outcome", labels + ["reason"],
                              registry=self.registry)
        self.feedback = Counter("scache_feedback", "Feedback verdicts received", ["verdict"],
                                registry=self.registry)
        self.publish_errors = Counter("scache_publish_errors", "Events the publisher refused",
                                      registry=self.registry)
        self.variants = Counter("scache_variant_requests", "Lookups by arm variant (base/canary)",
                                labels + ["variant", "decision"], registry=self.registry)
        self.guard_blocks = Counter("scache_guard_blocks", "Would-be hits a lexical guard turned into misses",
                                    labels + ["guard"], registry=self.registry)
        self.chat = Counter("scache_chat_requests", "Chat completions by outcome", ["outcome"],
                            registry=self.registry)
        self.upstream_latency = Histogram("scache_upstream_seconds", "Upstream model call time",
                                          buckets=LATENCY_BUCKETS_S + (5.0, 10.0, 30.0, 60.0),
                                          registry=self.registry)
        self.admin = Counter("scache_admin_actions", "Admin actions performed", ["action"],
                             registry=self.registry)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, _resident_memory_bytes, fds, ...
        self.registry.register(_ScrapeTimeGauges(cache, publisher_stats, persistence_stats, replication_stats,
                                                 feedback_stats))
        if shadow_stats is not None:
            self.registry.register(_ShadowChecks(shadow_stats))

    def observe_lookup(self, event: CacheEvent) -> None:
        self.requests.labels(event.experiment_id, event.arm, event.decision).inc()
        if event.hit:
            self.hits.labels(event.experiment_id, event.arm).inc()
        self.variants.labels(event.experiment_id, event.arm, event.variant, event.decision).inc()
        if event.guard:
            self.guard_blocks.labels(event.experiment_id, event.arm, event.guard).inc()
        self.latency.labels(event.experiment_id, event.arm).observe(event.latency_ms / 1000)
        self.embed.observe(event.embed_ms / 1000)
        if event.decision != "bypass":
            self.search.labels(event.index_kind).observe(event.search_ms / 1000)


class _ScrapeTimeGauges:
    """Publisher queue/spool/drop counts, per-partition sizes and snapshot/log figures,
    read when scraped."""

    def __init__(self, cache: SemanticCache, publisher_stats: Callable[[], dict],
                 persistence_stats: Callable[[], dict] | None,
                 replication_stats: Callable[[], dict] | None = None,
                 feedback_stats: Callable[[], dict | None] | None = None):
        self.cache = cache
        self.publisher_stats = publisher_stats
        self.persistence_stats = persistence_stats
        self.replication_stats = replication_stats
        self.feedback_stats = feedback_stats

    def collect(self):
        stats = self.publisher_stats()
        for name, help_text in PUBLISHER_GAUGES.items():
            gauge = GaugeMetricFamily(f"scache_publisher_{name}", help_text)
            gauge.add_metric([], float(stats.get(name, 0)))
            yield gauge
        for name, help_text in PUBLISHER_COUNTERS.items():
            counter = CounterMetricFamily(f"scache_publisher_{name}", help_text)
            counter.add_metric([], float(stats.get(name, 0)))
            yield counter
        entries = GaugeMetricFamily("scache_cache_entries", "Entries per store",
                                    labels=["namespace", "experiment", "arm"])
        size = GaugeMetricFamily("scache_cache_bytes", "Approximate bytes per store",
                                 labels=["namespace", "experiment", "arm"])
        for partition in self.cache.partitions():
            entries.add_metric(list(partition.key), len(partition))
            size.add_metric(list(partition.key), partition.bytes)
        yield entries
        yield size
        yield from self._ann_checks()
        clusters = GaugeMetricFamily("scache_intent_clusters", "Intent clusters in use")
        clusters.add_metric([], float(len(self.cache.clusters)))
        yield clusters
        merges = CounterMetricFamily("scache_intent_cluster_merges", "Intent clusters merged into another "
                                     "(one intent under two ids), by reason", labels=["reason"])
        for reason in ("concurrent_open", "retrain"):
            merges.add_metric([reason], float(self.cache.clusters.merges.get(reason, 0)))
        yield merges
        if self.persistence_stats is not None:
            for name, value in self.persistence_stats().items():
                family, kind, help_text = PERSISTENCE_FAMILIES.get(name, (name, "gauge", f"Snapshots and log: {name}"))
                metric = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                    f"scache_persistence_{family}", help_text)
                metric.add_metric([], float(value))
                yield metric
        yield from self._replication()
        yield from self._feedback_follower()
        applied = CounterMetricFamily("scache_feedback_applied", "Verdicts applied to the hits this replica "
                                      "served, by outcome (cache_core.state.feedback)", labels=["experiment", "arm", "outcome"])
        for (experiment, arm, outcome), count in sorted(self.cache.feedback_outcomes.items()):
            applied.add_metric([experiment, arm, outcome], float(count))
        yield applied

    def _replication(self):
        """Entry messages from the other replicas, by outcome (nothing when not replicating)."""
        if self.replication_stats is None:
            return
        yield from _topic_follower(
            "scache_replication", self.replication_stats(), (*OUTCOMES, "handler_errors"),
            messages_help="Entries-topic messages read, by outcome",
            counter=("cluster_refreshes",
                     "Cluster models re-sent so the entries topic keeps them within its retention"),
            caught_up_help="1 once the entries topic present at start has been applied")

    def _feedback_follower(self):
        """The feedback topic follower's figures (nothing before one is started)."""
        stats = self.feedback_stats() if self.feedback_stats is not None else None
        if stats is None:
            return
        yield from _topic_follower(
            "scache_feedback_follower", stats, (*FEEDBACK_OUTCOMES, "malformed", "handler_errors"),
            messages_help="Feedback-topic verdicts read, by what they did here",
            counter=("checkpoints", "Served hits and offsets checkpointed while running"),
            caught_up_help="1 once the feedback topic is read up to where it stood at start")

    def _ann_checks(self):
        """The batched ANN checker's figures (nothing when checks run singly)."""
        stats = self.cache.ann_check_stats()
        if stats is None:
            return
        dropped = CounterMetricFamily("scache_ann_checks_dropped",
                                      "Sampled ANN checks not run (event sent unchecked)",
                                      labels=["reason"])
        for reason, count in stats["dropped"].items():
            dropped.add_metric([reason], float(count))
        yield dropped
        for metric, key, help_text in (
                ("scache_ann_checks_batched", "checked", "ANN checks run in batches"),
                ("scache_ann_check_batches", "batches", "Batched exact scans run"),
                ("scache_ann_check_cpu_seconds", "cpu_s", "CPU seconds of the batched exact scans")):
            counter = CounterMetricFamily(metric, help_text)
            counter.add_metric([], float(stats[key]))
            yield counter
        pending = GaugeMetricFamily("scache_ann_check_pending", "ANN checks waiting for a batch")
        pending.add_metric([], float(stats["pending"]))
        yield pending


SHADOW_OUTCOMES = ("queued", "dropped_budget", "dropped_queue", "dropped_closed", "hit_correct", "hit_wrong",
                   "near_miss_correct", "near_miss_wrong", "no_answer", "errors")


class _ShadowChecks:
    """Shadow checks' figures (``cache_core.shadow.checker.ShadowChecker.stats``; only when enabled)."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.stats = stats

    def collect(self):
        stats = self.stats()
        if stats is None:
            return
        checks = CounterMetricFamily("scache_shadow_checks", "Shadow checks by outcome", labels=["outcome"])
        for outcome in SHADOW_OUTCOMES:
            checks.add_metric([outcome], float(stats.get(outcome, 0)))
        yield checks
        calls = CounterMetricFamily("scache_shadow_upstream_calls", "Extra upstream calls made by shadow checks")
        calls.add_metric([], float(stats.get("upstream_calls", 0)))
        yield calls
        seconds = CounterMetricFamily("scache_shadow_upstream_seconds", "Time spent in those calls")
        seconds.add_metric([], float(stats.get("upstream_s", 0.0)))
        yield seconds
        waiting = GaugeMetricFamily("scache_shadow_waiting", "Shadow checks queued, not yet running")
        waiting.add_metric([], float(stats.get("waiting", 0)))
        yield waiting


def _topic_follower(prefix: str, stats: dict, outcomes: tuple[str, ...], *, messages_help: str,
                    counter: tuple[str, str], caught_up_help: str):
    """A topic follower's families: ``<prefix>_messages`` by outcome, one more counter
    (``<prefix>_<name>``), and ``<prefix>_caught_up``."""
    messages = CounterMetricFamily(f"{prefix}_messages", messages_help, labels=["outcome"])
    for outcome in outcomes:
        messages.add_metric([outcome], float(stats.get(outcome, 0)))
    yield messages
    name, help_text = counter
    extra = CounterMetricFamily(f"{prefix}_{name}", help_text)
    extra.add_metric([], float(stats.get(name, 0)))
    yield extra
    caught_up = GaugeMetricFamily(f"{prefix}_caught_up", caught_up_help)
    caught_up.add_metric([], float(stats["caught_up"]))
    yield caught_up
