"""A "wrong" verdict takes the entry that served the hit out of service (cache_core.feedback):
on the replica that served it, at the arm's invalidate_after_wrong, once per request, and on
the other replicas through the entries topic's drop."""
from __future__ import annotations

from types import SimpleNamespace

from kafka import TopicPartition

from cache_core.cache import SemanticCache
from cache_core.events import FeedbackEvent
from cache_core.experiments import ArmConfig
from cache_core.feedback import FeedbackFollower
from cache_core.persistence import Persistence
from cache_core.registry import ExperimentRegistry
from cache_core.settings import KafkaSettings
from tests.unit.cache_helpers import ManualClock, TableEmbedder, experiment, unit_in_arm, unit_vec
from tests.unit.test_replication import _deliver, _replica

STORED, PARAPHRASE, OTHER = "reset my pin", "pin reset please", "open an account"


def _embedder() -> TableEmbedder:
    return TableEmbedder({STORED: unit_vec(1, 0), PARAPHRASE: unit_vec(0.97, 0.24), OTHER: unit_vec(0, 1)})


def _cache(*arms: ArmConfig, feedback_memory: int = 100, clock=None):
    exp = experiment(*(arms or (ArmConfig(name="a", threshold=0.9),)))
    cache = SemanticCache(_embedder(), ExperimentRegistry({exp.experiment_id: exp}),
                          clock=clock or ManualClock(), feedback_memory=feedback_memory)
    return cache, exp


def _served(cache: SemanticCache, unit: str) -> str:
    result = cache.lookup(PARAPHRASE, unit)
    assert result.hit, "the paraphrase should hit the stored entry"
    return result.request_id


def test_one_wrong_verdict_removes_the_entry_and_counts_once():
    cache, exp = _cache()
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    request_id = _served(cache, unit)

    assert cache.apply_feedback(request_id, "wrong") == "invalidated"
    assert not cache.lookup(PARAPHRASE, unit).hit
    assert not cache.lookup(STORED, unit).hit
    # The topic's copy of the same verdict (or a redelivery) finds it settled.
    assert cache.apply_feedback(request_id, "wrong") == "unknown"
    assert cache.feedback_outcomes == {(exp.experiment_id, "a", "invalidated"): 1}


def test_correct_verdicts_and_misses_keep_the_entry():
    cache, exp = _cache()
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    miss = cache.lookup(OTHER, unit)
    assert not miss.hit
    assert cache.apply_feedback(miss.request_id, "wrong") == "unknown"  # no entry answered it
    assert cache.apply_feedback(_served(cache, unit), "correct") == "correct"
    assert cache.lookup(PARAPHRASE, unit).hit


def test_the_arm_sets_how_many_units_must_say_wrong_to_remove_an_entry():
    cache, exp = _cache(ArmConfig(name="a", threshold=0.9, invalidate_after_wrong=2),
                        ArmConfig(name="b", threshold=0.9, invalidate_after_wrong=0))
    unit_a, other_a, unit_b = unit_in_arm(exp, "a"), unit_in_arm(exp, "a", prefix="v"), unit_in_arm(exp, "b")
    cache.store(STORED, "Card > PIN", unit_a)
    cache.store(STORED, "Card > PIN", unit_b)

    assert cache.apply_feedback(_served(cache, unit_a), "wrong") == "counted"
    assert cache.apply_feedback(_served(cache, unit_a), "wrong") == "counted"  # the same user again
    assert cache.lookup(PARAPHRASE, unit_a).hit
    assert cache.apply_feedback(_served(cache, other_a), "wrong") == "invalidated"
    assert not cache.lookup(PARAPHRASE, unit_a).hit
    # Arm b never lets feedback remove entries, and arm a's verdicts never touched its store.
    for _ in range(3):
        assert cache.apply_feedback(_served(cache, unit_b), "wrong") == "kept"
    assert cache.lookup(PARAPHRASE, unit_b).hit


def test_only_the_most_recent_hits_are_remembered():
    cache, exp = _cache(feedback_memory=2)
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    oldest, *_ = [_served(cache, unit) for _ in range(3)]
    assert len(cache.served) == 2
    assert cache.apply_feedback(oldest, "wrong") == "unknown"
    assert cache.lookup(PARAPHRASE, unit).hit


def test_an_entry_already_replaced_is_gone():
    cache, exp = _cache()
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    request_id = _served(cache, unit)
    cache.store(STORED, "Card > PIN (new)", unit)  # same text: replaces the entry that answered
    assert cache.apply_feedback(request_id, "wrong") == "gone"
    assert cache.lookup(PARAPHRASE, unit).answer == "Card > PIN (new)"


def test_the_drop_reaches_the_other_replica_and_only_that_entry():
    clock = ManualClock()
    a, feed_a, follower_a, exp = _replica("a", clock, embedder=_embedder())
    b, feed_b, follower_b, _ = _replica("b", clock, embedder=_embedder())
    unit = unit_in_arm(exp, "a")
    a.store(STORED, "Card > PIN", unit)
    a.store(OTHER, "Accounts > Open", unit)
    _deliver(feed_a.values, follower_b)
    assert b.lookup(PARAPHRASE, unit).hit

    request_id = _served(b, unit)  # served by b: the verdict removes it there, then on a
    assert b.apply_feedback(request_id, "wrong") == "invalidated"
    assert not b.lookup(PARAPHRASE, unit).hit
    assert a.lookup(PARAPHRASE, unit).hit
    _deliver(feed_b.values, follower_a)
    assert not a.lookup(PARAPHRASE, unit).hit
    assert a.lookup(OTHER, unit).hit
    assert follower_a.stats()["dropped"] == 1
    _deliver(feed_b.values, follower_b)  # its own drop comes back: nothing left to remove
    assert follower_b.stats()["own"] == 1


def test_the_feedback_follower_applies_verdicts_taken_by_other_replicas():
    cache, exp = _cache()
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    request_id = _served(cache, unit)
    kafka = KafkaSettings(feedback_topic="feedback.unit")
    follower, tp = FeedbackFollower(kafka, cache), TopicPartition(kafka.feedback_topic, 0)
    records = [b"not json", FeedbackEvent(request_id="never-served", verdict="wrong").model_dump_json().encode(),
               FeedbackEvent(request_id=request_id, verdict="wrong").model_dump_json().encode()]
    for offset, value in enumerate(records):
        follower.handle(SimpleNamespace(value=value, offset=offset), tp)
    stats = follower.stats()
    assert (stats["malformed"], stats["unknown"], stats["invalidated"]) == (1, 1, 1)
    assert not cache.lookup(PARAPHRASE, unit).hit
    assert follower.start_at_end()


def test_an_invalidated_entry_stays_gone_after_a_restart(tmp_path):
    exp = experiment(ArmConfig(name="a", threshold=0.9))
    unit = unit_in_arm(exp, "a")

    def started() -> tuple[SemanticCache, Persistence]:
        cache = SemanticCache(_embedder(), ExperimentRegistry({exp.experiment_id: exp}), clock=ManualClock())
        persistence = Persistence(tmp_path / "snap", fsync=False)
        persistence.open(cache)
        return cache, persistence

    cache, persistence = started()
    cache.store(STORED, "Card > PIN", unit)
    cache.store(OTHER, "Accounts > Open", unit)
    assert cache.apply_feedback(_served(cache, unit), "wrong") == "invalidated"
    persistence.close(final_snapshot=False)  # as if killed: only the log has the removal

    restored, _ = started()
    assert not restored.lookup(PARAPHRASE, unit).hit
    assert restored.lookup(OTHER, unit).hit
