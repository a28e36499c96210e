"""Cache replicas share their entries through the entries topic.

Behind a load balancer, each replica would otherwise cache only what it stored itself:
N replicas, N cold caches, and a hit rate that falls with every replica added. So every
replica publishes each entry it stores and each namespace it clears (``EntryFeed``,
through its event publisher: a broker outage spools them, in order), and follows the
topic (``EntryFollower``), applying the others' changes:

* a stored entry goes into the store of the same (namespace, experiment, arm) key, so
  arms stay apart on every replica (``SemanticCache.apply``, cache_core.state.changes). Its admission
  tier was decided where it was stored; this replica's capacity and LRU still apply.
  A newer entry for the same query text replaces the older one, whichever came first.
* a clear removes that namespace's entries created before it, so an entry stored on
  another replica after the clear survives, and one stored before it but delivered
  late is dropped.
* a purge removes a namespace's entries of one provenance source (and version), or of
  one question, created before it (``SemanticCache.purge``); like a clear, a matching entry
  stored before it but delivered late is dropped (the last purges per namespace are kept
  with the offsets). Clears and purges older than the topic's retention are forgotten.
* a drop removes one entry that "wrong" feedback took out of service on the replica
  that served it (cache_core.state.feedback). It follows the entry's put in the topic: both
  are keyed by namespace, and the serving replica held the entry before it dropped it.
* a vote is one unit's "wrong" verdict on an entry that the serving replica kept (the arm's
  ``invalidate_after_wrong`` is above the units it counted): every replica adds the unit to
  the entry's ``wrong_units`` (a set: a redelivery or the own echo counts once) and removes
  the entry, durably, once they reach the serving arm's limit (``voted_out``; no drop is
  sent, since every replica counts the same votes). So the limit counts the units served
  by any replica. A drop or vote for an entry that is gone already counts ``duplicate``.
* judged is a verdict an error-bounded arm learns its thresholds from (cache_core.state.learning):
  every other replica records it (``judged``), so all learn the same thresholds; the own echo
  is skipped (recorded and logged when it was made). Not an entry change: the entry may be gone.

A replica's own changes come back to it too: normally already applied (counted as
``own``), but after a restart without persistence they give it back its own entries.

Intent clusters are one model across replicas, so that a cluster id (in events, in
``cluster_thresholds``) names the same intent on each: cluster ids are drawn unique
across replicas, and every cluster a replica opens and every model it retrains goes to
the topic too; the others adopt them (``OnlineClusters.adopt_open`` / ``adopt_model``).
An intent opened on two replicas within the replication lag is merged into one id, the
same on both, from the two opens' times, vectors and origins (see cache_core.clusters).

The topic is time-retained and retrains grow rare, so the messages that built the
cluster set fall out of it. So the topic always holds a recent copy of the model in use:
every replica notes when the newest model message it read (its own included) was sent,
and once that is ``cluster_refresh_s`` old (``SCACHE_CACHE__CLUSTER_REFRESH_S``, below the
retention), plus a random jitter of up to 10% of it, it re-sends the model in use with
every cluster it holds (``OnlineClusters.model_in_use``; nothing while it has none, nor
before it replayed the topic). The first replica due sends it; the others read it and
count again from it, so one copy goes out per interval, not one per replica. The copy is
the same model, not a new one: replicas on it only take in what they lack (normally
nothing), and a replica starting from an empty topic history adopts it whole, with the
same ids (see "Refresh" in cache_core.clusters). Model messages are applied even when
they are this replica's own (still counted as ``own``): their order makes that safe, and
a replica restarted without its state under the same instance id gets its model back.

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
import random
import time
import typing
from dataclasses import asdict
from pathlib import Path

import numpy as np
from kafka import TopicPartition
from pydantic import ValidationError

from cache_core.clusters import ClusterModel
from cache_core.records import EntryMatch, InvalidRequest
from cache_core.decision.error_bound import Judged
from cache_core.events import ClusterModelPayload, EntryMessage, JudgedLookup, PurgeMatch, WrongVote
from cache_core.state.follower import TopicFollower
from cache_core.state.changes import Clear, Purge, Put, Remove, Vote
from cache_core.state.codec import decode_vec, encode_vec, entry_from_meta, entry_meta
from cache_core.settings import CLUSTER_REFRESH_JITTER, KafkaSettings
from cache_core.settings import cluster_refresh_s as cluster_refresh_s_in_effect

log = logging.getLogger(__name__)

OFFSETS_FILE = "replication-offsets.json"
PURGES_REMEMBERED = 64  # per namespace: a put created before one of them but delivered after it is dropped
SAVE_EVERY_S = 1.0
OUTCOMES = ("applied", "duplicate", "stale", "expired", "too_large", "cleared_before", "clears",
            "purges", "purged_before", "dropped", "votes", "voted_out", "judged", "clusters", "own", "other_model",
            "dropped_before", "unknown_change", "malformed")
# A change kind a newer replica produces during a rolling upgrade: skipped and counted, logged once per kind.
KNOWN_CHANGES = frozenset(typing.get_args(EntryMessage.model_fields["change"].annotation))


class EntryFeed:
    """Turns the cache's stored entries and clears into ``EntryMessage``s on ``publisher``."""

    def __init__(self, publisher, instance_id: str, model: str, clock=time.time):
        if not instance_id:
            raise ValueError("replication needs an instance id (it tells its own changes apart by it)")
        self.publisher = publisher
        self.instance_id = instance_id
        self.model = model
        self.clock = clock

    def stored(self, key: tuple[str, str, str], entry, vector: np.ndarray | None = None) -> None:
        """Publish a put. ``vector``: the entry's as stored (required once a compressed store
        took it off the entry, ``CacheEntry.embedding``)."""
        vector = entry.embedding if vector is None else vector
        if vector is None:
            raise ValueError(f"entry {entry.entry_id} keeps no vector: pass the one it was stored with")
        namespace, experiment_id, arm_key = key
        self.publisher.publish_entry(EntryMessage(
            change="put", origin=self.instance_id, ts_ms=int(entry.created_at * 1000), namespace=namespace,
            experiment_id=experiment_id, arm_key=arm_key, model=self.model, entry=entry_meta(entry),
            embedding=encode_vec(vector)))

    def dropped(self, key: tuple[str, str, str], entry_id: str) -> None:
        namespace, experiment_id, arm_key = key
        self.publisher.publish_entry(EntryMessage(change="drop", origin=self.instance_id, namespace=namespace,
                                                  experiment_id=experiment_id, arm_key=arm_key, entry_id=entry_id))

    def voted(self, key: tuple[str, str, str], entry_id: str, unit_id: str, arm: str) -> None:
        namespace, experiment_id, arm_key = key
        self.publisher.publish_entry(EntryMessage(
            change="vote", origin=self.instance_id, namespace=namespace, experiment_id=experiment_id,
            arm_key=arm_key, entry_id=entry_id, vote=WrongVote(unit_id=unit_id, arm=arm)))

    def judged(self, judged: Judged) -> None:
        """A verdict an error-bounded arm learnt from here (cache_core.state.learning)."""
        self.publisher.publish_entry(EntryMessage(
            change="judged", origin=self.instance_id, experiment_id=judged.experiment_id, entry_id=judged.entry_id,
            judged=JudgedLookup(arm=judged.arm, cluster=judged.cluster, similarity=judged.similarity,
                                wrong=judged.wrong, check_prob=judged.check_prob,
                                audit=None if judged.audit is None else list(judged.audit))))

    def purged(self, namespace: str, purged_at: float, match: EntryMatch) -> None:
        self.publisher.publish_entry(EntryMessage(change="purge", origin=self.instance_id, namespace=namespace,
                                                  ts_ms=int(purged_at * 1000), purge=PurgeMatch(**asdict(match))))

    def cleared(self, namespace: str, cleared_at: float) -> None:
        self.publisher.publish_entry(EntryMessage(change="clear", origin=self.instance_id,
                                                  ts_ms=int(cleared_at * 1000), namespace=namespace))

    # OnlineClusters.listener: the intent clusters are one model across replicas.

    def cluster_opened(self, cluster_id: int, centroid, opened_at_ms: int) -> None:
        self.publisher.publish_entry(EntryMessage(change="cluster", origin=self.instance_id, ts_ms=opened_at_ms,
                                                  model=self.model, cluster_id=cluster_id,
                                                  embedding=encode_vec(centroid)))

    def clusters_retrained(self, model: ClusterModel) -> None:
        self._send_model(model, int(self.clock() * 1000))

    def clusters_refreshed(self, model: ClusterModel, sent_at_ms: int) -> None:
        """Re-send the model in use (``OnlineClusters.model_in_use``), under its trainer's origin."""
        self._send_model(model, sent_at_ms, model_origin=model.origin)

    def _send_model(self, model: ClusterModel, sent_at_ms: int, model_origin: str | None = None) -> None:
        self.publisher.publish_entry(EntryMessage(
            change="clusters", origin=self.instance_id, ts_ms=sent_at_ms, model=self.model,
            clusters=ClusterModelPayload(
                generation=model.generation, trained_at_ms=model.trained_at_ms, ids=model.ids,
                counts=model.counts, centroids=encode_vec(model.centroids.reshape(-1)),
                model_origin=model_origin, opened_at_ms=model.opened_at_ms, merged_ids=model.merged_ids)))


def share(cache, publisher, instance_id: str, model: str) -> EntryFeed:
    """Send ``cache``'s stored entries, clears and intent-cluster changes to the entries topic
    through ``publisher``; its clusters draw ids unique across replicas. Returns the feed."""
    feed = EntryFeed(publisher, instance_id, model, clock=cache.clock)
    cache.entry_feed = feed
    cache.clusters.fleet_ids, cache.clusters.origin, cache.clusters.listener = True, instance_id, feed
    return feed


class EntryFollower(TopicFollower):
    """Applies the other replicas' entry changes to ``cache``, and keeps a recent copy of its
    intent-cluster model on the topic; see the module docstring.
    ``state_dir``: where the applied offsets are kept (None: always replay from the start).
    ``cluster_refresh_s``: see ``cache_core.settings.cluster_refresh_s`` (None: a third of the
    retention); ``clock`` (default: the cache's) and ``rng`` time the refresh."""

    thread_name = "scache-entries"

    def __init__(self, kafka: KafkaSettings, cache, instance_id: str, model: str, *,
                 state_dir: Path | None = None, poll_timeout_s: float = 0.5, retry_s: float = 1.0,
                 cluster_refresh_s: float | None = None, clock=None, rng: random.Random | None = None):
        super().__init__(kafka, kafka.entries_topic, poll_timeout_s=poll_timeout_s, retry_s=retry_s,
                         counters=OUTCOMES + ("cluster_refreshes",))
        self.cache = cache
        self.instance_id = instance_id
        self.model = model
        self.offsets_path = Path(state_dir) / OFFSETS_FILE if state_dir is not None else None
        self._cleared_at: dict[str, float] = {}
        self._unknown_changes: set[str] = set()
        self._purges: dict[str, list[tuple[float, EntryMatch]]] = {}  # recent purges, for late puts
        # Past the topic's retention (which the deploy notes ask to cover the longest entry
        # lifetime) no put created before a clear or purge can still arrive alive: forget it,
        # or one key per namespace ever cleared stays in memory and in every offsets write.
        self.remember_s = kafka.entries_retention_ms / 1000
        self._saved_at = float("-inf")
        self.cluster_refresh_s = cluster_refresh_s_in_effect(kafka, cluster_refresh_s)
        self.clock = clock or cache.clock
        self._rng = rng or random.Random()
        self._model_sent_ms: int | None = None  # newest model message read: the model in use or a later one
        self._refresh_at_ms: float | None = None

    # -- position ---------------------------------------------------------------------

    def start_offsets(self) -> dict[TopicPartition, int]:
        if self.offsets_path is None or not self.offsets_path.exists():
            return {}
        try:
            saved = json.loads(self.offsets_path.read_text())
            if saved.get("topic") != self.topic:
                return {}  # another topic's positions mean nothing here
            self._cleared_at = {ns: float(at) for ns, at in saved.get("cleared_at", {}).items()}
            self._purges = {ns: [(float(at), EntryMatch(**match)) for at, match in purges]
                            for ns, purges in saved.get("purges", {}).items()}
            return {TopicPartition(self.topic, int(p)): int(o) for p, o in saved["offsets"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("unreadable replication offsets, replaying the entries topic",
                        extra={"path": str(self.offsets_path), "error": str(exc)})
            return {}

    def after_batch(self) -> None:
        # At most once a second: re-reading a second's messages after a crash only finds duplicates.
        if self.offsets_path is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self._save_offsets()

    def after_poll(self) -> None:
        self.refresh_clusters()

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        if self.offsets_path is not None and not self.stats()["alive"] and self._positions:
            self._save_offsets()

    def forget_old_removals(self) -> int:
        """Drop the clears and purges older than the retention; returns how many went."""
        horizon = self.clock() - self.remember_s
        old_clears = [ns for ns, at in self._cleared_at.items() if at < horizon]
        for ns in old_clears:
            del self._cleared_at[ns]
        dropped = len(old_clears)
        for ns in list(self._purges):
            kept = [(at, match) for at, match in self._purges[ns] if at >= horizon]
            dropped += len(self._purges[ns]) - len(kept)
            if kept:
                self._purges[ns] = kept
            else:
                del self._purges[ns]
        return dropped

    def _save_offsets(self) -> None:
        self.cache.sync_journal()  # offsets may only move past what the write-ahead log holds durably
        self.forget_old_removals()
        body = {"topic": self.topic, "offsets": {str(tp.partition): o for tp, o in self.positions.items()},
                "cleared_at": self._cleared_at,
                "purges": {ns: [[at, asdict(match)] for at, match in purges] for ns, purges in self._purges.items()}}
        tmp = self.offsets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.offsets_path)
        self._saved_at = time.monotonic()

    # -- keeping the cluster model on the topic ---------------------------------------

    def refresh_clusters(self) -> bool:
        """Re-send the cluster model in use if the newest copy on the topic is due (see the module
        docstring). True when it sent one."""
        feed = getattr(self.cache, "entry_feed", None)
        if feed is None or not self._caught_up.is_set():
            return False  # before the replay ends, neither the model nor the newest copy are known
        now_ms = int(self.clock() * 1000)
        if self._refresh_at_ms is None:  # the topic holds no model: count from now
            self._refresh_at_ms = self._refresh_deadline(now_ms)
        if now_ms < self._refresh_at_ms:
            return False
        model = self.cache.clusters.model_in_use()
        if model is None:
            return False
        last = self._model_sent_ms
        feed.clusters_refreshed(model, now_ms)
        self._counts["cluster_refreshes"] += 1
        self._noted_model(now_ms)  # not again until due again, even if the echo is slow (broker down)
        log.info("intent-cluster model re-sent", extra={
            "generation": model.generation, "model_origin": model.origin, "clusters": len(model.ids),
            "newest_copy_age_s": None if last is None else round((now_ms - last) / 1000, 1)})
        return True

    def _noted_model(self, sent_at_ms: int) -> None:
        sent_at_ms = min(sent_at_ms, int(self.clock() * 1000))  # a clock ahead must not hold refreshes off
        if self._model_sent_ms is None or sent_at_ms > self._model_sent_ms:
            self._model_sent_ms = sent_at_ms
            self._refresh_at_ms = self._refresh_deadline(sent_at_ms)

    def _refresh_deadline(self, since_ms: int) -> float:
        return since_ms + self.cluster_refresh_s * 1000 * (1 + CLUSTER_REFRESH_JITTER * self._rng.random())

    # -- records ----------------------------------------------------------------------

    def handle(self, record, tp: TopicPartition) -> None:
        try:
            message = EntryMessage.model_validate_json(record.value or b"")
        except ValidationError:
            if self._skipped_unknown_change(record.value):
                return
            message = self.parse(EntryMessage, record, tp)  # counted and logged as malformed
        if message is not None:
            self._counts[self._apply(message)] += 1

    def _skipped_unknown_change(self, value: bytes | None) -> bool:
        try:
            change = json.loads(value or b"").get("change")
        except (ValueError, AttributeError):  # not JSON, or not an object
            return False
        if not isinstance(change, str) or change in KNOWN_CHANGES:
            return False
        self._counts["unknown_change"] += 1
        if change not in self._unknown_changes:
            self._unknown_changes.add(change)
            log.warning("skipping entry changes of a kind this version does not know (a newer replica's?)",
                        extra={"change": change[:64], "topic": self.topic})
        return True

    def _apply(self, message: EntryMessage) -> str:
        own = message.origin == self.instance_id
        if message.change == "clusters":  # also our own: see the module docstring
            outcome = self._apply_model(message)
            return "own" if own else outcome
        if message.change == "cluster":
            return "own" if own else self._apply_open(message)
        if message.change == "clear":
            cleared_at = message.ts_ms / 1000
            self._cleared_at[message.namespace] = max(cleared_at, self._cleared_at.get(message.namespace, 0.0))
            # Also our own: it removes the other replicas' older entries that arrived after the local clear.
            self.cache.apply(Clear(message.namespace, cleared_at), "replica")
            return "own" if own else "clears"
        if message.change == "purge":  # also our own, as a clear
            return "own" if own else self._apply_purge(message)
        if message.change == "drop":  # an entry feedback took out of service (cache_core.state.feedback)
            outcome = self.cache.apply(
                Remove((message.namespace, message.experiment_id, message.arm_key), message.entry_id), "replica")
            return "own" if own else outcome
        if message.change == "vote":  # also our own: idempotent, and it gives a restarted replica its votes back
            outcome = self.cache.apply(
                Vote((message.namespace, message.experiment_id, message.arm_key), message.entry_id,
                     message.vote.unit_id, message.experiment_id, message.vote.arm), "replica")
            return "own" if own else outcome
        if message.change == "judged":  # our own was recorded (and logged) when it was made
            judged = message.judged
            return "own" if own else self.cache.apply(Judged(
                message.experiment_id, judged.arm, message.entry_id, judged.cluster, judged.similarity,
                judged.wrong, judged.check_prob, None if judged.audit is None else tuple(judged.audit)), "replica")
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
        purges = self._purges.get(message.namespace, ())
        if any(entry.created_at < at and match.matches(entry) for at, match in purges):
            return "purged_before"
        return self.cache.apply(Put((message.namespace, message.experiment_id, message.arm_key), entry), "replica")

    def _apply_purge(self, message: EntryMessage) -> str:
        try:
            match = EntryMatch(**message.purge.model_dump())
        except InvalidRequest:
            return "malformed"
        purged_at = message.ts_ms / 1000
        purges = self._purges.setdefault(message.namespace, [])
        purges.append((purged_at, match))
        del purges[:-PURGES_REMEMBERED]
        self.cache.apply(Purge(message.namespace, purged_at, match), "replica")
        return "purges"

    def _apply_open(self, message: EntryMessage) -> str:
        if message.model != self.model:
            return "other_model"
        try:
            vector = decode_vec(message.embedding)
        except ValueError:
            return "malformed"
        if vector.shape != (self.cache.embedder.dim,):
            return "other_model"
        adopted = self.cache.clusters.adopt_open(message.cluster_id, vector, message.ts_ms, origin=message.origin)
        return "clusters" if adopted else "duplicate"  # duplicate: known, or merged into a concurrent open

    def _apply_model(self, message: EntryMessage) -> str:
        if message.model != self.model:
            return "other_model"
        clusters, dim, payload = self.cache.clusters, self.cache.embedder.dim, message.clusters
        try:
            centroids = decode_vec(payload.centroids)
        except ValueError:
            return "malformed"
        if len(payload.ids) != len(payload.counts) or centroids.size != len(payload.ids) * dim:
            return "malformed"
        origin = message.origin if payload.model_origin is None else payload.model_origin
        model = ClusterModel(payload.generation, origin, payload.trained_at_ms, payload.ids, payload.counts,
                             centroids.reshape(len(payload.ids), dim), opened_at_ms=dict(payload.opened_at_ms),
                             merged_ids=dict(payload.merged_ids))
        in_use = (clusters.generation, clusters.model_origin)
        if model.order() >= in_use:
            self._noted_model(message.ts_ms)  # the topic holds the model in use (or a later one) since then
        if clusters.adopt_model(model):
            return "clusters"
        return "duplicate" if model.order() == in_use else "stale"
