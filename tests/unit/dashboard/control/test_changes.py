"""dashboard.control.changes: config edits (validation, next config, canaries, multi settings, restore)."""
import math

import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, ExperimentConfig
from dashboard.control import changes

CONFIG = ExperimentConfig(
    experiment_id="threshold-ab", salt="s", version=4,
    arms=[ArmConfig(name="control", threshold=0.9, weight=1),
          ArmConfig(name="treatment", threshold=0.8, weight=1, cluster_thresholds={3: 0.7})],
)


@pytest.mark.parametrize("bad", [-0.01, 1.01, math.nan, math.inf, "0.8", None, True])
def test_validate_threshold_rejects(bad):
    with pytest.raises(ValueError, match="threshold must be"):
        changes.validate_threshold(bad)


@pytest.mark.parametrize("good", [0, 0.0, 0.5, 1])
def test_validate_threshold_accepts_bounds(good):
    assert changes.validate_threshold(good) == float(good)


def test_with_threshold_bumps_version_and_changes_only_that_arm():
    new = changes.with_threshold(CONFIG, "treatment", 0.75, "alice", at_ms=123)
    assert new.version == 5
    assert new.arm("treatment").threshold == 0.75
    assert new.arm("treatment").cluster_thresholds == {3: 0.7}
    assert new.arm("control").threshold == 0.9
    assert (new.updated_by, new.updated_at_ms) == ("alice", 123)
    assert CONFIG.version == 4 and CONFIG.arm("treatment").threshold == 0.8  # input untouched


def test_with_threshold_zero_is_a_value():
    assert changes.with_threshold(CONFIG, "control", 0.0, "a", 1).arm("control").threshold == 0.0


def test_with_threshold_unknown_arm_names_the_arms():
    with pytest.raises(ValueError, match=r"no arm 'nope'.*'control', 'treatment'"):
        changes.with_threshold(CONFIG, "nope", 0.5, "a", 1)


# -- change functions (pure) ----------------------------------------------------------

def test_cluster_threshold_set_and_remove():
    added = changes.set_cluster_threshold("control", 5, 0.95)(CONFIG)
    assert added.arm("control").cluster_thresholds == {5: 0.95}
    removed = changes.set_cluster_threshold("treatment", 3, None)(CONFIG)
    assert removed.arm("treatment").cluster_thresholds == {}
    with pytest.raises(ValueError, match="non-negative integer"):
        changes.set_cluster_threshold("control", -1, 0.9)


def test_canary_start_promote_rollback():
    started = changes.start_canary("treatment", 0.76, 0.1, 0.05, at_ms=99)(CONFIG)
    canary = started.arm("treatment").canary
    assert (canary.threshold, canary.share, canary.started_at_ms) == (0.76, 0.1, 99)
    assert started.arm("treatment").threshold == 0.8
    promoted = changes.promote_canary("treatment")(started)
    assert promoted.arm("treatment").threshold == 0.76 and promoted.arm("treatment").canary is None
    rolled = changes.rollback_canary("treatment")(started)
    assert rolled.arm("treatment").threshold == 0.8 and rolled.arm("treatment").canary is None
    with pytest.raises(ValueError, match="no running canary"):
        changes.promote_canary("control")(CONFIG)
    with pytest.raises(ValueError, match="canary share"):
        changes.start_canary("treatment", 0.76, 0, 0.05, at_ms=1)


def test_changed_arms_and_restore():
    new = changes.set_threshold("treatment", 0.7)(changes.start_canary("control", 0.85, 0.2, 0.05, 1)(CONFIG))
    assert changes.changed_arms(CONFIG, new) == ["control", "treatment"]
    restored = changes.restore_thresholds(CONFIG)(new)
    assert changes.changed_arms(CONFIG, restored) == []


def test_previous_config_from_history_then_file():
    v5 = changes.with_threshold(CONFIG, "treatment", 0.7, "a", 1)
    v6 = changes.with_threshold(v5, "treatment", 0.6, "a", 2)
    history = pd.DataFrame({"new_version": [6, 5], "config_json": [v6.model_dump_json(), v5.model_dump_json()]})
    assert changes.previous_config(history, v6).version == 5
    assert changes.previous_config(history, v5, fallback=CONFIG).version == 4
    assert changes.previous_config(history.iloc[0:0], CONFIG, fallback=CONFIG) is None


# -- multi arms: score floor / answer margin -------------------------------------------

MULTI = ExperimentConfig(
    experiment_id="multi-ab", salt="s", version=7,
    arms=[ArmConfig(name="control", threshold=0.9),
          ArmConfig(name="mixed", threshold=0.8, similarity="multi", cluster_thresholds={2: 0.85},
                    multi={"threshold": 0.5, "answer_margin": 0.01, "lexical": "word", "token": 0.3})],
)


def test_with_multi_changes_only_that_arms_margin_and_bumps_version():
    new = changes.with_multi(MULTI, "mixed", "alice", 123, answer_margin=0.02)
    assert (new.version, new.updated_by, new.updated_at_ms) == (8, "alice", 123)
    mixed = new.arm("mixed")
    assert mixed.multi.answer_margin == 0.02
    # everything else of the arm stays: floor, weights, lexical level, thresholds
    assert (mixed.multi.threshold, mixed.multi.lexical, mixed.multi.token) == (0.5, "word", 0.3)
    assert (mixed.threshold, mixed.cluster_thresholds, mixed.similarity) == (0.8, {2: 0.85}, "multi")
    assert new.arm("control") == MULTI.arm("control")
    assert MULTI.arm("mixed").multi.answer_margin == 0.01  # input untouched
    assert changes.changed_arms(MULTI, new) == ["mixed"]


def test_with_multi_floor_alone_and_both():
    floor = changes.with_multi(MULTI, "mixed", "a", 1, score_floor=0.6).arm("mixed").multi
    assert (floor.threshold, floor.answer_margin) == (0.6, 0.01)
    both = changes.with_multi(MULTI, "mixed", "a", 1, score_floor=-0.2, answer_margin=0.0).arm("mixed").multi
    assert (both.threshold, both.answer_margin) == (-0.2, 0.0)


def test_set_multi_refuses_a_no_op():
    with pytest.raises(ValueError, match="already has score floor 0.500 and answer margin 0.010; nothing to push"):
        changes.set_multi("mixed", score_floor=0.5, answer_margin=0.01)(MULTI)
    with pytest.raises(ValueError, match="give a new score floor and/or answer margin"):
        changes.set_multi("mixed")


def test_set_multi_refuses_a_cosine_arm_and_an_unknown_one():
    with pytest.raises(ValueError, match="arm 'control' uses cosine similarity: only a multi arm"):
        changes.set_multi("control", answer_margin=0.02)(MULTI)
    with pytest.raises(ValueError, match=r"no arm 'nope'"):
        changes.set_multi("nope", answer_margin=0.02)(MULTI)


@pytest.mark.parametrize("kwargs, message", [
    ({"answer_margin": -0.001}, "answer margin: Input should be greater than or equal to 0"),
    ({"answer_margin": 1.5}, "answer margin: Input should be less than or equal to 1"),
    ({"score_floor": 1.01}, "score floor: Input should be less than or equal to 1"),
    ({"score_floor": -1.5}, "score floor: Input should be greater than or equal to -1"),
])
def test_set_multi_refuses_out_of_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        changes.set_multi("mixed", **kwargs)(MULTI)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.1", True])
def test_set_multi_refuses_non_numbers(bad):
    with pytest.raises(ValueError, match="answer margin must be a finite number"):
        changes.set_multi("mixed", answer_margin=bad)


def test_restore_brings_back_the_multi_settings():
    new = changes.with_multi(MULTI, "mixed", "a", 1, score_floor=0.6, answer_margin=0.03)
    restored = changes.restore_thresholds(MULTI)(new)
    assert restored.arm("mixed").multi == MULTI.arm("mixed").multi
    assert changes.changed_arms(MULTI, restored) == []


def test_multi_canary_start_promote_rollback():
    started = changes.start_multi_canary("mixed", 0.1, 0.05, 99, score_floor=0.45)(MULTI)
    mixed = started.arm("mixed")
    assert (mixed.canary.threshold, mixed.canary.score_floor, mixed.canary.answer_margin) == (0.8, 0.45, None)
    assert mixed.multi.threshold == 0.5  # base units keep the arm's floor until promoted
    assert changes.changed_arms(MULTI, started) == ["mixed"]
    promoted = changes.promote_canary("mixed")(started).arm("mixed")
    assert promoted.canary is None and (promoted.multi.threshold, promoted.multi.answer_margin) == (0.45, 0.01)
    assert (promoted.multi.lexical, promoted.multi.token, promoted.threshold) == ("word", 0.3, 0.8)  # rest kept
    assert changes.rollback_canary("mixed")(started).arm("mixed") == MULTI.arm("mixed")


def test_multi_canary_refuses_what_set_multi_refuses():
    with pytest.raises(ValueError, match="only a multi arm"):
        changes.start_multi_canary("control", 0.1, 0.05, 1, score_floor=0.45)(MULTI)
    with pytest.raises(ValueError, match="nothing to push"):
        changes.start_multi_canary("mixed", 0.1, 0.05, 1, score_floor=0.5)(MULTI)
    with pytest.raises(ValueError, match="canary share"):
        changes.start_multi_canary("mixed", 1.5, 0.05, 1, score_floor=0.45)


def test_set_invalidate_after_changes_one_arm_and_refuses_bad_values():
    new = changes.set_invalidate_after("mixed", 3)(MULTI)
    assert new.arm("mixed").invalidate_after_wrong == 3 and new.arm("control") == MULTI.arm("control")
    assert changes.changed_arms(MULTI, new) == ["mixed"]
    assert changes.restore_thresholds(MULTI)(new).arm("mixed").invalidate_after_wrong == 1  # rollback brings it back
    with pytest.raises(ValueError, match="already removes entries after 1 users' wrong verdicts; nothing to push"):
        changes.set_invalidate_after("mixed", 1)(MULTI)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="whole number >= 0"):
            changes.set_invalidate_after("mixed", bad)
    with pytest.raises(ValueError, match=r"no arm 'nope'"):
        changes.set_invalidate_after("nope", 2)(MULTI)
