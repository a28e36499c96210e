"""Prometheus metrics of one app instance (own registry, so apps in tests do not clash)."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from cache_core.cache import SemanticCache
from cache_core.events import CacheEvent

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
PUBLISHER_STATS = ("queue_depth", "published", "spooled", "replayed", "dropped")


class ServiceMetrics:
    """Counters and histograms updated per request, gauges read at scrape time."""

    def __init__(self, cache: SemanticCache, publisher_stats: Callable[[], dict]):
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
        self.registry.register(_ScrapeTimeGauges(cache, publisher_stats))

    def observe_lookup(self, event: CacheEvent) -> None:
        self.requests.labels(event.experiment_id, event.arm, event.decision).inc()
        if event.hit:
            self.hits.labels(event.experiment_id, event.arm).inc()
        self.latency.labels(event.experiment_id, event.arm).observe(event.latency_ms / 1000)
        self.embed.observe(event.embed_ms / 1000)
        if event.decision != "bypass":
            self.search.labels(event.index_kind).observe(event.search_ms / 1000)


class _ScrapeTimeGauges:
    """Publisher queue/spool/drop counts and per-partition sizes, read when scraped."""

    def __init__(self, cache: SemanticCache, publisher_stats: Callable[[], dict]):
        self.cache = cache
        self.publisher_stats = publisher_stats

    def collect(self):
        stats = self.publisher_stats()
        for name in PUBLISHER_STATS:
            gauge = GaugeMetricFamily(f"scache_publisher_{name}", f"Event publisher: {name}")
            gauge.add_metric([], float(stats.get(name, 0)))
            yield gauge
        entries = GaugeMetricFamily("scache_cache_entries", "Entries per store",
                                    labels=["namespace", "experiment", "arm"])
        size = GaugeMetricFamily("scache_cache_bytes", "Approximate bytes per store",
                                 labels=["namespace", "experiment", "arm"])
        for partition in self.cache.partitions():
            entries.add_metric(list(partition.key), len(partition))
            size.add_metric(list(partition.key), partition.bytes)
        yield entries
        yield size
