"""A "wrong" verdict takes the entry that served the hit out of service (cache_core.state.feedback):
on the replica that served it, at the arm's invalidate_after_wrong, once per request, and on
the other replicas through the entries topic's drop; the units are counted across replicas
(the entries topic's vote) and across restarts (snapshot, log, and the served hits and
feedback offsets a graceful stop saves)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kafka import TopicPartition
from prometheus_client import generate_latest

from cache_core.cache import SemanticCache
from cache_core.state.changes import Put
from cache_core.events import EntryMessage, FeedbackEvent
from cache_core.experiments import ArmConfig
from cache_core.state.feedback import FeedbackFollower, ServedHit
from cache_core.state.persistence import Persistence
from cache_core.registry import ExperimentRegistry
from cache_core.service.metrics import ServiceMetrics
from cache_core.settings import KafkaSettings
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, experiment, unit_in_arm, unit_vec
from tests.unit.cache_core.state.test_replication import _deliver, _replica

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
    [kept] = cache.partition_for("default", exp.experiment_id, "b").entries.values()
    assert kept.wrong_units == set()  # never removed, so nothing is counted (nor logged, nor sent)


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


# -- votes counted across replicas (entries-topic "vote") ---------------------------------

def _two_replicas(limit: int = 2, also: list | None = None):
    """Replicas a and b holding one entry of arm a (invalidate_after_wrong=limit), two units of
    arm a. ``also`` gets (cache, follower) of a third replica holding the entry too."""
    clock = ManualClock()
    exp = experiment(ArmConfig(name="a", threshold=0.9, invalidate_after_wrong=limit))
    a, feed_a, follower_a, _ = _replica("a", clock, exp=exp, embedder=_embedder())
    b, feed_b, follower_b, _ = _replica("b", clock, exp=exp, embedder=_embedder())
    first, second = unit_in_arm(exp, "a"), unit_in_arm(exp, "a", prefix="v")
    a.store(STORED, "Card > PIN", first)
    _deliver(feed_a.values, follower_b)
    if also is not None:
        c, _, follower_c, _ = _replica("c", clock, exp=exp, embedder=_embedder())
        _deliver(feed_a.values, follower_c)
        also.extend((c, follower_c))
    feed_a.values.clear()
    return (a, feed_a, follower_a), (b, feed_b, follower_b), first, second


def _wrong_units(cache: SemanticCache) -> set[str] | None:
    entries = [e for p in cache.partitions() for e in p.entries.values()]
    return entries[0].wrong_units if entries else None


def test_units_served_by_different_replicas_add_up_to_the_limit_on_both():
    (a, feed_a, follower_a), (b, feed_b, follower_b), first, second = _two_replicas(limit=2)
    # Each replica serves one user; each alone is below the limit.
    assert a.apply_feedback(_served(a, first), "wrong") == "counted"
    assert b.apply_feedback(_served(b, second), "wrong") == "counted"
    assert a.lookup(PARAPHRASE, first).hit and b.lookup(PARAPHRASE, first).hit

    _deliver(feed_a.values, follower_b)  # a's vote: b now has two units
    _deliver(feed_b.values, follower_a)  # b's vote: so has a
    assert not a.lookup(PARAPHRASE, first).hit and not b.lookup(PARAPHRASE, first).hit
    assert follower_a.stats()["voted_out"] == 1 and follower_b.stats()["voted_out"] == 1
    assert not feed_a.values[1:] and not feed_b.values[1:]  # nothing but the votes: no drop is sent
    metrics = generate_latest(ServiceMetrics(b, dict, None, follower_b.stats).registry).decode()
    assert 'scache_replication_messages_total{outcome="voted_out"} 1.0' in metrics
    assert 'scache_replication_messages_total{outcome="votes"} 0.0' in metrics

    # Own echoes and a redelivery find nothing left to count.
    _deliver(feed_a.values, follower_a)
    _deliver(feed_b.values, follower_b)
    _deliver(feed_a.values, follower_b)
    assert follower_a.stats()["own"] == 1 and follower_b.stats()["own"] == 1
    assert follower_b.stats()["duplicate"] == 1


def test_a_vote_from_another_replica_makes_the_serving_replica_reach_the_limit_and_drop():
    (a, feed_a, follower_a), (b, feed_b, follower_b), first, second = _two_replicas(limit=2)
    assert a.apply_feedback(_served(a, first), "wrong") == "counted"
    [vote] = [EntryMessage.model_validate_json(v) for v in feed_a.values]
    assert (vote.change, vote.vote.unit_id, vote.vote.arm) == ("vote", first, "a")
    _deliver(feed_a.values, follower_b)
    assert follower_b.stats()["votes"] == 1 and _wrong_units(b) == {first}
    assert b.lookup(PARAPHRASE, first).hit  # one unit of two: still served

    assert b.apply_feedback(_served(b, second), "wrong") == "invalidated"
    [drop] = [EntryMessage.model_validate_json(v) for v in feed_b.values]
    assert drop.change == "drop"
    _deliver(feed_b.values, follower_a)
    assert follower_a.stats()["dropped"] == 1 and not a.lookup(PARAPHRASE, first).hit


def test_an_entry_feedback_took_out_is_not_brought_back_by_a_replayed_put():
    """A restarted replica may apply a verdict (feedback topic) before its entries replay reaches
    the entry's put: the put must not bring the entry back."""
    (a, feed_a, _), (b, feed_b, follower_b), first, _ = _two_replicas(limit=1)
    [(key, entry_id)] = [(p.key, e.entry_id) for p in a.partitions() for e in p.entries.values()]
    assert b.apply_feedback(_served(b, first), "wrong") == "invalidated"
    a.entry_feed.stored(key, next(iter(a.partitions())).entries[entry_id])  # the put, replayed after
    _deliver(feed_a.values, follower_b, start=100)
    assert follower_b.stats()["dropped_before"] == 1 and not b.lookup(PARAPHRASE, first).hit
    # a drop that arrives before its put (another replica's verdict) holds the same way
    c, _, follower_c, _ = _replica("c", a.clock, exp=a.registry.get(key[1]), embedder=_embedder())
    _deliver(feed_b.values + feed_a.values, follower_c)
    assert follower_c.stats()["dropped_before"] == 1 and sum(len(p) for p in c.partitions()) == 0


def test_a_put_replayed_while_the_verdict_removes_the_entry_does_not_bring_it_back():
    """The CI race: the restarted replica's entries replay reads the put of an entry it restored
    from its log while the feedback thread removes that entry. The put may pass the dropped check
    before the removal, so the check is made under the partition lock, where the removal is."""
    (a, feed_a, _), (b, _feed_b, follower_b), first, _ = _two_replicas(limit=1)
    [(key, entry_id)] = [(p.key, e.entry_id) for p in a.partitions() for e in p.entries.values()]
    verdict = _served(b, first)
    live = b.stores.live

    def verdict_lands_between_check_and_lock(get):
        b.stores.live = live  # once
        assert b.apply_feedback(verdict, "wrong") == "invalidated"
        return live(get)

    b.stores.live = verdict_lands_between_check_and_lock
    a.entry_feed.stored(key, next(iter(a.partitions())).entries[entry_id])  # the put, replayed
    _deliver(feed_a.values, follower_b, start=100)
    assert b.stores.live is live  # the interleaving happened
    assert follower_b.stats()["dropped_before"] == 1 and not b.lookup(PARAPHRASE, first).hit


def test_the_same_unit_on_two_replicas_counts_once():
    (a, feed_a, follower_a), (b, feed_b, follower_b), first, _second = _two_replicas(limit=2)
    assert a.apply_feedback(_served(a, first), "wrong") == "counted"
    _deliver(feed_a.values, follower_b)
    assert b.apply_feedback(_served(b, first), "wrong") == "counted"  # the same user, served by b
    assert not feed_b.values  # already counted there: no vote goes out
    assert b.lookup(PARAPHRASE, first).hit and _wrong_units(b) == {first}


def test_a_drop_after_the_votes_removed_the_entry_is_a_duplicate():
    """A third replica that counted both votes removed the entry itself; the drop of a replica
    that reached the limit with a hit of its own (before the other vote reached it) comes later."""
    third: list = []
    (a, feed_a, _), (b, feed_b, _), first, second = _two_replicas(limit=2, also=third)
    c, follower_c = third
    assert a.apply_feedback(_served(a, first), "wrong") == "counted"
    assert b.apply_feedback(_served(b, second), "wrong") == "counted"
    _deliver(feed_a.values + feed_b.values, follower_c)
    assert follower_c.stats()["voted_out"] == 1 and sum(len(p) for p in c.partitions()) == 0

    [(key, entry_id)] = [(p.key, e.entry_id) for p in a.partitions() for e in p.entries.values()]
    b.entry_feed.dropped(key, entry_id)  # as a replica that resolved it on its own hit would send
    _deliver(feed_b.values[-1:], follower_c)
    assert (follower_c.stats()["dropped"], follower_c.stats()["duplicate"]) == (0, 1)


# -- votes across restarts ----------------------------------------------------------------

def _persisted(tmp_path, exp, clock=None) -> tuple[SemanticCache, Persistence]:
    cache = SemanticCache(_embedder(), ExperimentRegistry({exp.experiment_id: exp}), clock=clock or ManualClock())
    persistence = Persistence(tmp_path / "snap", fsync=False)
    persistence.open(cache)
    return cache, persistence


@pytest.mark.parametrize("final_snapshot", [True, False], ids=["snapshot", "log-replay"])
def test_partial_counts_survive_a_restart(tmp_path, final_snapshot):
    exp = experiment(ArmConfig(name="a", threshold=0.9, invalidate_after_wrong=2))
    first, second = unit_in_arm(exp, "a"), unit_in_arm(exp, "a", prefix="v")
    cache, persistence = _persisted(tmp_path, exp)
    cache.store(STORED, "Card > PIN", first)
    hit, synced = _served(cache, first), persistence.journal.stats.fsyncs
    assert cache.apply_feedback(hit, "wrong") == "counted"
    assert persistence.journal.stats.fsyncs == synced + 1  # the vote is durable before the verdict is answered
    persistence.close(final_snapshot=final_snapshot)  # False: as if killed, only the log has the vote
    snapshots = list((tmp_path / "snap").glob("snap-*/entries.json"))
    if final_snapshot:
        [snapshot] = snapshots
        assert json.loads(snapshot.read_text())[0]["entry"]["wrong_units"] == [first]
    else:
        assert not snapshots

    restored, persistence = _persisted(tmp_path, exp)
    assert _wrong_units(restored) == {first}
    assert restored.apply_feedback(_served(restored, first), "wrong") == "counted"  # still one unit
    assert restored.apply_feedback(_served(restored, second), "wrong") == "invalidated"
    persistence.close()


def test_a_vote_from_another_replica_is_logged_and_replayed(tmp_path):
    (a, feed_a, _), (b, _, follower_b), first, _second = _two_replicas(limit=3)
    persistence = Persistence(tmp_path / "snap", fsync=False)
    persistence.open(b)  # an empty directory: restores nothing, logs b's changes from now on
    persistence.snapshot()  # the entry b got from a
    assert a.apply_feedback(_served(a, first), "wrong") == "counted"
    _deliver(feed_a.values, follower_b)
    assert follower_b.stats()["votes"] == 1
    records = [json.loads(line.split(b" ", 1)[1]) for path in (tmp_path / "snap").glob("wal-*.log")
               for line in path.read_bytes().splitlines()]
    assert [r["op"] for r in records] == ["vote"] and records[0]["unit"] == first
    persistence.close(final_snapshot=False)  # as if killed: the snapshot has no votes, the log has it

    restored = SemanticCache(_embedder(), b.registry, clock=b.clock)
    again = Persistence(tmp_path / "snap", fsync=False)
    again.open(restored)
    assert _wrong_units(restored) == {first}
    again.close()


def test_a_snapshot_without_wrong_units_loads_with_none(tmp_path):
    exp = experiment(ArmConfig(name="a", threshold=0.9, invalidate_after_wrong=2))
    unit = unit_in_arm(exp, "a")
    cache, persistence = _persisted(tmp_path, exp)
    cache.store(STORED, "Card > PIN", unit)
    persistence.close()
    [snapshot] = (tmp_path / "snap").glob("snap-*/entries.json")
    rows = json.loads(snapshot.read_text())
    assert "wrong_units" not in rows[0]["entry"]  # as written before votes were persisted
    restored, persistence = _persisted(tmp_path, exp)
    assert _wrong_units(restored) == set()
    assert restored.apply_feedback(_served(restored, unit), "wrong") == "counted"
    persistence.close()


# -- the served hits and the feedback follower's offsets across a graceful restart ---------

FEEDBACK_KAFKA = KafkaSettings(feedback_topic="feedback.unit")


def _verdict(follower: FeedbackFollower, offset: int, request_id: str, verdict: str = "wrong") -> None:
    tp = TopicPartition(FEEDBACK_KAFKA.feedback_topic, 0)
    follower._positions[tp] = offset + 1  # as the follower's loop does before handling a record
    follower.handle(SimpleNamespace(value=FeedbackEvent(request_id=request_id, verdict=verdict)
                                    .model_dump_json().encode(), offset=offset), tp)


def test_served_hits_and_offsets_saved_at_stop_are_resumed_at_start(tmp_path):
    clock = ManualClock()
    cache, exp = _cache(clock=clock)
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    served, settled = _served(cache, unit), _served(cache, unit)
    before = FeedbackFollower(FEEDBACK_KAFKA, cache, state_dir=tmp_path)
    _verdict(before, 6, settled, "correct")
    path = before.save_state()
    assert json.loads(path.read_text())["offsets"] == {"0": 7}

    clock.advance(600)  # down for ten minutes; the entry is still there (persistence restores it)
    restarted = SemanticCache(_embedder(), cache.registry, clock=clock, feedback_memory=100)
    for partition in cache.partitions():
        for entry in partition.entries.values():
            restarted.apply(Put(partition.key, entry), "log")
    after = FeedbackFollower(FEEDBACK_KAFKA, restarted, state_dir=tmp_path)
    after._restore_state()
    assert after.start_offsets() == {TopicPartition(FEEDBACK_KAFKA.feedback_topic, 0): 7}
    assert (after.stats()["restored_hits"], after.stats()["resumed"]) == (1, 1)
    assert not path.exists()  # one stop's state: a crash after this start must not resume from it
    _verdict(after, 7, settled)  # settled before the stop: not counted again
    _verdict(after, 8, served)  # posted while this replica was down
    assert (after.stats()["unknown"], after.stats()["invalidated"]) == (1, 1)
    assert not restarted.lookup(PARAPHRASE, unit).hit


def test_a_checkpoint_while_running_lets_a_crashed_replica_resume(tmp_path):
    clock = ManualClock()
    cache, exp = _cache(clock=clock)
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    served = _served(cache, unit)
    running = FeedbackFollower(FEEDBACK_KAFKA, cache, state_dir=tmp_path, checkpoint_s=30)
    never = FeedbackFollower(FEEDBACK_KAFKA, cache, state_dir=tmp_path / "off", checkpoint_s=0)
    _verdict(running, 4, "not-served")
    clock.advance(29)
    running.after_poll(), never.after_poll()
    assert not (tmp_path / "feedback-state.json").exists()  # not due yet
    clock.advance(1)
    running.after_poll()
    clock.advance(600)  # the entry lives an hour
    never.after_poll(), running.after_poll()  # due again, but nothing served, settled or read since
    assert running.stats()["checkpoints"] == 1 and never.stats()["checkpoints"] == 0
    assert not (tmp_path / "off").exists()
    _served(cache, unit)  # served after the checkpoint: a crash loses it

    clock.advance(10)  # crashed (no stop) and restarted ten seconds later
    restarted = SemanticCache(_embedder(), cache.registry, clock=clock, feedback_memory=100)
    for partition in cache.partitions():
        for entry in partition.entries.values():
            restarted.apply(Put(partition.key, entry), "log")
    after = FeedbackFollower(FEEDBACK_KAFKA, restarted, state_dir=tmp_path, checkpoint_s=30)
    after._restore_state()
    assert after.start_offsets() == {TopicPartition(FEEDBACK_KAFKA.feedback_topic, 0): 5}
    assert after.stats()["restored_hits"] == 1
    _verdict(after, 5, served)  # posted while it was down
    assert after.stats()["invalidated"] == 1 and not restarted.lookup(PARAPHRASE, unit).hit


def test_the_state_file_is_plain_json_with_every_hit(tmp_path):
    cache, _ = _cache(feedback_memory=5000)
    for n in range(4500):  # more than one chunk of the chunked dump
        cache.served.remember(f"r{n}", ServedHit(("ns", "e", "a"), "e", "a", f"entry-{n % 7}", f"u{n}"))
    saved = json.loads(FeedbackFollower(FEEDBACK_KAFKA, cache, state_dir=tmp_path).save_state().read_text())
    assert saved["topic"] == FEEDBACK_KAFKA.feedback_topic and saved["hits"] == cache.served.export()


def test_restored_hits_come_before_the_ones_served_since_and_stay_bounded():
    cache, exp = _cache(feedback_memory=3)
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    saved = [_served(cache, unit) for _ in range(3)]
    rows = cache.served.export()
    fresh, _ = _cache(feedback_memory=3)
    fresh.store(STORED, "Card > PIN", unit)
    new = _served(fresh, unit)
    assert fresh.served.restore(rows) == 3
    assert len(fresh.served) == 3  # the oldest saved hit made way
    assert [r[0] for r in fresh.served.export()] == [*saved[1:], new]


def test_a_saved_state_too_old_or_unreadable_starts_at_the_end(tmp_path):
    clock = ManualClock()
    cache, exp = _cache(clock=clock)
    unit = unit_in_arm(exp, "a")
    cache.store(STORED, "Card > PIN", unit)
    _served(cache, unit)
    follower = FeedbackFollower(FEEDBACK_KAFKA, cache, state_dir=tmp_path, max_age_s=60)
    _verdict(follower, 3, "not-served")
    follower.save_state()

    clock.advance(61)
    old = FeedbackFollower(FEEDBACK_KAFKA, _cache(clock=clock)[0], state_dir=tmp_path, max_age_s=60)
    old._restore_state()
    assert old.start_offsets() == {} and len(old.cache.served) == 0 and old.stats()["resumed"] == 0
    assert not (tmp_path / "feedback-state.json").exists()

    (tmp_path / "feedback-state.json").write_text('{"topic": "feedback.unit", "saved_at": "yesterday"}')
    garbled = FeedbackFollower(FEEDBACK_KAFKA, _cache(clock=clock)[0], state_dir=tmp_path)
    garbled._restore_state()
    assert garbled.start_offsets() == {} and garbled.start_at_end()


def test_the_age_limit_is_capped_by_the_feedback_topic_retention():
    cache, _ = _cache()
    short = KafkaSettings(feedback_topic="feedback.unit", events_retention_ms=120_000)
    assert FeedbackFollower(short, cache, max_age_s=3600).max_age_s == 120
