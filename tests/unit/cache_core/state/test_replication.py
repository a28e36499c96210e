"""Entry replication between cache replicas (cache_core.state.replication), without a broker:
one cache's EntryFeed messages are handed to another cache's EntryFollower as records."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from kafka import TopicPartition

from cache_core.cache import SemanticCache
from cache_core.records import EntryMatch
from cache_core.clusters import FLEET_ID_MIN, ClusterModel, OnlineClusters
from cache_core.events import EntryMessage
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from cache_core.state.replication import EntryFeed, EntryFollower, share
from cache_core.settings import KafkaSettings
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, experiment, unit_in_arm, unit_vec

MODEL = "test-model"
KAFKA = KafkaSettings(entries_topic="entries.unit")
TP = TopicPartition(KAFKA.entries_topic, 0)


class Feed:
    """Collects what EntryFeed publishes, as the publisher would send it: entry changes in
    ``values``, intent-cluster changes in ``cluster_values``."""

    def __init__(self):
        self.values: list[bytes] = []
        self.cluster_values: list[bytes] = []

    def publish_entry(self, message: EntryMessage) -> None:
        clusters = message.change in ("cluster", "clusters")
        (self.cluster_values if clusters else self.values).append(message.model_dump_json().encode())


def _embedder() -> TableEmbedder:
    return TableEmbedder({"reset my pin": unit_vec(1, 0), "pin reset please": unit_vec(0.97, 0.24),
                          "open an account": unit_vec(0, 1), "close my account": unit_vec(0, 0, 1)})


def _replica(name: str, clock: ManualClock, exp=None, embedder=None):
    exp = exp or experiment(ArmConfig(name="a", threshold=0.9), ArmConfig(name="b", threshold=0.9))
    cache = SemanticCache(embedder or _embedder(), ExperimentRegistry({exp.experiment_id: exp}), clock=clock,
                          instance_id=name)
    feed = Feed()
    share(cache, feed, name, MODEL)
    follower = EntryFollower(KAFKA, cache, name, MODEL)
    return cache, feed, follower, exp


def _pair():
    """Replicas a and b on one clock, and a unit of arm a."""
    clock = ManualClock()
    a, feed_a, _, exp = _replica("a", clock)
    b, feed_b, follower_b, _ = _replica("b", clock)
    return clock, (a, feed_a), (b, feed_b, follower_b), unit_in_arm(exp, "a")


def _deliver(values: list[bytes], follower: EntryFollower, start: int = 0) -> None:
    for offset, value in enumerate(values, start):
        follower._positions[TP] = offset + 1
        follower.handle(SimpleNamespace(value=value, offset=offset), TP)
    follower.after_batch()


def test_an_entry_stored_on_one_replica_hits_on_another_in_the_same_arm_only():
    clock = ManualClock()
    a, feed_a, _, exp = _replica("a", clock)
    b, _, follower_b, _ = _replica("b", clock)
    unit_a, unit_b = unit_in_arm(exp, "a"), unit_in_arm(exp, "b")
    assert a.store("reset my pin", "Card > PIN", unit_a).stored
    assert not b.lookup("pin reset please", unit_a).hit

    _deliver(feed_a.values, follower_b)

    hit = b.lookup("pin reset please", unit_a)
    assert hit.hit and hit.answer == "Card > PIN"
    assert not b.lookup("reset my pin", unit_b).hit  # arm b's store got nothing from arm a
    assert follower_b.stats()["applied"] == 1
    [original] = [e for p in a.partitions() for e in p.entries.values()]
    [copy] = [e for p in b.partitions() for e in p.entries.values()]
    assert np.array_equal(original.embedding, copy.embedding)  # exactly, not re-encoded
    assert (copy.entry_id, copy.created_at, copy.intent_cluster) == \
        (original.entry_id, original.created_at, original.intent_cluster)


def test_own_changes_come_back_as_own_and_restore_a_replica_restarted_without_persistence():
    clock = ManualClock()
    a, feed_a, follower_a, exp = _replica("a", clock)
    b, _, follower_b, _ = _replica("b", clock)
    a.store("reset my pin", "Card > PIN", unit_in_arm(exp, "a"))
    _deliver(feed_a.values, follower_a)
    _deliver(feed_a.values * 2, follower_b)
    assert follower_a.stats()["own"] == 1 and follower_a.stats()["applied"] == 0
    assert (follower_b.stats()["applied"], follower_b.stats()["duplicate"]) == (1, 1)
    assert sum(len(p) for p in b.partitions()) == 1

    restarted, _, follower, _ = _replica("a", clock)  # same instance id, nothing on disk
    _deliver(feed_a.values, follower)
    assert follower.stats()["applied"] == 1 and restarted.lookup("reset my pin", unit_in_arm(exp, "a")).hit


def test_expired_other_model_and_malformed_messages_are_counted_and_skipped():
    clock = ManualClock()
    a, feed_a, _, exp = _replica("a", clock)
    unit = unit_in_arm(exp, "a")
    a.store("reset my pin", "Card > PIN", unit, ttl_s=60)
    late = _replica("late", clock)
    clock.advance(120)
    _deliver(feed_a.values, late[2])
    assert late[2].stats()["expired"] == 1

    put = json.loads(feed_a.values[0])
    other_model = json.dumps({**put, "model": "another-model"}).encode()
    bad_base64 = json.dumps({**put, "embedding": "not base64!"}).encode()
    missing_entry = json.dumps({**put, "entry": None}).encode()
    unknown_field = json.dumps({**put, "entry": {**put["entry"], "colour": "red"}}).encode()
    b, _, follower_b, _ = _replica("b", clock)
    _deliver([other_model, b"not json", missing_entry, unknown_field, bad_base64], follower_b)
    stats = follower_b.stats()
    assert (stats["other_model"], stats["malformed"], stats["applied"]) == (1, 4, 0), stats
    assert stats["handler_errors"] == 0 and sum(len(p) for p in b.partitions()) == 0
    # a change kind from a newer version (rolling upgrade) is skipped as such, not as malformed
    newer = [json.dumps({**put, "change": "rename"}).encode(), json.dumps({**put, "change": "rename"}).encode()]
    _deliver(newer, follower_b, start=10)
    stats = follower_b.stats()
    assert (stats["unknown_change"], stats["malformed"], stats["applied"]) == (2, 4, 0), stats
    # a vector of another dimension (another model under the same name) is not indexed
    short = json.dumps({**put, "embedding": put["embedding"][:16]}).encode()
    _deliver([short], follower_b, start=5)
    assert follower_b.stats()["other_model"] == 2


def test_the_newer_answer_to_the_same_text_wins_in_either_order():
    clock, (a, feed_a), (b, feed_b, follower_b), unit = _pair()
    a.store("reset my pin", "old answer", unit)
    clock.advance(5)
    b.store("reset my pin", "new answer", unit)

    _deliver(feed_a.values, follower_b)  # the older one arrives after B's own newer entry
    assert follower_b.stats()["stale"] == 1
    assert b.lookup("reset my pin", unit).answer == "new answer"

    follower_a = EntryFollower(KAFKA, a, "a", MODEL)
    _deliver(feed_b.values, follower_a)  # the newer one replaces A's older entry
    assert follower_a.stats()["applied"] == 1
    assert a.lookup("reset my pin", unit).answer == "new answer"
    assert sum(len(p) for p in a.partitions()) == 1


def test_a_clear_removes_what_was_created_before_it_and_drops_older_puts_arriving_late():
    clock, (a, feed_a), (b, _, follower_b), unit = _pair()
    b.store("reset my pin", "before", unit)
    a.store("close my account", "spooled on A, created before the clear", unit)
    clock.advance(1)
    a.clear_namespace("default")
    clock.advance(1)
    b.store("open an account", "after", unit)

    clear = [v for v in feed_a.values if json.loads(v)["change"] == "clear"]
    late_put = [v for v in feed_a.values if json.loads(v)["change"] == "put"]
    _deliver(clear + late_put, follower_b)

    stats = follower_b.stats()
    assert (stats["clears"], stats["cleared_before"], stats["applied"]) == (1, 1, 0), stats
    assert not b.lookup("reset my pin", unit).hit
    assert b.lookup("open an account", unit).hit


def test_this_replicas_capacity_and_lru_apply_to_replicated_entries():
    clock = ManualClock()
    a, feed_a, _, exp = _replica("a", clock, experiment(ArmConfig(name="a", threshold=0.9)))
    # B's config is the same experiment with a smaller store (replicas may be sized differently)
    b, _, follower_b, _ = _replica("b", clock, experiment(ArmConfig(name="a", threshold=0.9, capacity_entries=2)))
    unit = unit_in_arm(exp, "a")
    for text in ("reset my pin", "open an account", "close my account"):
        a.store(text, text.upper(), unit)
        clock.advance(1)
    _deliver(feed_a.values, follower_b)
    assert follower_b.stats()["applied"] == 3
    assert sum(len(p) for p in b.partitions()) == 2
    assert not b.lookup("reset my pin", unit).hit  # the least recently used went


def test_offsets_and_clear_times_survive_a_restart(tmp_path):
    clock, (a, feed_a), (b, _, _), unit = _pair()
    a.store("reset my pin", "Card > PIN", unit)
    a.clear_namespace("default")
    follower = EntryFollower(KAFKA, b, "b", MODEL, state_dir=tmp_path)
    _deliver(feed_a.values, follower)

    again = EntryFollower(KAFKA, b, "b", MODEL, state_dir=tmp_path)
    assert again.start_offsets() == {TP: 2}
    assert again._cleared_at == {"default": clock()}

    (tmp_path / "replication-offsets.json").write_text("{not json")
    assert EntryFollower(KAFKA, b, "b", MODEL, state_dir=tmp_path).start_offsets() == {}
    other_topic = EntryFollower(KafkaSettings(entries_topic="elsewhere"), b, "b", MODEL, state_dir=tmp_path)
    (tmp_path / "replication-offsets.json").write_text(json.dumps({"topic": "entries.unit", "offsets": {"0": 7}}))
    assert other_topic.start_offsets() == {}


def test_a_put_message_must_carry_its_entry():
    with pytest.raises(ValueError, match="a put needs"):
        EntryMessage(change="put", origin="a", namespace="default")
    with pytest.raises(ValueError, match="instance id"):
        EntryFeed(Feed(), "", MODEL)


# -- one intent-cluster model across replicas ----------------------------------------------

def test_a_cluster_opened_on_one_replica_has_the_same_id_on_the_others():
    _, (a, feed_a), (b, _, follower_b), unit = _pair()
    opened = a.lookup("reset my pin", unit).intent_cluster
    assert opened >= FLEET_ID_MIN  # drawn unique across replicas, not 0, 1, 2 ...
    _deliver(feed_a.cluster_values, follower_b)
    assert follower_b.stats()["clusters"] == 1
    assert b.lookup("pin reset please", unit).intent_cluster == opened  # a paraphrase, on B
    _deliver(feed_a.cluster_values, follower_b)
    assert follower_b.stats()["duplicate"] == 1


def test_one_intent_opened_on_two_replicas_before_either_heard_of_it_ends_as_one_id():
    clock = ManualClock()
    a, feed_a, follower_a, exp = _replica("a", clock)
    b, feed_b, follower_b, _ = _replica("b", clock)
    unit = unit_in_arm(exp, "a")
    id_a = a.lookup("reset my pin", unit).intent_cluster
    id_b = b.lookup("pin reset please", unit).intent_cluster  # a paraphrase, before a's open arrived
    assert id_a != id_b
    _deliver(feed_b.cluster_values, follower_a)  # the follower passes the message's origin on
    _deliver(feed_a.cluster_values, follower_b)
    assert a.clusters.ids() == b.clusters.ids() and len(a.clusters) == 1
    survivor = a.clusters.ids()[0]
    assert a.clusters.merged_ids == b.clusters.merged_ids == {({id_a, id_b} - {survivor}).pop(): survivor}
    assert a.lookup("pin reset please", unit).intent_cluster == b.lookup("reset my pin", unit).intent_cluster


def test_every_replica_keeps_the_same_retrained_model_when_two_retrain_at_once():
    dim = 8
    rng = np.random.default_rng(3)
    replicas = {}
    for name in ("a", "b"):
        clusters = OnlineClusters(dim, radius=0.5, background=False, retrain_min=10**9)
        clusters.fleet_ids, clusters.origin = True, name
        models: list[ClusterModel] = []
        clusters.listener = SimpleNamespace(cluster_opened=lambda *a: None, clusters_retrained=models.append)
        for vec in rng.standard_normal((60, dim)).astype(np.float32):
            clusters.assign(vec / np.linalg.norm(vec))
        clusters.retrain()
        replicas[name] = (clusters, models[0])
    (a, model_a), (b, model_b) = replicas["a"], replicas["b"]
    assert model_a.order() == (1, "a") and model_b.order() == (1, "b")
    assert a.adopt_model(model_b) and not b.adopt_model(model_a)  # (1, "b") orders after (1, "a")
    assert a.ids() == b.ids() == model_b.ids
    probe = rng.standard_normal(dim).astype(np.float32)
    assert a.nearest(probe / np.linalg.norm(probe))[0] == b.nearest(probe / np.linalg.norm(probe))[0]


def test_adopting_a_model_keeps_later_clusters_and_drops_the_ones_it_retired():
    clusters = OnlineClusters(2, radius=0.99, background=False, retrain_min=10**9)
    assert clusters.adopt_open(5_000_001, np.array([1.0, 0.0]), opened_at_ms=1_000)  # before the sample
    assert clusters.adopt_open(5_000_002, np.array([0.0, 1.0]), opened_at_ms=9_000)  # after it
    model = ClusterModel(generation=2, origin="b", trained_at_ms=5_000, ids=[7_000_000],
                         counts=[10], centroids=np.array([[0.6, 0.8]], dtype=np.float32))
    assert clusters.adopt_model(model)
    assert clusters.ids() == [7_000_000, 5_000_002]
    assert not clusters.adopt_model(model)  # the same model again orders nowhere after itself
    state = clusters.export_state()
    restored = OnlineClusters(2)
    restored.load_state(state)
    assert (restored.generation, restored.model_origin) == (2, "b")


def test_a_retrain_reaches_the_other_replica_through_the_feed():
    _, (a, feed_a), (b, _, follower_b), unit = _pair()
    rng = np.random.default_rng(0)
    for i in range(40):
        a.embedder.table[f"q{i}"] = rng.standard_normal(8).astype(np.float32)
        a.lookup(f"q{i}", unit)
    assert a.clusters.retrain() is not None
    _deliver(feed_a.cluster_values, follower_b)
    assert (b.clusters.generation, b.clusters.model_origin) == (1, "a")
    assert b.clusters.ids() == a.clusters.ids()
    bad = json.loads(feed_a.cluster_values[-1])
    bad["clusters"]["ids"] = bad["clusters"]["ids"][:-1]
    _deliver([json.dumps(bad).encode()], follower_b, start=len(feed_a.cluster_values))
    assert follower_b.stats()["malformed"] == 1


def test_clears_and_purges_older_than_the_retention_are_forgotten(tmp_path):
    """One key per namespace ever cleared must not stay in memory and in every offsets write."""
    clock, (a, feed_a), (b, _, _), unit = _pair()
    a.store("reset my pin", "Card > PIN", unit)
    a.clear_namespace("default")
    a.purge("default", EntryMatch(provenance_source="kb"))
    follower = EntryFollower(KafkaSettings(entries_topic=KAFKA.entries_topic, entries_retention_ms=3_600_000),
                             b, "b", MODEL, state_dir=tmp_path)
    _deliver(feed_a.values, follower)
    clock.advance(1800)
    assert follower.forget_old_removals() == 0
    clock.advance(1801)
    a.clear_namespace("other")
    follower.handle(SimpleNamespace(value=feed_a.values[-1], offset=len(feed_a.values) - 1), TP)
    assert follower.forget_old_removals() == 2  # default's clear and purge; other's is recent
    assert (follower._cleared_at.keys(), follower._purges) == ({"other"}, {})
    follower._save_offsets()
    saved = json.loads((tmp_path / "replication-offsets.json").read_text())
    assert (set(saved["cleared_at"]), saved["purges"]) == ({"other"}, {})
