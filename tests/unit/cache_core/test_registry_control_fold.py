"""cache_core.registry.ControlFold: which control messages win, and the registry built on it."""
import random

import pytest

from cache_core.events import ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ControlFold, ControlRecord, ExperimentRegistry


def msg(version: int, actor: str = "a", experiment_id: str = "exp", threshold: float = 0.8) -> ControlMessage:
    return ControlMessage(actor=actor, ts_ms=version, experiment=ExperimentConfig(
        experiment_id=experiment_id, salt="s", version=version, updated_by=actor,
        arms=[ArmConfig(name="a", threshold=threshold)]))


def key(m: ControlMessage, suffix: str = "") -> bytes:
    return f"{m.experiment.experiment_id}/v{m.experiment.version}/{m.actor}{suffix}".encode()


def fold_control(records, base=None):
    """The winners after folding (key, message) pairs in order over ``base``."""
    fold = ControlFold(base)
    for record_key, message in records:
        fold.offer(record_key, message)
    return fold.winners()


def winner_actors(winners) -> dict[str, str | None]:
    return {i: (w.message.actor if w.message else None) for i, w in winners.items()}


def test_higher_version_wins_and_the_first_of_equal_versions_keeps_it():
    alice, bob, carol = msg(8, "alice"), msg(8, "bob"), msg(7, "carol")
    winners = fold_control([(key(alice), alice), (key(bob), bob), (key(carol), carol)])
    assert winner_actors(winners) == {"exp": "alice"}
    assert winners["exp"].key == key(alice)
    assert winner_actors(fold_control([(key(bob), bob), (key(alice), alice)])) == {"exp": "bob"}
    dave = msg(9, "dave")
    assert winner_actors(fold_control([(key(alice), alice), (key(bob), bob), (key(dave), dave)])) == {"exp": "dave"}


def test_offer_reports_only_experiments_whose_winner_changed():
    fold = ControlFold()
    assert fold.offer(b"k1", msg(1)) == {"exp"}
    assert fold.offer(b"k2", msg(1, "late")) == set()  # same version: the first stays
    assert fold.offer(b"k3", msg(1, experiment_id="other")) == {"other"}
    assert fold.offer(b"k2", None) == set()  # tombstone of a record that never won
    assert fold.messages()["exp"].actor == "a"


def test_base_counts_as_the_first_record():
    base = {"exp": msg(3, "file").experiment}
    winners = fold_control([(b"k1", msg(3, "same")), (b"k2", msg(2, "older"))], base=base)
    assert winners["exp"].message is None and winners["exp"].config.updated_by == "file"
    assert winner_actors(fold_control([(b"k1", msg(4, "newer"))], base=base)) == {"exp": "newer"}
    fold = ControlFold(base)
    fold.offer(b"k1", msg(4, "newer"))
    assert fold.messages() == {"exp": msg(4, "newer")}


def test_a_record_replaces_the_earlier_one_with_its_key_like_compaction():
    # Old-format keys (experiment id alone): the fold reads the topic as the cleaner leaves it.
    first, second = msg(8, "first"), msg(8, "second")
    assert winner_actors(fold_control([(b"exp", first), (b"exp", second)])) == {"exp": "second"}
    assert winner_actors(fold_control([(b"exp", msg(5)), (b"exp", msg(3, "reset"))])) == {"exp": "reset"}


def test_tombstones_remove_their_record_and_the_winner_is_redecided():
    v1, v2 = msg(1, "one"), msg(2, "two")
    log = [(key(v1), v1), (key(v2), v2)]
    assert winner_actors(fold_control(log + [(key(v1), None)])) == {"exp": "two"}  # superseded record
    assert winner_actors(fold_control(log + [(key(v2), None)])) == {"exp": "one"}  # the winner
    assert fold_control(log + [(key(v2), None), (key(v1), None)]) == {}  # every key: experiment gone
    base = {"exp": msg(1, "file").experiment}
    back = fold_control(log + [(key(v2), None), (key(v1), None)], base=base)
    assert back["exp"].message is None and back["exp"].config.updated_by == "file"
    assert winner_actors(fold_control(log + [(b"nobody", None)])) == {"exp": "two"}
    assert winner_actors(fold_control([(b"exp", v1), (b"exp", None)])) == {}  # old-format tombstone


def compacted(log: list[tuple[bytes, ControlMessage | None]], drop_tombstones: bool) -> list:
    """What Kafka's cleaner leaves: the last record per key, in order (tombstones may go later)."""
    last = {k: i for i, (k, _) in enumerate(log)}
    return [(k, m) for i, (k, m) in enumerate(log)
            if last[k] == i and not (drop_tombstones and m is None)]


@pytest.mark.parametrize("seed", range(200))
def test_winners_are_the_same_before_and_after_compaction(seed):
    rng = random.Random(seed)
    log, keys = [], []
    for n in range(rng.randint(1, 25)):
        experiment_id = rng.choice(["x", "y"])
        roll = rng.random()
        if roll < 0.15 and keys:
            log.append((rng.choice(keys), None))  # tombstone of some earlier key
        elif roll < 0.35:
            log.append((experiment_id.encode(), msg(rng.randint(1, 5), f"old{n}", experiment_id)))
        else:
            m = msg(rng.randint(1, 5), f"new{n}", experiment_id)
            log.append((key(m, f"-{n}"), m))
            keys.append(log[-1][0])
    base = {"x": msg(2, "file", "x").experiment}
    expected = winner_actors(fold_control(log, base=base))
    for drop in (False, True):
        assert winner_actors(fold_control(compacted(log, drop), base=base)) == expected


def test_racing_pushes_with_unique_keys_both_survive_compaction_and_the_first_wins():
    alice, bob = msg(8, "alice"), msg(8, "bob")
    log = [(b"exp", msg(7, "old-format")), (key(alice), alice), (key(bob), bob)]
    assert compacted(log, True) == log
    assert winner_actors(fold_control(compacted(log, True))) == {"exp": "alice"}
    # The bug this replaces: keyed by experiment id, the cleaner keeps the loser.
    legacy = [(b"exp", alice), (b"exp", bob)]
    assert winner_actors(fold_control(legacy[:1])) == {"exp": "alice"}
    assert compacted(legacy, True) == [(b"exp", bob)]


def registry(version: int = 1) -> ExperimentRegistry:
    return ExperimentRegistry({"exp": msg(version, "file").experiment})


def test_registry_folds_topic_records():
    reg = registry()
    alice, bob = msg(2, "alice", threshold=0.7), msg(2, "bob", threshold=0.6)
    assert reg.apply_record(ControlRecord(key(alice), alice, 0))
    assert not reg.apply_record(ControlRecord(key(bob), bob, 1))
    assert reg.get("exp").updated_by == "alice" and reg.get("exp").arms[0].threshold == 0.7
    assert not reg.apply_record(ControlRecord(b"exp/v9/garbage", None, 2))
    assert reg.apply_record(ControlRecord(key(alice), None, 3))  # tombstone of the winner: bob's record is next
    assert reg.get("exp").updated_by == "bob"
    assert reg.apply_record(ControlRecord(key(bob), None, 4))
    assert reg.get("exp").updated_by == "file"  # back to the experiments file


def test_registry_local_apply_gives_way_to_an_earlier_topic_record_of_its_version():
    # The admin API applies its own message right after publishing it; if another push
    # of the same version came first on the topic, the instance must end up serving that one.
    reg = registry()
    mine, theirs = msg(2, "mine", threshold=0.5), msg(2, "theirs", threshold=0.9)
    assert reg.apply(mine) and reg.get("exp").updated_by == "mine"
    assert not reg.apply(msg(2, "again"))  # a local message still needs a higher version
    assert reg.apply_record(ControlRecord(key(theirs), theirs, 0))
    assert reg.get("exp").updated_by == "theirs"
    assert not reg.apply_record(ControlRecord(key(mine), mine, 1))
    assert reg.get("exp").updated_by == "theirs"


def test_registry_local_apply_is_confirmed_by_its_own_copy():
    reg = registry()
    mine = msg(2, "mine")
    reg.apply(mine)
    roundtrip = ControlMessage.model_validate_json(mine.model_dump_json())
    assert not reg.apply_record(ControlRecord(key(mine), roundtrip, 0))  # same config: no change
    assert reg.get("exp") == mine.experiment
    assert reg.apply_record(ControlRecord(key(mine), None, 1))  # its tombstone: back to the file
    assert reg.get("exp").updated_by == "file"


def test_registry_removes_a_topic_only_experiment_and_moves_the_default():
    reg = ExperimentRegistry({})
    other = msg(1, "t", experiment_id="other")
    assert reg.apply_record(ControlRecord(b"other/v1/x", other, 0))
    assert reg.get().experiment_id == "other"
    assert reg.apply_record(ControlRecord(b"other/v1/x", None, 1))
    assert reg.all() == []
    with pytest.raises(KeyError):
        reg.get()



def test_history_lists_each_version_in_force_once_in_topic_order():
    base = {"exp": msg(1, "file").experiment}
    two, loser, stale, three = msg(2, "alice"), msg(2, "bob"), msg(1, "old"), msg(3, "carol")
    fold = ControlFold(base)
    for m in (two, loser, stale, msg(1, experiment_id="other"), three):
        fold.offer(key(m), m)
    assert [m.actor for m in fold.history("exp")] == ["alice", "carol"]  # bob lost v2, old is under the file's
    assert [m.actor for m in fold.history("other")] == ["a"] and fold.history("nobody") == []
    fold.offer(key(two), None)  # a tombstone removes alice's record: bob's v2 is what survives
    assert [m.actor for m in fold.history("exp")] == ["bob", "carol"]
