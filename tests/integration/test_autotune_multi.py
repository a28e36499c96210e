"""Auto-tune of a multi arm's score floor / answer margin against the real warehouse and broker."""
import json
import uuid
from datetime import datetime, timezone

import pytest

from cache_core.chclient import connect
from cache_core.publish.control_topic import read_latest_configs
from cache_core.settings import get_settings
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.integration


def _env(monkeypatch, kafka_settings, ch_settings, experiments_file):
    for name, value in {"KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
                        "KAFKA__CONTROL_TOPIC": kafka_settings.control_topic,
                        "CLICKHOUSE__URL": ch_settings.url, "CLICKHOUSE__DATABASE": ch_settings.database,
                        "EXPERIMENTS_FILE": str(experiments_file)}.items():
        monkeypatch.setenv(f"SCACHE_{name}", value)
    get_settings.cache_clear()


@pytest.fixture
def multi_env(monkeypatch, kafka_settings, ch_settings, tmp_path):
    """The CLI's settings (SCACHE_* env) pointing at the test broker and warehouse, an experiment
    with a multi arm, and its logged decisions and feedback."""
    experiment_id = f"tune-multi-{uuid.uuid4().hex[:8]}"
    _env(monkeypatch, kafka_settings, ch_settings, seed.multi_experiments_file(tmp_path / "e.yaml", experiment_id))
    client = connect(ch_settings)
    seed.seed_multi_tuning(client, experiment_id, datetime.now(timezone.utc))
    yield experiment_id, client
    client.close()
    get_settings.cache_clear()


@pytest.fixture
def safe_floor_env(monkeypatch, kafka_settings, ch_settings, tmp_path):
    """As multi_env, but the arm's floor is 0.53, everything it served was right, and the scores
    it refused (0.500-0.529) carry no labels: only a canary can tell whether 0.50 is safe."""
    experiment_id = f"explore-multi-{uuid.uuid4().hex[:8]}"
    _env(monkeypatch, kafka_settings, ch_settings,
         seed.multi_experiments_file(tmp_path / "e.yaml", experiment_id, floor=0.53))
    client = connect(ch_settings)
    seed.seed_multi_tuning(client, experiment_id, datetime.now(timezone.utc), served_from=530)
    yield experiment_id, client
    client.close()
    get_settings.cache_clear()


def _run(capsys, *args) -> dict[tuple[str, str], dict]:
    from dashboard.control import autotune
    assert autotune.main(["--once", "--min-decisions", "200", "--min-labelled", "30", "--target", "0.05",
                          *args]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {(a["arm"], a["kind"]): a for a in lines}


def test_autotune_once_raises_a_multi_arms_floor_and_audits_it(multi_env, capsys):
    experiment_id, client = multi_env
    dry = _run(capsys, "--experiment", experiment_id, "--dry-run", "--cooldown-s", "0")
    multi = dry[("control", "multi")]
    assert (multi["action"], multi["applied"]) == ("change", False)
    assert (multi["score_floor"], multi["answer_margin"]) == (pytest.approx(seed.MULTI_TUNED_FLOOR), 0.005)
    assert experiment_id not in read_latest_configs(get_settings().kafka)  # dry: nothing published

    done = _run(capsys, "--experiment", experiment_id, "--cooldown-s", "0")
    multi = done[("control", "multi")]
    assert (multi["action"], multi["applied"], multi["version"]) == ("change", True, 2)
    # one change per arm and run: the threshold recommendation for the same arm waits
    assert "changed earlier in this run" in done[("control", "recommendation")]["reason"]
    assert not done[("treatment", "recommendation")]["applied"]  # a cosine arm with no decisions

    live = read_latest_configs(get_settings().kafka)[experiment_id].experiment
    arm = live.arm("control")
    assert live.version == 2 and live.updated_by == "autotune"
    assert arm.multi.threshold > seed.MULTI_ARM["multi"]["threshold"]  # raised: fewer false hits
    assert arm.multi.threshold == pytest.approx(seed.MULTI_TUNED_FLOOR)
    assert arm.multi.answer_margin == 0.005 and arm.threshold == 0.80 and arm.canary is None  # pushed directly
    rows = client.query("SELECT arm, actor, old_threshold, new_threshold, old_version, new_version, reason, "
                        "config_json FROM threshold_changes WHERE experiment_id = {e:String}",
                        parameters={"e": experiment_id}).result_rows
    assert [r[:6] for r in rows] == [("control", "autotune", 0.80, 0.80, 1, 2)]
    assert "score floor 0.500 -> 0.520" in rows[0][6]
    assert json.loads(rows[0][7])["arms"][0]["multi"]["threshold"] == pytest.approx(seed.MULTI_TUNED_FLOOR)

    # The next run is inside the cool-down that audit row started: nothing more is pushed.
    again = _run(capsys, "--experiment", experiment_id, "--cooldown-s", "1800")
    assert again[("control", "multi")]["action"] == "hold"
    assert "cool-down" in again[("control", "multi")]["reason"]
    assert read_latest_configs(get_settings().kafka)[experiment_id].experiment.version == 2


def test_autotune_explores_a_lower_floor_on_a_canary_and_promotes_it(safe_floor_env, capsys):
    experiment_id, client = safe_floor_env
    direct = _run(capsys, "--experiment", experiment_id, "--dry-run", "--cooldown-s", "0", "--canary-share", "0")
    assert direct[("control", "multi")]["action"] == "hold"  # no canary, no exploration
    done = _run(capsys, "--experiment", experiment_id, "--cooldown-s", "0", "--canary-share", "0.2")
    multi = done[("control", "multi")]
    assert (multi["action"], multi["applied"], multi["version"]) == ("explore", True, 2)
    assert multi["score_floor"] == pytest.approx(0.50)
    live = read_latest_configs(get_settings().kafka)[experiment_id].experiment.arm("control")
    assert live.multi.threshold == 0.53 and live.canary.share == 0.2  # base units keep 0.53
    assert (live.canary.score_floor, live.canary.answer_margin, live.canary.threshold) == (
        pytest.approx(0.50), None, 0.80)

    # The canary's units, served from 0.50, come back right: 200 labelled hits, none wrong.
    ids = [f"{experiment_id}-canary-{i}" for i in range(200)]
    start = live.canary.started_at_ms
    client.insert("events_raw", [["decision", rid, start + 10 + i, experiment_id, "control", "hit", True, 0.90,
                                  "multi", 0.505, 0.05, 2, "canary"] for i, rid in enumerate(ids)],
                  column_names=["event_type", "request_id", "ts_ms", "experiment_id", "arm", "decision", "hit",
                                "similarity", "similarity_mode", "score", "score_margin", "config_version",
                                "variant"])
    client.insert("feedback_raw", [[1, rid, "correct", start + 500, "test"] for rid in ids],
                  column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])
    # The other units, still at 0.53, miss half of the time: the measured gain confirms the replay's.
    client.insert("events_raw", [["decision", f"{experiment_id}-base-{i}", start + 10 + i, experiment_id, "control",
                                  "hit" if i % 2 else "miss", bool(i % 2), 0.90, "multi", 0.505, 0.05, 2, "base"]
                                 for i in range(200)],
                  column_names=["event_type", "request_id", "ts_ms", "experiment_id", "arm", "decision", "hit",
                                "similarity", "similarity_mode", "score", "score_margin", "config_version",
                                "variant"])
    after = _run(capsys, "--experiment", experiment_id, "--cooldown-s", "0", "--canary-share", "0.2")
    assert (after[("control", "canary")]["action"], after[("control", "canary")]["version"]) == ("promote", 3)
    arm = read_latest_configs(get_settings().kafka)[experiment_id].experiment.arm("control")
    assert arm.canary is None and arm.multi.threshold == pytest.approx(0.50)
    reasons = [r[0] for r in client.query("SELECT reason FROM threshold_changes WHERE experiment_id = {e:String} "
                                          "ORDER BY new_version", parameters={"e": experiment_id}).result_rows]
    assert "exploring score floor 0.500 on a canary" in reasons[0] and "canary promote" in reasons[1]
    assert "confirms the gain" in reasons[1]


def test_a_version_pushed_through_the_admin_api_is_replayable_and_gets_audited(multi_env, capsys):
    """Versions 2 and 3 reached only the control topic (as PUT /v1/admin/experiments pushes do),
    and decisions were logged at 2: auto-tune still knows its floor from the topic, even dry
    (before, only the live version and audited ones were known), and a real run audits both."""
    from cache_core.publish.control_topic import publish_confirmed
    from cache_core.events import ControlMessage
    from dashboard.control import changes, publishing
    experiment_id, client = multi_env
    settings = get_settings()
    live = publishing.current_config(settings, experiment_id)
    for version, threshold in ((2, 0.82), (3, 0.83)):
        admin = changes.set_threshold("treatment", threshold)(live).model_copy(update={"version": version})
        publish_confirmed(settings.kafka, ControlMessage(experiment=admin, actor="admin-api"),
                          base=publishing.file_configs(settings))
    ts_ms = int(datetime.now(timezone.utc).timestamp() * 1000) - 1000
    client.insert("events_raw", [["decision", f"{experiment_id}-v2-{i}", ts_ms + i, experiment_id, "control", "hit",
                                  True, 0.90, "multi", 0.60, 0.05, 2, "base"] for i in range(10)],
                  column_names=["event_type", "request_id", "ts_ms", "experiment_id", "arm", "decision", "hit",
                                "similarity", "similarity_mode", "score", "score_margin", "config_version",
                                "variant"])
    dry = _run(capsys, "--experiment", experiment_id, "--dry-run", "--cooldown-s", "0")
    assert dry[("control", "multi")]["action"] == "change", dry[("control", "multi")]["reason"]
    assert publishing.sync_audit(settings, experiment_id, client) == [2, 3]  # dry wrote nothing
    client.command("DELETE FROM threshold_changes WHERE experiment_id = {e:String}", parameters={"e": experiment_id})
    done = _run(capsys, "--experiment", experiment_id, "--cooldown-s", "0")
    assert (done[("control", "multi")]["action"], done[("control", "multi")]["version"]) == ("change", 4)
    rows = client.query("SELECT new_version, actor FROM threshold_changes WHERE experiment_id = {e:String} "
                        "ORDER BY new_version", parameters={"e": experiment_id}).result_rows
    assert rows == [(2, "admin-api"), (3, "admin-api"), (4, "autotune")]
