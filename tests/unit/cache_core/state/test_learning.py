"""Verdicts teach an error-bounded arm through SemanticCache.apply (cache_core.state.learning):
the lookup is remembered, its first verdict recorded, logged, snapshotted and replicated, and
the learnt threshold decides the next lookups, after a restart and on another replica too."""
from __future__ import annotations

from types import SimpleNamespace

from kafka import TopicPartition

from cache_core.cache import SemanticCache
from cache_core.decision.error_bound import Judged
from cache_core.events import EntryMessage
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from cache_core.settings import KafkaSettings
from cache_core.state.persistence import Persistence
from cache_core.state.replication import EntryFollower, share
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, at_cosine, experiment, unit_vec

# certifies with 22 verdicts; the curves alone: these test the plumbing (log, snapshot, topic), and the audit
# measures each verdict against the cut its own replica last gave (cache_core.decision.error_bound)
POLICY = {"kind": "error_bounded", "delta": 0.1, "confidence": 0.9, "audit": False}
BOUNDED = experiment(ArmConfig(name="a", threshold=0.95, threshold_policy=POLICY))
TABLE = {"stored": unit_vec(1.0), "near": at_cosine(0.9), "far": at_cosine(0.5)}
KAFKA = KafkaSettings(entries_topic="entries.unit")


def make_cache(clock=None, exp=BOUNDED, instance_id="a") -> SemanticCache:
    return SemanticCache(TableEmbedder(dict(TABLE)), ExperimentRegistry({exp.experiment_id: exp}),
                         clock=clock or ManualClock(), instance_id=instance_id)


def teach(cache: SemanticCache, n: int = 22, similarity: float = 0.88) -> None:
    entry_id = next(iter(cache.partitions()[0].entries))
    for i in range(n):
        cache.apply(Judged("exp", "a", entry_id, 0, similarity + i * 1e-4, False), "local")


def test_a_verdict_on_a_near_miss_is_learnt_once_and_lowers_the_threshold():
    cache = make_cache()
    cache.store("stored", "answer", unit_id="u")
    miss = cache.lookup("near", unit_id="u")
    assert not miss.hit and miss.threshold == 1.0 and miss.event.threshold_source == "static"  # the cold start
    assert cache.learn(miss.request_id, "correct") == "judged"
    assert cache.learn(miss.request_id, "wrong") == "unknown"  # one lookup, one observation
    assert cache.learn("never-seen", "correct") == "unknown"
    assert cache.hit_rule.verdicts.counts("exp", "a")["verdicts"] == 1
    teach(cache, 21)
    hit = cache.lookup("near", unit_id="u")
    assert hit.hit and hit.threshold < 0.9 and hit.event.threshold_source == "entry"


def test_a_global_arm_remembers_nothing_to_learn_from():
    cache = make_cache(exp=experiment(ArmConfig(name="a", threshold=0.95)))
    cache.store("stored", "answer", unit_id="u")
    miss = cache.lookup("near", unit_id="u")
    assert miss.event.threshold_source is None and len(cache.learnable) == 0
    assert cache.learn(miss.request_id, "correct") == "unknown"


def test_learnt_verdicts_survive_a_restart_from_the_log_and_from_a_snapshot(tmp_path):
    clock = ManualClock()
    cache = make_cache(clock)
    persistence = Persistence(tmp_path)
    persistence.open(cache)
    cache.store("stored", "answer", unit_id="u")
    teach(cache, 10)
    persistence.snapshot()  # 10 in verdicts.json
    teach(cache, 12, similarity=0.885)  # 12 only in the log
    persistence.close(final_snapshot=False)
    restarted = make_cache(clock)
    again = Persistence(tmp_path)
    again.open(restarted)
    assert restarted.hit_rule.verdicts.export_state() == cache.hit_rule.verdicts.export_state()
    assert restarted.lookup("near", unit_id="u").hit
    again.close()  # a final snapshot with every verdict, and an empty log
    third = make_cache(clock)
    last = Persistence(tmp_path)
    report = last.open(third)
    assert report.replayed_records == 0 and third.hit_rule.verdicts.counts("exp", "a")["verdicts"] == 22
    last.close()


class Feed:
    def __init__(self):
        self.values: list[bytes] = []

    def publish_entry(self, message) -> None:
        self.values.append(message.model_dump_json().encode())


def test_a_follower_replica_learns_the_same_thresholds_from_the_entries_topic():
    clock = ManualClock()
    a, b = make_cache(clock, instance_id="a"), make_cache(clock, instance_id="b")
    feed_a, feed_b = Feed(), Feed()
    share(a, feed_a, "a", "m")
    share(b, feed_b, "b", "m")
    follower_b, follower_a = EntryFollower(KAFKA, b, "b", "m"), EntryFollower(KAFKA, a, "a", "m")
    a.store("stored", "answer", unit_id="u")
    teach(a)
    tp = TopicPartition(KAFKA.entries_topic, 0)
    for offset, value in enumerate(feed_a.values):
        follower_b.handle(SimpleNamespace(value=value, offset=offset), tp)
        follower_a.handle(SimpleNamespace(value=value, offset=offset), tp)  # a's own echo
    assert follower_b.stats()["judged"] == 22 and follower_a.stats()["own"] >= 22
    assert b.hit_rule.verdicts.export_state() == a.hit_rule.verdicts.export_state()
    assert a.hit_rule.verdicts.counts("exp", "a")["verdicts"] == 22  # the echo is not counted twice
    assert b.lookup("near", unit_id="u").hit
    assert not any(b"judged" in value for value in feed_b.values)  # b does not send it on
    # each verdict travels with a's audit reading of it, so b's audit is a's (error_bound.Judged.audit)
    sent = [m.judged for m in map(EntryMessage.model_validate_json, feed_a.values) if m.change == "judged"]
    assert len(sent) == 22 and all(j.audit is not None for j in sent)


def test_a_shadow_checks_rate_weighs_its_verdict_through_the_log_and_the_topic(tmp_path):
    """The checker tells the cache the rate it sampled a lookup at (``SemanticCache.checked``): the
    verdict is recorded with that check_prob, logged with it and sent on with it."""
    clock = ManualClock()
    cache = make_cache(clock)
    persistence = Persistence(tmp_path)
    persistence.open(cache)
    feed = Feed()
    share(cache, feed, "a", "m")
    cache.store("stored", "answer", unit_id="u")
    sampled, unsampled = cache.lookup("near", unit_id="u"), cache.lookup("near", unit_id="u")
    cache.checked(sampled.request_id, 0.25)
    cache.checked("never-seen", 0.5)  # ignored
    assert cache.learn(sampled.request_id, "wrong") == "judged"
    assert cache.learn(unsampled.request_id, "correct") == "judged"
    rows = cache.hit_rule.verdicts.export_state()["arms"][0]["arm_verdicts"]
    assert sorted((w, p) for _, w, p in rows) == [(0, 1.0), (1, 0.25)]
    persistence.close(final_snapshot=False)
    restarted = make_cache(clock)
    again = Persistence(tmp_path)
    again.open(restarted)  # replayed from the log
    assert restarted.hit_rule.verdicts.export_state() == cache.hit_rule.verdicts.export_state()
    again.close()
    follower = make_cache(clock, instance_id="b")
    tp = TopicPartition(KAFKA.entries_topic, 0)
    handler = EntryFollower(KAFKA, follower, "b", "m")
    for offset, value in enumerate(feed.values):
        handler.handle(SimpleNamespace(value=value, offset=offset), tp)
    assert follower.hit_rule.verdicts.export_state() == cache.hit_rule.verdicts.export_state()


def test_a_solicited_verdict_weighs_by_the_rate_its_user_was_asked_at():
    """A hit whose user was asked (the arm samples feedback at 0.5) was drawn at 0.5; also
    shadow-checked at 0.25, at the chance either drew it, 1 - 0.5 x 0.75; an unasked hit's
    verdict keeps 1.0 (an unsolicited word, no known rate)."""
    arm = ArmConfig(name="a", threshold=0.95, threshold_policy=POLICY, feedback_sample_rate=0.5)
    cache = make_cache(exp=experiment(arm))
    cache.store("stored", "answer", unit_id="u")
    asked, unasked = [], []
    while len(asked) < 2 or not unasked:
        result = cache.lookup("stored", unit_id="u")
        assert result.hit
        (asked if result.feedback_requested else unasked).append(result.request_id)
    cache.checked(asked[1], 0.25)
    for request_id in (asked[0], asked[1], unasked[0]):
        assert cache.learn(request_id, "correct") == "judged"
    rows = cache.hit_rule.verdicts.export_state()["arms"][0]["arm_verdicts"]
    assert sorted(p for _, _, p in rows) == [0.5, 0.625, 1.0]
