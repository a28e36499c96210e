"""dashboard.control.publishing: the pure parts (actor and reason checks, audit rows, the race message)."""
import json

import pytest

from cache_core.events import ControlMessage
from cache_core.experiments import ExperimentConfig
from dashboard.control import changes, publishing
from tests.unit.dashboard.control.test_changes import CONFIG, MULTI


def test_actor_required():
    with pytest.raises(ValueError, match="actor is required"):
        publishing._validate_actor("  ", "why")


def test_audit_rows_match_table_columns():
    new = changes.with_threshold(CONFIG, "treatment", 0.75, "alice", at_ms=1_700_000_000_000)
    msg = ControlMessage(experiment=new, actor="alice", reason="more hits", ts_ms=1_700_000_000_000)
    change, definition = publishing.audit_rows(msg, "treatment", 0.8, 4)
    row = dict(zip(publishing.THRESHOLD_CHANGE_COLUMNS, change))
    assert (row["old_threshold"], row["new_threshold"]) == (0.8, 0.75)
    assert (row["old_version"], row["new_version"]) == (4, 5)
    assert row["ts"].timestamp() == 1_700_000_000
    assert json.loads(row["config_json"])["version"] == 5
    assert dict(zip(publishing.EXPERIMENT_COLUMNS, definition))["version"] == 5


def test_canary_audit_row_records_share_and_tried_threshold():
    started = changes.start_canary("treatment", 0.76, 0.1, 0.05, at_ms=99)(CONFIG).model_copy(update={"version": 5})
    msg = ControlMessage(experiment=started, actor="bob", reason="canary", ts_ms=1_700_000_000_000)
    row = dict(zip(publishing.THRESHOLD_CHANGE_COLUMNS, publishing.audit_rows(msg, "treatment", 0.8, 4)[0]))
    assert (row["new_threshold"], row["canary_share"]) == (0.76, 0.1)


def test_multi_audit_row_keeps_the_threshold_and_carries_the_new_margin():
    new = changes.with_multi(MULTI, "mixed", "alice", 1_700_000_000_000, answer_margin=0.02)
    msg = ControlMessage(experiment=new, actor="alice", reason="fewer near-ties", ts_ms=1_700_000_000_000)
    row = dict(zip(publishing.THRESHOLD_CHANGE_COLUMNS, publishing.audit_rows(msg, "mixed", 0.8, 7)[0]))
    assert (row["old_threshold"], row["new_threshold"], row["new_version"]) == (0.8, 0.8, 8)
    assert json.loads(row["config_json"])["arms"][1]["multi"]["answer_margin"] == 0.02


def _by(version: int, actor: str) -> ExperimentConfig:
    return CONFIG.model_copy(update={"version": version, "updated_by": actor})


def test_the_loser_of_a_push_race_is_told_who_won_at_which_version():
    mine = ControlMessage(experiment=_by(8, "alice"), actor="alice")
    same = publishing.VersionConflict("exp", 7, _by(8, "bob"), lost=mine)
    assert "version 8 was claimed first by bob" in str(same) and "not audited" in str(same)
    ahead = publishing.VersionConflict("exp", None, _by(9, "carol"), lost=mine)
    assert "at config version 9 (by carol), ahead of your push of version 8" in str(ahead)
    assert ahead.lost is mine and ahead.current.version == 9
    assert "not version 7 you loaded" in str(publishing.VersionConflict("exp", 7, _by(8, "bob")))
