"""Keeping the intent-cluster model within the entries topic's retention: replicas re-send the
model in use when the newest copy on the topic grows old (cache_core.state.replication, "Refresh" in
cache_core.clusters). Replicas are wired without a broker, as in test_replication."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from cache_core.clusters import ClusterModel, OnlineClusters
from cache_core.state.replication import EntryFollower
from cache_core.settings import CLUSTER_REFRESH_JITTER, KafkaSettings, Settings, cluster_refresh_s
from tests.unit.cache_core.helpers import ManualClock, unit_in_arm
from tests.unit.cache_core.state.test_replication import KAFKA, MODEL, _deliver, _replica

PIN = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
PIN_PARAPHRASE = np.array([0.97, 0.24, 0.0, 0.0], np.float32) / np.float32(np.hypot(0.97, 0.24))
ACCOUNT = np.array([0.0, 0.0, 1.0, 0.0], np.float32)


class Topic:
    """One append-only log of the cluster messages the given caches publish from now on,
    which each follower reads on from where it stopped."""

    def __init__(self, *caches):
        self.values: list[bytes] = []
        self.read: dict[int, int] = {}
        for cache in caches:
            cache.entry_feed.publisher = self

    def publish_entry(self, message) -> None:
        if message.change in ("cluster", "clusters"):
            self.values.append(message.model_dump_json().encode())

    def deliver(self, follower: EntryFollower) -> None:
        start = self.read.get(id(follower), 0)
        self.read[id(follower)] = len(self.values)
        _deliver(self.values[start:], follower)


def _replayed(follower: EntryFollower, seed: int = 7) -> EntryFollower:
    follower._caught_up.set()  # what the loop sets once the topic present at connect time is read
    follower._rng = random.Random(seed)  # each replica draws its own jitter
    return follower


def _same_texts(cache, like) -> None:
    """Give ``cache``'s table embedder the vectors ``like``'s drew for its texts."""
    cache.embedder.table.update(like.embedder.table)


def _far_from(cache) -> np.ndarray:
    """A direction that opens a cluster of its own, far from every centroid and every vector
    ``cache`` has seen (so no concurrent-open merge takes it: the test's opens are all recent)."""
    seen = np.stack([v / np.linalg.norm(v) for v in cache.embedder.table.values()])
    rng = np.random.default_rng(11)
    for vec in rng.standard_normal((5000, cache.embedder.dim)).astype(np.float32):
        vec /= np.linalg.norm(vec)
        if max(cache.clusters.nearest(vec)[1], float((seen @ vec).max())) < cache.clusters.radius - 0.05:
            return vec
    raise AssertionError("no direction far from every centroid")


def _model_messages(values: list[bytes]) -> list[dict]:
    return [m for m in map(json.loads, values) if m["change"] == "clusters"]


def _fleet_with_a_model():
    """Replica a retrains (generation 1) then opens more clusters; b has read all of it and
    opened one of its own since, whose open a has not read yet."""
    clock = ManualClock()
    a, feed_a, follower_a, exp = _replica("a", clock)
    b, feed_b, follower_b, _ = _replica("b", clock)
    unit = unit_in_arm(exp, "a")
    for i in range(40):
        a.lookup(f"q{i}", unit)  # unknown texts: random directions, many clusters
    assert a.clusters.retrain() is not None
    trained = set(a.clusters.ids())
    for i in range(40, 46):
        a.lookup(f"q{i}", unit)
    late = set(a.clusters.ids()) - trained
    assert late, "no cluster opened after the retrain"
    _deliver(list(feed_a.cluster_values), follower_a)  # a reads its own messages back
    _deliver(list(feed_a.cluster_values), follower_b)
    _same_texts(b, a)
    b.embedder.table["b's own intent"] = _far_from(a)
    b_own = b.lookup("b's own intent", unit).intent_cluster
    assert b_own not in a.clusters.ids()
    return clock, unit, (a, feed_a, _replayed(follower_a)), (b, feed_b, _replayed(follower_b, 8)), late, b_own


def test_a_model_resent_after_the_interval_gives_a_fresh_replica_the_same_ids_and_centroids():
    clock, unit, (a, feed_a, follower_a), (_, feed_b, _), late, b_own = _fleet_with_a_model()
    sent = len(feed_a.cluster_values)
    assert not follower_a.refresh_clusters()  # its model was just sent
    clock.advance(follower_a.cluster_refresh_s * (1 + CLUSTER_REFRESH_JITTER) + 1)
    assert follower_a.refresh_clusters()
    [refresh] = feed_a.cluster_values[sent:]
    message = json.loads(refresh)
    assert message["clusters"]["generation"] == 1 and message["clusters"]["model_origin"] == "a"
    assert message["ts_ms"] == int(clock() * 1000)

    # A replica starting once the original model and every open have left the topic.
    fresh, _, follower, _ = _replica("fresh", clock)
    _deliver([refresh], follower)
    assert follower.stats()["clusters"] == 1
    assert fresh.clusters.ids() == a.clusters.ids()
    assert (fresh.clusters.generation, fresh.clusters.model_origin) == (1, "a")
    assert np.allclose(fresh.clusters.export_state()["centroids"], a.clusters.export_state()["centroids"], atol=1e-6)
    assert fresh.clusters.export_state()["counts"] == a.clusters.export_state()["counts"]
    _same_texts(fresh, a)
    for i in (3, 41, 44):  # intents from before and after the retrain: the same id on both
        assert fresh.lookup(f"q{i}", unit).intent_cluster == a.lookup(f"q{i}", unit).intent_cluster
    # the clusters opened after the model's sample keep their open times, so a later model keeps them alike
    assert {cid for cid, _ in fresh.clusters.export_state()["opened_at_ms"]} >= late

    # One that also read an open a had not heard of when it sent the copy keeps that cluster too.
    b_open = [v for v in feed_b.cluster_values if json.loads(v)["change"] == "cluster"]
    other, _, other_follower, _ = _replica("other", clock)
    _deliver(b_open + [refresh], other_follower)
    assert other.clusters.ids() == a.clusters.ids() + [b_own]

    # Without the refresh the same replica would know nothing of them.
    bare, _, bare_follower, _ = _replica("bare", clock)
    _deliver([v for v in feed_a.cluster_values[sent:] if v != refresh], bare_follower)
    assert len(bare.clusters) == 0


def test_a_replica_on_the_model_is_unchanged_by_a_refresh_from_itself_or_another():
    clock, unit, (a, feed_a, follower_a), (b, feed_b, follower_b), _, b_own = _fleet_with_a_model()
    b.lookup("q3", unit)  # b's own traffic moves its centroids
    states = lambda: (a.clusters.export_state(), b.clusters.export_state())
    before = states()
    assert b_own in before[1]["ids"] and b_own not in before[0]["ids"]  # its open has not reached a yet
    clock.advance(follower_a.cluster_refresh_s * (1 + CLUSTER_REFRESH_JITTER) + 1)
    sent = len(feed_a.cluster_values)
    assert follower_a.refresh_clusters()  # the trainer re-sends it
    _deliver(feed_a.cluster_values[sent:], follower_b)
    assert follower_b.stats()["duplicate"] == 1

    _deliver(feed_b.cluster_values, follower_a)  # b's open arrives
    before = states()
    clock.advance(follower_b.cluster_refresh_s * (1 + CLUSTER_REFRESH_JITTER) + 1)
    sent = len(feed_b.cluster_values)
    assert follower_b.refresh_clusters()  # another replica re-sends it, under the trainer's origin
    _deliver(feed_b.cluster_values[sent:], follower_a)
    assert follower_a.stats()["duplicate"] == 1
    for old, new in zip(before, states()):
        assert new["ids"] == old["ids"]
        assert (new["generation"], new["model_origin"], new["trained_at_ms"]) == (1, "a", old["trained_at_ms"])
        assert np.array_equal(new["centroids"], old["centroids"]) and new["counts"] == old["counts"]
        assert new["opened_at_ms"] == old["opened_at_ms"]


def test_one_refresh_per_interval_however_many_replicas_and_none_while_a_recent_copy_exists():
    clock, _, (a, feed_a, follower_a), (b, feed_b, follower_b), _, _ = _fleet_with_a_model()
    _deliver(feed_b.cluster_values, follower_a)  # both have read everything so far (b's open included)
    retrained_at = _model_messages(feed_a.cluster_values)[0]["ts_ms"]
    topic = Topic(a, b)
    interval = follower_a.cluster_refresh_s
    refreshes = lambda: sum(f.stats()["cluster_refreshes"] for f in (follower_a, follower_b))
    for _ in range(6 * 60):  # every minute for six intervals, each replica checking and reading
        clock.advance(interval / 60)
        for follower in (follower_b, follower_a):
            follower.refresh_clusters()
            for reader in (follower_a, follower_b):
                topic.deliver(reader)
    # one copy per interval (+ its jitter), never one per replica
    assert 5 <= refreshes() <= 6, refreshes()
    sent = [retrained_at] + [m["ts_ms"] for m in _model_messages(topic.values)]
    gaps = np.diff(sent) / 1000
    assert gaps.min() >= interval and gaps.max() <= interval * (1 + CLUSTER_REFRESH_JITTER) + interval / 60
    assert follower_a.stats()["cluster_refreshes"] >= 1 and follower_b.stats()["cluster_refreshes"] >= 1
    assert a.clusters.ids() == b.clusters.ids()  # a took in b's open; the copies moved nothing


def test_nothing_is_sent_before_the_replay_ends_or_while_there_are_no_clusters():
    clock = ManualClock()
    a, feed_a, follower_a, exp = _replica("a", clock)
    clock.advance(follower_a.cluster_refresh_s * 3)
    assert not follower_a.refresh_clusters()  # not caught up yet
    _replayed(follower_a)
    assert not follower_a.refresh_clusters()  # no model on the topic: counts from now
    clock.advance(follower_a.cluster_refresh_s * (1 + CLUSTER_REFRESH_JITTER) + 1)
    assert not follower_a.refresh_clusters() and feed_a.cluster_values == []  # due, but nothing to send
    opened = a.lookup("reset my pin", unit_in_arm(exp, "a")).intent_cluster
    assert follower_a.refresh_clusters()  # before any retrain: generation 0, every cluster an open
    clock.advance(follower_a.cluster_refresh_s / 2)
    assert not follower_a.refresh_clusters()  # its copy has not come back (broker down?): not again yet
    refresh = _model_messages(feed_a.cluster_values)[0]["clusters"]
    assert (refresh["generation"], refresh["model_origin"], refresh["ids"]) == (0, "", [opened])
    fresh, _, follower, _ = _replica("fresh", clock)
    _deliver([feed_a.cluster_values[-1]], follower)
    assert fresh.clusters.ids() == [opened]


def test_a_cluster_is_left_out_of_a_refresh_until_its_open_is_queued():
    clusters = OnlineClusters(4, radius=0.8, background=False, retrain_min=10**9)
    clusters.fleet_ids, clusters.origin = True, "a"
    seen: list[list[int]] = []

    def opened(cid, vec, at_ms):  # a refresh on the follower thread, just before the open is queued
        model = clusters.model_in_use()
        seen.append([] if model is None else model.ids)

    clusters.listener = SimpleNamespace(cluster_opened=opened, clusters_retrained=lambda m: None)
    first = clusters.assign(PIN)
    clusters.assign(ACCOUNT)
    assert seen == [[], [first]]
    assert clusters.model_in_use().ids == clusters.ids()


def test_a_fresh_replica_that_read_the_old_model_gets_the_opens_the_topic_lost_from_a_refresh():
    publisher = OnlineClusters(4, radius=0.8, background=False, retrain_min=10**9)
    publisher.fleet_ids, publisher.origin = True, "a"
    original = ClusterModel(1, "b", 1_000, [5_000_001], [10], PIN[None, :].copy())
    assert publisher.adopt_model(original)
    assert publisher.adopt_open(5_000_002, ACCOUNT, 2_000, origin="c")  # its open has left the topic
    fresh = OnlineClusters(4, radius=0.8, background=False, retrain_min=10**9)
    assert fresh.adopt_model(original)  # still on the topic
    assert fresh.adopt_model(publisher.model_in_use())  # the same model: only what it lacks
    assert fresh.ids() == [5_000_001, 5_000_002] and (fresh.generation, fresh.model_origin) == (1, "b")
    # and a model whose sample was taken before that open keeps it, as on the publisher
    later = ClusterModel(2, "d", 1_500, [5_000_001], [12], PIN[None, :].copy())
    assert fresh.adopt_model(later) and publisher.adopt_model(later)
    assert fresh.ids() == publisher.ids() == [5_000_001, 5_000_002]


def test_a_refresh_carries_merges_so_a_fresh_replica_holding_only_the_loser_ends_with_the_survivor():
    publisher = OnlineClusters(4, radius=0.8, background=False, retrain_min=10**9)
    assert publisher.adopt_open(5_000_001, PIN, 1_000, origin="b")
    assert not publisher.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="c")  # merged into 5_000_001
    refresh = publisher.model_in_use()
    assert refresh.merged_ids == {5_000_002: 5_000_001}
    fresh = OnlineClusters(4, radius=0.8, background=False, retrain_min=10**9)
    assert fresh.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="c")  # the survivor's open is gone
    assert fresh.adopt_model(refresh)
    assert fresh.ids() == [5_000_001] and fresh.merged_ids == {5_000_002: 5_000_001}
    assert not fresh.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="c")  # redelivered: still a loser


def test_a_replica_restarted_without_state_under_its_own_id_gets_its_model_back():
    clock, unit, (a, feed_a, _), _, _, _ = _fleet_with_a_model()
    restarted, _, follower, _ = _replica("a", clock)
    _same_texts(restarted, a)
    _deliver([v for v in feed_a.cluster_values if json.loads(v)["change"] == "clusters"], follower)
    assert follower.stats()["own"] == 1 and follower.stats()["clusters"] == 0
    assert (restarted.clusters.generation, restarted.clusters.model_origin) == (1, "a")
    assert restarted.lookup("q3", unit).intent_cluster == a.lookup("q3", unit).intent_cluster


def test_the_refresh_interval_defaults_to_a_third_of_the_retention_and_must_stay_below_it():
    kafka = KafkaSettings(entries_retention_ms=3_600_000)
    assert cluster_refresh_s(kafka) == 1200
    assert cluster_refresh_s(kafka, 60) == 60
    with pytest.raises(ValueError, match="below the entries topic's retention"):
        cluster_refresh_s(kafka, 3400)  # + 10% jitter: past the retention
    with pytest.raises(ValueError, match="CLUSTER_REFRESH_S"):
        Settings(kafka=kafka, cache={"cluster_refresh_s": 3600})
    assert EntryFollower(kafka, SimpleNamespace(clock=ManualClock()), "x", MODEL).cluster_refresh_s == 1200
    assert EntryFollower(KAFKA, SimpleNamespace(clock=ManualClock()), "x", MODEL).cluster_refresh_s == 8 * 3600
