"""Two control-panel pushes racing from the same version, against the real broker and warehouse:
exactly one wins, on a running cache registry, one started afterwards (after compaction), the
dashboard's live read and the audit; the other gets VersionConflict."""
import json
import subprocess
import sys

import pytest

from cache_core.publish.control_topic import ControlListener
from cache_core.registry import ExperimentRegistry
from cache_core.settings import Settings
from dashboard.control import changes, publishing, queries
from tests.fixtures import dashboard_seed as seed
from tests.integration.test_control import force_compaction, message, raw_send, topic_records, wait_for
from tests.integration.test_dashboard_app import _control_messages

pytestmark = pytest.mark.integration

# A second process (like a second dashboard, or `python -m dashboard.control.autotune`): the
# in-process push lock cannot serialise it with ours.
OTHER_PUSHER = """
import json, sys
from cache_core.settings import Settings
from dashboard.control import changes, publishing
settings = Settings.model_validate(json.loads(sys.argv[1]))
pushed = publishing.push_threshold(settings, sys.argv[2], "treatment", 0.70, "bob", "race",
                                expected_version=1)
print(pushed.experiment.version)
"""


@pytest.fixture
def env(kafka_settings, ch_settings, tmp_path):
    with seed.control_env(kafka_settings, ch_settings, tmp_path, "race") as values:
        yield values


def _settings_json(settings: Settings) -> str:
    data = settings.model_dump(mode="json")
    data["clickhouse"]["password"] = settings.clickhouse.password.get_secret_value()
    return json.dumps(data)


def test_racing_pushes_from_the_same_version_have_one_winner_everywhere(env):
    settings, experiment_id, client = env
    running = ExperimentRegistry.from_file(settings.experiments_file)
    listener = ControlListener(settings.kafka, on_record=running.apply_record).start()
    try:
        assert listener.wait_caught_up(30)
        # A record keyed the old way (by experiment id) and superseded: compaction removes offset 0.
        raw_send(settings.kafka, b"legacy", message("legacy", 1).model_dump_json().encode())
        raw_send(settings.kafka, b"legacy", message("legacy", 2).model_dump_json().encode())

        def alice_change(config):
            # Called after alice re-read version 1 and before she publishes: bob, in another
            # process, reads version 1 too and publishes version 2 first.
            bob = subprocess.run([sys.executable, "-c", OTHER_PUSHER, _settings_json(settings), experiment_id],
                                 capture_output=True, text=True, timeout=120)
            assert bob.returncode == 0 and bob.stdout.strip() == "2", bob.stderr[-2000:]
            return changes.set_threshold("treatment", 0.75)(config)

        with pytest.raises(publishing.VersionConflict, match="version 2 was claimed first by bob") as conflict:
            publishing.publish_change(settings, experiment_id, alice_change, "alice", "race",
                                   expected_version=1, client=client)
        assert conflict.value.lost.actor == "alice" and conflict.value.current.updated_by == "bob"
        pushed = [(m.actor, m.experiment.version) for m in _control_messages(settings.kafka)
                  if m.experiment.experiment_id == experiment_id]
        assert pushed == [("bob", 2), ("alice", 2)]  # both on the topic, bob's first

        wait_for(lambda: listener.stats()["received"] >= 4)
        live = running.get(experiment_id)
        assert (live.version, live.updated_by, live.arm("treatment").threshold) == (2, "bob", 0.70)

        force_compaction(settings.kafka, gone_offset=0)
        assert [k for _, k in topic_records(settings.kafka)].count(b"legacy") == 1  # the cleaner ran
        assert running.get(experiment_id).updated_by == "bob"
    finally:
        listener.stop()

    started_later = ExperimentRegistry.from_file(settings.experiments_file)
    later = ControlListener(settings.kafka, on_record=started_later.apply_record).start()
    try:
        assert later.wait_caught_up(30)
        assert started_later.get(experiment_id).updated_by == "bob"
        assert started_later.get(experiment_id).arm("treatment").threshold == 0.70
    finally:
        later.stop()

    current = publishing.current_config(settings, experiment_id)
    assert (current.version, current.updated_by) == (2, "bob")

    history = queries.change_history(client, experiment_id)
    assert history[["actor", "new_version", "new_threshold"]].values.tolist() == [["bob", 2, 0.70]]
    definitions = client.query("SELECT version, updated_by FROM experiments WHERE experiment_id = {e:String}",
                               parameters={"e": experiment_id}).result_rows
    assert [tuple(r) for r in definitions] == [(2, "bob")]

    # The loser reloads and pushes on top of the winner.
    retry = publishing.push_threshold(settings, experiment_id, "treatment", 0.75, "alice", "retry",
                                   expected_version=2, client=client)
    assert retry.experiment.version == 3 and retry.experiment.arm("treatment").threshold == 0.75
    assert publishing.current_config(settings, experiment_id).updated_by == "alice"
