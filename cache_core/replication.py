"""Cache replicas share their entries through the entries topic.

Behind a load balancer, each replica would otherwise cache only what it stored itself:
N replicas, N cold caches, and a hit rate that falls with every replica added. So every
replica publishes each entry it stores and each namespace it clears (``EntryFeed``,
through its event publisher: a broker outage spools them, in order), and follows the
topic (``EntryFollower``), applying the others' changes:

* a stored entry goes into the store of the same (namespace, experiment, arm) key, so
  arms stay apart on every replica (``SemanticCache.apply_replicated``). Its admission
  tier was decided where it was stored; this replica's capacity and LRU still apply.
  A newer entry for the same query text replaces the older one, whichever came first.
* a clear removes that namespace's entries created before it, so an entry stored on
  another replica after the clear survives, and one stored before it but delivered
  late is dropped.
* a drop removes one entry that "wrong" feedback took out of service on the replica
  that served it (cache_core.feedback). It follows the entry's put in the topic: both
  are keyed by namespace, and the serving replica held the entry before it dropped it.

A replica's own changes come back to it too: normally already applied (counted as
``own``), but after a restart without persistence they give it back its own entries.

Intent clusters are one model across replicas, so that a cluster id (in events, in
``cluster_thresholds``) names the same intent on each: cluster ids are drawn unique
across replicas, and every cluster a replica opens and every model it retrains goes to
the topic too; the others adopt them (``OnlineClusters.adopt_open`` / ``adopt_model``).
An intent opened on two replicas within the replication lag is merged into one id, the
same on both, from the two opens' times, vectors and origins (see cache_core.clusters).

Not replicated: hits (hit counts, sliding-TTL renewals, LRU order) and evictions, which
stay each replica's own. Expiry follows from the entry's own times: the same everywhere.
Entries from another encoder model or dimension are skipped and counted. The topic
carries queries and answers (events do not, unless ``emit_query_text``): give it the
protection of the cache's own storage (ACLs, encryption), or set ``SCACHE_CACHE__REPLICATE=false``.

Position. With persistence, the follower keeps the offsets it has applied in
``replication-offsets.json`` beside the write-ahead log, written (at most once a second,
and at stop) after the log holding those entries is synced (with the time of each namespace's last clear), so a restart
resumes where it stopped and re-reads nothing it already has. Without it (or with a fresh directory) the follower reads the topic from
its beginning: a new replica warms up from what the others stored within the topic's
retention (``SCACHE_KAFKA__ENTRIES_RETENTION_MS``). ``wait_caught_up`` says when that
replay is done; ``/healthz`` reports it.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from kafka import TopicPartition
from pydantic import ValidationError

from cache_core.clusters import ClusterModel
from cache_core.events import ClusterModelPayload, EntryMessage
from cache_core.follower import TopicFollower
from cache_core.persistence import decode_vec, encode_vec, entry_from_meta, entry_meta
from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)

OFFSETS_FILE = "replication-offsets.json"
SAVE_EVERY_S = 1.0
OUTCOMES = ("applied", "duplicate", "stale", "expired", "too_large", "cleared_before", "clears",
            "dropped", "clusters", "own", "other_model", "malformed")


class EntryFeed:
    """Turns the cache's stored entries and clears into ``EntryMessage``s on ``publisher``."""

    def __init__(self, publisher, instance_id: str, model: str):
        if not instance_id:
            raise ValueError("replication needs an instance id (it tells its own changes apart by it)")
        self.publisher = publisher
        self.instance_id = instance_id
        self.model = model

    def stored(self, key: tuple[str, str, str], entry) -> None:
        namespace, experiment_id, arm_key = key
        self.publisher.publish_entry(EntryMessage(
            change="put", origin=self.instance_id, ts_ms=int(entry.created_at * 1000), namespace=namespace,
            experiment_id=experiment_id, arm_key=arm_key, model=self.model, entry=entry_meta(entry),
            embedding=encode_vec(entry.embedding)))

    def dropped(self, key: tuple[str, str, str], entry_id: str) -> None:
        namespace, experiment_id, arm_key = key
        self.publisher.publish_entry(EntryMessage(change="drop", origin=self.instance_id, namespace=namespace,
                                                  experiment_id=experiment_id, arm_key=arm_key, entry_id=entry_id))

    def cleared(self, namespace: str, cleared_at: float) -> None:
        self.publisher.publish_entry(EntryMessage(change="clear", origin=self.instance_id,
                                                  ts_ms=int(cleared_at * 1000), namespace=namespace))

    # OnlineClusters.listener: the intent clusters are one model across replicas.

    def cluster_opened(self, cluster_id: int, centroid, opened_at_ms: int) -> None:
        self.publisher.publish_entry(EntryMessage(change="cluster", origin=self.instance_id, ts_ms=opened_at_ms,
                                                  model=self.model, cluster_id=cluster_id,
                                                  embedding=encode_vec(centroid)))

    def clusters_retrained(self, model: ClusterModel) -> None:
        self.publisher.publish_entry(EntryMessage(
            change="clusters", origin=self.instance_id, model=self.model, clusters=ClusterModelPayload(
                generation=model.generation, trained_at_ms=model.trained_at_ms, ids=model.ids,
                counts=model.counts, centroids=encode_vec(model.centroids.reshape(-1)))))


def share(cache, publisher, instance_id: str, model: str) -> EntryFeed:
    """Send ``cache``'s stored entries, clears and intent-cluster changes to the entries topic
    through ``publisher``; its clusters draw ids unique across replicas. Returns the feed."""
    feed = EntryFeed(publisher, instance_id, model)
    cache.entry_feed = feed
    cache.clusters.fleet_ids, cache.clusters.origin, cache.clusters.listener = True, instance_id, feed
    return feed


class EntryFollower(TopicFollower):
    """Applies the other replicas' entry changes to ``cache``; see the module docstring.
    ``state_dir``: where the applied offsets are kept (None: always replay from the start)."""

    thread_name = "scache-entries"

    def __init__(self, kafka: KafkaSettings, cache, instance_id: str, model: str, *,
                 state_dir: Path | None = None, poll_timeout_s: float = 0.5, retry_s: float = 1.0):
        super().__init__(kafka, kafka.entries_topic, poll_timeout_s=poll_timeout_s, retry_s=retry_s,
                         counters=OUTCOMES)
        self.cache = cache
        self.instance_id = instance_id
        self.model = model
        self.offsets_path = Path(state_dir) / OFFSETS_FILE if state_dir is not None else None
        self._cleared_at: dict[str, float] = {}
        self._saved_at = float("-inf")

    # -- position ---------------------------------------------------------------------

    def start_offsets(self) -> dict[TopicPartition, int]:
        if self.offsets_path is None or not self.offsets_path.exists():
            return {}
        try:
            saved = json.loads(self.offsets_path.read_text())
            if saved.get("topic") != self.topic:
                return {}  # another topic's positions mean nothing here
            self._cleared_at = {ns: float(at) for ns, at in saved.get("cleared_at", {}).items()}
            return {TopicPartition(self.topic, int(p)): int(o) for p, o in saved["offsets"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("unreadable replication offsets, replaying the entries topic",
                        extra={"path": str(self.offsets_path), "error": str(exc)})
            return {}

    def after_batch(self) -> None:
        # At most once a second: re-reading a second's messages after a crash only finds duplicates.
        if self.offsets_path is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self._save_offsets()

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        if self.offsets_path is not None and not self.stats()["alive"] and self._positions:
            self._save_offsets()

    def _save_offsets(self) -> None:
        self.cache.sync_journal()  # offsets may only move past what the write-ahead log holds durably
        body = {"topic": self.topic, "offsets": {str(tp.partition): o for tp, o in self.positions.items()},
                "cleared_at": self._cleared_at}
        tmp = self.offsets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.offsets_path)
        self._saved_at = time.monotonic()

    # -- records ----------------------------------------------------------------------

    def handle(self, record, tp: TopicPartition) -> None:
        try:
            message = EntryMessage.model_validate_json(record.value or b"")
        except ValidationError as exc:
            self._counts["malformed"] += 1
            log.error("skipping malformed entry message", extra={
                "partition": tp.partition, "offset": record.offset, "error": exc.errors()[0]["msg"]})
            return
        try:
            self._counts[self._apply(message)] += 1
        except Exception:  # one bad record must not stop replication
            self._counts["handler_errors"] += 1
            log.exception("applying an entry message failed",
                          extra={"partition": tp.partition, "offset": record.offset, "origin": message.origin})

    def _apply(self, message: EntryMessage) -> str:
        own = message.origin == self.instance_id
        if message.change in ("cluster", "clusters"):
            return "own" if own else self._apply_clusters(message)
        if message.change == "clear":
            cleared_at = message.ts_ms / 1000
            self._cleared_at[message.namespace] = max(cleared_at, self._cleared_at.get(message.namespace, 0.0))
            # Also our own: it removes the other replicas' older entries that arrived after the local clear.
            self.cache.apply_replicated_clear(message.namespace, cleared_at)
            return "own" if own else "clears"
        if message.change == "drop":  # an entry feedback took out of service (cache_core.feedback)
            removed = self.cache.apply_replicated_drop(
                (message.namespace, message.experiment_id, message.arm_key), message.entry_id)
            return "own" if own else ("dropped" if removed else "duplicate")
        outcome = self._apply_put(message)
        return "own" if own and outcome == "duplicate" else outcome

    def _apply_put(self, message: EntryMessage) -> str:
        if message.model != self.model:
            return "other_model"
        try:
            vector = decode_vec(message.embedding)
            entry = entry_from_meta(message.entry, vector)
        except (TypeError, ValueError):
            return "malformed"
        if vector.shape != (self.cache.embedder.dim,):
            return "other_model"
        if entry.created_at < self._cleared_at.get(message.namespace, float("-inf")):
            return "cleared_before"
        return self.cache.apply_replicated((message.namespace, message.experiment_id, message.arm_key), entry)

    def _apply_clusters(self, message: EntryMessage) -> str:
        if message.model != self.model:
            return "other_model"
        clusters, dim = self.cache.clusters, self.cache.embedder.dim
        try:
            vectors = decode_vec(message.embedding if message.change == "cluster" else message.clusters.centroids)
        except ValueError:
            return "malformed"
        if message.change == "cluster":
            if vectors.shape != (dim,):
                return "other_model"
            adopted = clusters.adopt_open(message.cluster_id, vectors, message.ts_ms, origin=message.origin)
            return "clusters" if adopted else "duplicate"  # duplicate: known, or merged into a concurrent open
        payload, centroids = message.clusters, vectors
        if len(payload.ids) != len(payload.counts) or centroids.size != len(payload.ids) * dim:
            return "malformed"
        model = ClusterModel(payload.generation, message.origin, payload.trained_at_ms, payload.ids,
                             payload.counts, centroids.reshape(len(payload.ids), dim))
        return "clusters" if clusters.adopt_model(model) else "stale"
