"""The Streamlit app (AppTest) on the real warehouse and, for the push, a real Kafka broker."""
import json
import uuid
from datetime import datetime, timezone

import pytest
import yaml
import streamlit as st
from kafka import KafkaConsumer, TopicPartition
from streamlit.testing.v1 import AppTest

from cache_core.chclient import connect
from cache_core.events import ControlMessage
from cache_core.settings import get_settings
from dashboard.control import changes, publishing, queries
from infra.runtime import REPO_ROOT
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.integration
APP = str(REPO_ROOT / "dashboard" / "Home.py")
TIME_SERIES, ATTRIBUTION, CONTROL = "pages/01_Time_series.py", "pages/02_Attribution.py", "pages/03_Control_panel.py"


@pytest.fixture
def app_env(monkeypatch, ch_settings, tmp_path):
    """Point the app at the test warehouse and an experiments file with a fresh experiment."""
    experiment_id = f"dash-app-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SCACHE_CLICKHOUSE__URL", ch_settings.url)
    monkeypatch.setenv("SCACHE_CLICKHOUSE__DATABASE", ch_settings.database)
    monkeypatch.setenv("SCACHE_EXPERIMENTS_FILE", str(seed.experiments_file(tmp_path / "e.yaml", experiment_id)))
    monkeypatch.setenv("SCACHE_DASHBOARD__REFRESH_S", "60")

    def start(page: str | None = CONTROL) -> AppTest:
        """The app with the fresh experiment picked on the home page, then on ``page`` (None: home)."""
        get_settings.cache_clear()
        st.cache_data.clear()
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.selectbox(key="experiment").set_value(experiment_id).run()
        assert not at.exception, at.exception
        return switch(at, page) if page is not None else at

    yield experiment_id, start
    get_settings.cache_clear()


def switch(at: AppTest, page: str) -> AppTest:
    """Open another page of the app in the same session (its sidebar keeps the filters)."""
    at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def _texts(at: AppTest) -> str:
    return " ".join(str(e.value) for e in [*at.info, *at.caption, *at.markdown, *at.warning, *at.success])


def test_empty_state(app_env):
    _, start = app_env
    at = start(None)
    assert any("No data yet" in i.value for i in at.info)
    assert not at.error


def test_seeded_overview_and_attribution(app_env, ch_settings):
    experiment_id, start = app_env
    client = connect(ch_settings)
    seed.seed(client, experiment_id)
    client.close()
    at = start(None)
    assert not any("No data yet" in i.value for i in at.info)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == "1,000"
    assert metrics["Hit rate"] == f"{595 / 1000:.1%}"
    per_arm = at.dataframe[0].value.set_index("arm")
    assert per_arm.loc["treatment", "hits"] == 340
    # rates per request (the windows); intervals per user (the 40 seeded decisions per arm,
    # each without a unit id, so a user each): control 10 hits of 40
    assert per_arm.loc["control", "hit_rate"] == pytest.approx(0.51) and per_arm.loc["control", "users"] == 40
    assert per_arm.loc["control", "basis"] == "per user"
    assert per_arm.loc["control", "ci_low"] < 0.25 < per_arm.loc["control", "ci_high"]
    diff = at.dataframe[1].value.set_index("arm")
    assert diff.loc["treatment", "diff"] == pytest.approx(0.75 - 0.25)  # per user: 30 vs 10 hits of 40
    assert diff.loc["treatment", "p_value"] < 0.001 and diff.loc["treatment", "status"] == "ok"
    assert "Sample-ratio check passed on users per arm" in _texts(at)  # 40 vs 40 at equal weights


def test_overview_shows_solicited_verdicts_apart(app_env, ch_settings):
    """Verdicts the service asked for (feedback_requested at feedback_prob) get their own weighted
    table on the overview, with the share answered and the worst case."""
    experiment_id, start = app_env
    client = connect(ch_settings)
    now = seed.seed(client, experiment_id)
    ts_ms = int(now.timestamp() * 1000) - 60_000
    asked = [(f"{experiment_id}-ask-{i}", f"user-{i % 8}", "wrong" if i % 5 == 0 else "correct" if i % 7 else None)
             for i in range(40)]
    client.insert("events_raw", [["decision", r, ts_ms + i, "default", experiment_id, "treatment", u, "hit", True,
                                  True, 0.5] for i, (r, u, _) in enumerate(asked)],
                  column_names=["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "unit_id",
                                "decision", "hit", "feedback_requested", "feedback_prob"])
    client.insert("feedback_raw", [[1, r, v, ts_ms + 99, "user"] for r, _, v in asked if v],
                  column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])
    client.close()
    at = start(None)
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "if_unanswered_wrong" in d.value.columns).set_index("arm")
    answered = [v for _, _, v in asked if v]
    assert table.loc["treatment", "verdicts"] == len(answered) == 36
    assert table.loc["treatment", "false_hit_rate"] == pytest.approx(8 / 36)  # equal weights: the plain share
    assert table.loc["treatment", "coverage"] == pytest.approx(36 / 40)
    assert table.loc["treatment", "if_unanswered_wrong"] == pytest.approx((8 + 4) / 40)
    assert "control" not in table.index  # it never asked
    assert any("users asked at random" in s.value for s in at.subheader)


def test_push_publishes_next_version(app_env, ch_settings, kafka_settings, monkeypatch):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    at = start()
    at.selectbox(key="ctl_arm").set_value("treatment")
    at.number_input(key="ctl_threshold").set_value(0.85)  # a raise: goes out directly, as picked
    at.text_input(key="ctl_actor").input("tester")
    at.text_input(key="ctl_reason").input("fewer wrong answers")
    at.button(key="ctl_push").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "treatment threshold 0.850 as config version 2" in at.success[0].value

    messages = _control_messages(kafka_settings)
    assert len(messages) == 1
    pushed = messages[0]
    assert pushed.experiment.experiment_id == experiment_id
    assert pushed.experiment.version == 2
    assert pushed.experiment.arm("treatment").threshold == 0.85
    assert pushed.experiment.arm("control").threshold == 0.90
    assert pushed.actor == "tester"

    client = connect(ch_settings)
    rows = client.query("SELECT arm, old_threshold, new_threshold, new_version FROM threshold_changes "
                        "WHERE experiment_id = {e:String}", parameters={"e": experiment_id}).result_rows
    client.close()
    assert [tuple(r) for r in rows] == [("treatment", 0.80, 0.85, 2)]


def test_lower_threshold_from_the_panel_goes_out_as_a_canary(app_env, kafka_settings, monkeypatch):
    """A loosening typed on the panel takes auto-tune's route (dashboard.control.rollout): a canary
    even when "direct" is picked, with the reason on the page; a lower cluster threshold is refused."""
    _, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    at = start()
    at.text_input(key="ctl_actor").input("tester")
    at.selectbox(key="ctl_arm").set_value("treatment").run()
    at.number_input(key="ctl_threshold").set_value(0.75).run()
    assert at.radio(key="ctl_mode").value == "direct"
    note = next(i.value for i in at.info if "lowers the threshold" in i.value)
    assert "0.800 -> 0.750 lowers the threshold, so it goes out as a canary" in note and "sequential test" in note
    at.number_input(key="ctl_canary_share").set_value(0.2)  # the canary's inputs are offered
    at.text_input(key="ctl_reason").input("more hits")
    at.button(key="ctl_push").click().run()
    assert not at.error, [e.value for e in at.error]
    assert "treatment canary at 0.750 on 20% of units as config version 2" in at.success[0].value
    (pushed,) = _control_messages(kafka_settings)
    arm = pushed.experiment.arm("treatment")
    assert arm.threshold == 0.80 and arm.canary.threshold == 0.75 and arm.canary.share == 0.2
    assert pushed.reason == "more hits; a loosening: pushed as a canary"
    # one cluster lower than the arm: no canary of one cluster, so the push is refused, with why
    at.selectbox(key="ctl_arm").set_value("control").run()
    at.radio(key="ctl_scope").set_value("one intent cluster").run()
    at.number_input(key="ctl_cluster").set_value(4)
    at.number_input(key="ctl_threshold").set_value(0.85).run()
    assert any("Not pushable: not lowering cluster 4's threshold 0.900 -> 0.850" in w.value for w in at.warning)
    assert at.button(key="ctl_push").disabled
    assert len(_control_messages(kafka_settings)) == 1


def test_push_needs_the_admin_token(app_env, kafka_settings, monkeypatch):
    _, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    monkeypatch.setenv("SCACHE_DASHBOARD__ADMIN_TOKEN", "s3cret")
    at = start()
    at.text_input(key="ctl_actor").input("mallory")
    at.text_input(key="ctl_token").input("guess")
    at.button(key="ctl_push").click().run()
    assert any("admin token" in e.value for e in at.error)
    assert _control_messages(kafka_settings) == []


def _control_messages(kafka_settings) -> list[ControlMessage]:
    consumer = KafkaConsumer(bootstrap_servers=kafka_settings.bootstrap_servers, enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    try:
        tps = [TopicPartition(kafka_settings.control_topic, p)
               for p in consumer.partitions_for_topic(kafka_settings.control_topic)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        return [ControlMessage.model_validate(json.loads(r.value)) for r in consumer]
    finally:
        consumer.close()


def _kafka_env(monkeypatch, kafka_settings):
    monkeypatch.setenv("SCACHE_KAFKA__BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("SCACHE_KAFKA__CONTROL_TOPIC", kafka_settings.control_topic)


def test_overview_statistics_and_attribution_waterfall(app_env, ch_settings):
    experiment_id, start = app_env
    client = connect(ch_settings)
    seed.seed(client, experiment_id)
    client.close()
    at = start(None)
    diff = at.dataframe[1].value.set_index("arm")
    assert diff.loc["treatment", "prob_beat"] > 0.999
    # 40 users per arm: the fixed-horizon test rejects, the always-valid one (mixture sized for
    # 5-point differences, Λ = 13.0) is not there yet: p = 0.077
    assert diff.loc["treatment", "seq_verdict"] == "keep watching"
    assert float(diff.loc["treatment", "seq_p_value"]) == pytest.approx(0.0768, abs=5e-4)
    assert float(diff.loc["treatment", "seq_p_value"]) >= float(diff.loc["treatment", "p_value"])
    per_arm = at.dataframe[0].value.set_index("arm")
    assert per_arm.loc["treatment", "model_calls"] == 160
    assert per_arm.loc["treatment", "traffic_share"] == pytest.approx(0.5)
    switch(at, ATTRIBUTION)
    assert at.selectbox(key="experiment").value == experiment_id  # the filters follow to the next page
    texts = _texts(at)
    assert "Kitagawa" in texts and "traffic mix" in texts
    assert at.selectbox(key="dec_dim").options == ["intent_cluster", "index_kind", "lifetime_bucket"]
    tables = [d.value for d in at.dataframe]
    holm = next(t for t in tables if "p_holm" in t.columns).set_index("intent_cluster")
    assert holm.at[1, "examples"] == "How do I reset my card PIN? · I forgot my PIN"
    about = next(t for t in tables if list(t.columns) == ["intent_cluster", "requests", "examples"])
    assert about["intent_cluster"].tolist() == [1, 2, 3]  # busiest first
    assert any(i.value.startswith("No arm has a judge") for i in at.info)  # the seeded arms have none
    assert "By store tier" in [h.value for h in at.subheader]  # the treatment arm's seeded disk hits
    assert not any(i.value.startswith("No hits in this range") for i in at.info)
    switch(at, TIME_SERIES)
    at.selectbox(key="ts_metric").set_value("p95_ms").run()
    assert not at.exception
    switch(at, CONTROL)
    # the control panel offers the arm's busiest clusters to override, not a blank id
    at.radio(key="ctl_scope").set_value("one intent cluster").run()
    picker = at.selectbox(key="ctl_cluster_pick")
    assert "requests)" in picker.options[0] and picker.options[-1] == "another id"
    # ... each with what it is about: the cluster's most frequent query
    assert any(o.startswith("1 “How do I reset my card PIN?”") for o in picker.options), picker.options
    assert not at.exception


def test_attribution_shows_threshold_sources_only_for_error_bounded_arms(app_env, ch_settings):
    experiment_id, start = app_env
    client = connect(ch_settings)
    now = seed.seed(client, experiment_id)
    at = start(ATTRIBUTION)
    title = "Error-bounded thresholds: which level decided"
    assert title not in [s.value for s in at.subheader]                  # the seeded arms are global
    seed.insert_threshold_sources(client, experiment_id, int(now.timestamp() * 1000) - 120_000)
    client.close()
    at = start(ATTRIBUTION)
    assert title in [s.value for s in at.subheader]
    table = next(d.value for d in at.dataframe if "threshold_source" in d.value.columns)
    assert table["threshold_source"].tolist() == ["entry", "cluster", "arm", "static"]
    assert "configured start" in _texts(at)


def test_cluster_and_canary_pushes_then_rollback(app_env, kafka_settings, monkeypatch):
    _, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    at = start()
    at.text_input(key="ctl_actor").input("tester")
    at.selectbox(key="ctl_arm").set_value("control")
    at.radio(key="ctl_scope").set_value("one intent cluster").run()
    # no traffic in the window yet: nothing to pick from, so the id is typed
    assert at.selectbox(key="ctl_cluster_pick").options == ["another id"]
    at.number_input(key="ctl_cluster").set_value(4)
    at.number_input(key="ctl_threshold").set_value(0.95)
    at.button(key="ctl_push").click().run()
    assert "control cluster 4 threshold 0.950 as config version 2" in at.success[0].value
    at.radio(key="ctl_scope").set_value("whole arm").run()
    at.selectbox(key="ctl_arm").set_value("treatment").run()
    at.number_input(key="ctl_threshold").set_value(0.76)
    at.radio(key="ctl_mode").set_value("canary").run()
    at.number_input(key="ctl_canary_share").set_value(0.25)
    at.button(key="ctl_push").click().run()
    assert not at.error, [e.value for e in at.error]
    assert "canary at 0.760 on 25% of units as config version 3" in at.success[0].value
    assert any("canary threshold 0.760" in m.value for m in at.markdown)  # the running-canary panel
    rollback = at.button(key="ctl_rollback")
    assert "version 2" in rollback.label
    rollback.click().run()
    assert "config version 4" in at.success[0].value
    latest = _control_messages(kafka_settings)[-1].experiment
    assert latest.version == 4 and latest.arm("treatment").canary is None
    assert latest.arm("control").cluster_thresholds == {4: 0.95}


def test_push_refused_when_config_moved_since_loading(app_env, kafka_settings, monkeypatch):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    at = start()  # loads version 1
    settings = get_settings()
    publishing.push_threshold(settings, experiment_id, "control", 0.91, "someone-else", "", expected_version=1)
    at.text_input(key="ctl_actor").input("tester")
    at.number_input(key="ctl_threshold").set_value(0.70)
    at.button(key="ctl_push").click().run()
    assert any("now at config version 2" in e.value and "reload" in e.value for e in at.error)
    assert [m.experiment.version for m in _control_messages(kafka_settings)] == [2]
    at.button(key="ctl_reload").click().run()
    at.text_input(key="ctl_actor").input("tester")
    at.number_input(key="ctl_threshold").set_value(0.70)
    at.button(key="ctl_push").click().run()
    assert "config version 3" in at.success[0].value


def test_reload_audits_a_version_pushed_past_the_dashboard(app_env, ch_settings, kafka_settings, monkeypatch):
    """An admin-API push reaches only the topic; the panel, which reads configs from the
    warehouse, shows it after Reload audits it, and the history lists it."""
    from cache_core.publish.control_topic import publish_confirmed
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    at = start()
    settings = get_settings()
    live = publishing.current_config(settings, experiment_id)
    admin = changes.set_threshold("treatment", 0.74)(live).model_copy(update={"version": 2})
    publish_confirmed(settings.kafka, ControlMessage(experiment=admin, actor="admin-api", reason="ops"),
                      base=publishing.file_configs(settings))
    at.button(key="ctl_reload").click().run()
    assert not at.exception, at.exception
    assert any("Audited config version(s) 2 from the control topic" in m.value for m in at.success)
    assert any("Config version 2 loaded, last updated by" in c.value for c in at.caption)
    history = queries.change_history(connect(ch_settings), experiment_id)
    assert history[["actor", "new_version", "new_threshold"]].values.tolist() == [["admin-api", 2, 0.74]]


def test_reload_with_the_broker_down_warns_and_still_reloads(app_env, monkeypatch):
    from infra.runtime import free_port
    experiment_id, start = app_env
    monkeypatch.setenv("SCACHE_KAFKA__BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")  # nothing listens
    at = start()
    at.button(key="ctl_reload").click().run()
    assert not at.exception, at.exception
    assert any("Could not read the control topic" in w.value for w in at.warning)
    assert any("Config version 1 loaded" in c.value for c in at.caption)


def test_rollback_needs_the_admin_token(app_env, kafka_settings, monkeypatch):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    monkeypatch.setenv("SCACHE_DASHBOARD__ADMIN_TOKEN", "s3cret")
    get_settings.cache_clear()
    publishing.push_threshold(get_settings(), experiment_id, "control", 0.91, "someone", "")
    at = start()
    at.text_input(key="ctl_actor").input("mallory")
    at.button(key="ctl_rollback").click().run()
    assert any("admin token" in e.value for e in at.error)
    assert len(_control_messages(kafka_settings)) == 1


def test_autotune_recommendation_shown(app_env, ch_settings, kafka_settings, monkeypatch):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    client = connect(ch_settings)
    from tests.integration.test_dashboard_control import _feedback_tables_ready
    if not _feedback_tables_ready(client):
        pytest.fail("feedback_raw / feedback_agg migrations are not in infra/clickhouse/migrations yet")
    seed.seed(client, experiment_id)
    seed.seed_tuning(client, experiment_id, datetime.now(timezone.utc))
    client.close()
    at = start()
    recs = next(d.value for d in at.dataframe if "why" in d.value.columns).set_index("arm")
    assert recs.loc["control", "action"] == "change"
    assert recs.loc["control", "recommended"] == pytest.approx(0.87)
    assert (recs.loc["treatment", "action"], recs.loc["treatment", "recommended"]) == ("explore", pytest.approx(0.77))
    assert at.button(key="tune_apply").label.startswith("Apply 2")
    # applied directly (no canary), an exploration is not offered: its false-hit rate is unknown
    at.checkbox(key="tune_as_canary").uncheck().run()
    recs = next(d.value for d in at.dataframe if "why" in d.value.columns).set_index("arm")
    assert recs.loc["treatment", "action"] == "hold" and at.button(key="tune_apply").label.startswith("Apply 1")
    at.checkbox(key="tune_as_canary").check().run()
    at.number_input(key="tune_explore_share").set_value(0.05).run()
    at.text_input(key="ctl_actor").input("tester")
    at.button(key="tune_apply").click().run()
    assert not at.error, [e.value for e in at.error]
    live = _control_messages(kafka_settings)[-1].experiment
    assert (live.arm("control").canary.threshold, live.arm("control").canary.share) == (pytest.approx(0.87), 0.1)
    assert live.arm("treatment").canary.threshold == pytest.approx(0.77) and live.arm("treatment").threshold == 0.80
    assert live.arm("treatment").canary.share == pytest.approx(0.05)  # the exploration's own share


def test_autotune_explores_a_smaller_step_after_a_rolled_back_canary(app_env, ch_settings, kafka_settings,
                                                                     monkeypatch):
    """The panel reads the audit: treatment's canary at 0.77 was rolled back, so its next
    exploration stays above 0.77 even though no canary labels are in the window."""
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    client = connect(ch_settings)
    seed.seed_tuning(client, experiment_id, datetime.now(timezone.utc))
    settings = get_settings()
    for change, version in ((changes.start_canary("treatment", 0.77, 0.1, 0.05, at_ms=1), 1),
                            (changes.rollback_canary("treatment"), 2)):
        publishing.publish_change(settings, experiment_id, change, "op", "t", expected_version=version, client=client)
    client.close()
    at = start()
    at.number_input(key="tune_cooldown").set_value(0).run()
    recs = next(d.value for d in at.dataframe if "why" in d.value.columns).set_index("arm")
    assert (recs.loc["treatment", "action"], recs.loc["treatment", "recommended"]) == ("explore", pytest.approx(0.775))
    assert "a smaller step: a canary at threshold 0.770 was rolled back" in recs.loc["treatment", "why"]


def test_control_panel_whatif_of_a_multi_arm(app_env, ch_settings, tmp_path):
    """A multi arm's what-if re-applies its floor / margin (not the cosine reading) and says
    what it cannot replay; its answer-margin what-if is shown."""
    experiment_id, start = app_env
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"experiments": [{
        "experiment_id": experiment_id, "salt": f"{experiment_id}-salt", "arms": [
            {"name": "control", "threshold": 0.90, "similarity": "multi",
             "multi": {"threshold": 0.5, "answer_margin": 0.01}},
            {"name": "treatment", "threshold": 0.80}]}]}))
    # control, logged at 0.90: 20 clear hits, 10 hits with a 0.005 lead (served under an older
    # margin, refused by 0.01 now), 10 misses with nothing past the cosine gate.
    names = ["event_type", "request_id", "ts_ms", "namespace", "experiment_id", "arm", "decision", "hit",
             "threshold", "similarity", "similarity_mode", "score", "score_margin"]
    ts_ms = int(datetime.now(timezone.utc).timestamp() * 1000) - 60_000
    rows = [(0.95, True, 0.7, 0.05)] * 20 + [(0.95, True, 0.7, 0.005)] * 10 + [(0.85, False, None, None)] * 10
    client = connect(ch_settings)
    client.insert("events_raw", [
        ["decision", f"{experiment_id}-m{i}", ts_ms + i, "default", experiment_id, "control",
         "hit" if hit else "miss", hit, 0.90, sim, "multi", score, margin]
        for i, (sim, hit, score, margin) in enumerate(rows)], column_names=names)
    client.close()
    at = start()
    assert not at.exception and not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Estimated hit rate of control at 0.900"] == "50.0%"  # cosine reading: 75.0%
    assert "control is a multi-similarity arm" in _texts(at)
    assert "Multi-similarity arms (control)" in _texts(at)
    margins = next(d.value for d in at.dataframe if "answer_margin" in d.value.columns).set_index("answer_margin")
    assert margins.at[0.005, "est_hits"] == 30 and margins.at[0.01, "est_hits"] == 20
    at.number_input(key="ctl_threshold").set_value(0.85).run()
    assert any("below the lowest logged cosine threshold 0.900" in w.value for w in at.warning)


def test_threshold_input_follows_the_picked_arm_unless_edited(app_env):
    _, start = app_env
    at = start()
    assert at.number_input(key="ctl_threshold").value == pytest.approx(0.90)  # control
    at.selectbox(key="ctl_arm").set_value("treatment").run()
    assert at.number_input(key="ctl_threshold").value == pytest.approx(0.80)
    at.number_input(key="ctl_threshold").set_value(0.70).run()
    assert at.number_input(key="ctl_threshold").value == pytest.approx(0.70)  # an edit stays
    at.selectbox(key="ctl_arm").set_value("control").run()
    assert at.number_input(key="ctl_threshold").value == pytest.approx(0.90)


def _multi_experiments_file(tmp_path, experiment_id: str) -> None:
    (tmp_path / "e.yaml").write_text(yaml.safe_dump({"experiments": [{
        "experiment_id": experiment_id, "salt": f"{experiment_id}-salt", "arms": [
            {"name": "control", "threshold": 0.90, "similarity": "multi",
             "multi": {"threshold": 0.5, "answer_margin": 0.01}},
            {"name": "treatment", "threshold": 0.80}]}]}))


def test_push_wrong_answer_removal_publishes_next_version(app_env, ch_settings, kafka_settings, monkeypatch,
                                                          tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    _multi_experiments_file(tmp_path, experiment_id)
    at = start()
    assert at.number_input(key="ctl_invalidate_after").value == 1  # the default: one user's wrong verdict
    at.number_input(key="ctl_invalidate_after").set_value(3)
    at.text_input(key="ctl_actor").input("tester")
    at.button(key="ctl_invalidate_push").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "control removes entries after 3 users' wrong verdicts as config version 2" in at.success[0].value

    pushed = _control_messages(kafka_settings)[-1]
    assert pushed.experiment.version == 2 and pushed.experiment.arm("control").invalidate_after_wrong == 3
    assert pushed.experiment.arm("treatment").invalidate_after_wrong == 1
    assert pushed.experiment.arm("control").threshold == 0.90 and pushed.reason == "users before removal 1 → 3"
    client = connect(ch_settings)
    rows = client.query("SELECT arm, new_version, config_json FROM threshold_changes WHERE experiment_id = {e:String}",
                        parameters={"e": experiment_id}).result_rows
    client.close()
    assert [tuple(r[:2]) for r in rows] == [("control", 2)]
    assert json.loads(rows[0][2])["arms"][0]["invalidate_after_wrong"] == 3

    at.button(key="ctl_invalidate_push").click().run()  # unchanged: refused, nothing published
    assert any("nothing to push" in e.value for e in at.error), [e.value for e in at.error]
    assert len(_control_messages(kafka_settings)) == 1
    rollback = at.button(key="ctl_rollback")
    assert "removal after 1" in rollback.label
    rollback.click().run()
    assert _control_messages(kafka_settings)[-1].experiment.arm("control").invalidate_after_wrong == 1


def test_push_multi_margin_publishes_next_version(app_env, ch_settings, kafka_settings, monkeypatch, tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    _multi_experiments_file(tmp_path, experiment_id)
    at = start()
    assert at.number_input(key="ctl_multi_floor").value == pytest.approx(0.5)  # the arm's current values
    assert at.number_input(key="ctl_multi_margin").value == pytest.approx(0.01)
    at.number_input(key="ctl_multi_margin").set_value(0.02)
    at.text_input(key="ctl_actor").input("tester")
    at.text_input(key="ctl_multi_reason").input("fewer near-ties")
    at.button(key="ctl_multi_push").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "control score floor 0.500, answer margin 0.020 as config version 2" in at.success[0].value
    assert at.number_input(key="ctl_multi_margin").value == pytest.approx(0.02)  # reloaded at version 2

    messages = _control_messages(kafka_settings)
    assert len(messages) == 1
    pushed = messages[0]
    assert (pushed.experiment.experiment_id, pushed.experiment.version) == (experiment_id, 2)
    multi = pushed.experiment.arm("control").multi
    assert (multi.answer_margin, multi.threshold) == (0.02, 0.5)
    assert pushed.experiment.arm("control").threshold == 0.90
    assert pushed.experiment.arm("treatment").threshold == 0.80
    assert (pushed.actor, pushed.reason) == ("tester", "answer margin 0.010 → 0.020; fewer near-ties")

    client = connect(ch_settings)
    rows = client.query("SELECT arm, old_threshold, new_threshold, new_version, config_json FROM threshold_changes "
                        "WHERE experiment_id = {e:String}", parameters={"e": experiment_id}).result_rows
    client.close()
    assert [tuple(r[:4]) for r in rows] == [("control", 0.90, 0.90, 2)]
    assert json.loads(rows[0][4])["arms"][0]["multi"]["answer_margin"] == 0.02

    # an unchanged push is refused with the reason, and nothing more is published
    at.button(key="ctl_multi_push").click().run()
    assert any("nothing to push" in e.value for e in at.error), [e.value for e in at.error]
    assert len(_control_messages(kafka_settings)) == 1
    # a cosine arm has no floor / margin to push
    at.selectbox(key="ctl_arm").set_value("treatment").run()
    assert "ctl_multi_push" not in [b.key for b in at.button]
    # rolling back brings the old margin back
    rollback = at.button(key="ctl_rollback")
    assert "control 0.900 floor 0.500 margin 0.010" in rollback.label
    rollback.click().run()
    assert not at.error, [e.value for e in at.error]
    latest = _control_messages(kafka_settings)[-1].experiment
    assert latest.version == 3 and latest.arm("control").multi.answer_margin == 0.01


def test_lower_margin_from_the_panel_goes_out_as_a_canary(app_env, kafka_settings, monkeypatch, tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    _multi_experiments_file(tmp_path, experiment_id)
    at = start()
    at.number_input(key="ctl_multi_margin").set_value(0.005).run()
    assert at.radio(key="ctl_multi_mode").value == "direct"
    assert any("Answer margin 0.010 -> 0.005 serves what the arm refuses now, so it goes out as a canary" in i.value
               for i in at.info), [i.value for i in at.info]
    at.text_input(key="ctl_actor").input("tester")
    at.button(key="ctl_multi_push").click().run()
    assert not at.error, [e.value for e in at.error]
    (pushed,) = _control_messages(kafka_settings)
    arm = pushed.experiment.arm("control")
    assert arm.multi.answer_margin == 0.01 and arm.canary.answer_margin == 0.005 and arm.canary.score_floor is None
    assert pushed.reason == "answer margin 0.010 → 0.005; a loosening: pushed as a canary"


def test_push_multi_needs_the_admin_token(app_env, kafka_settings, monkeypatch, tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    monkeypatch.setenv("SCACHE_DASHBOARD__ADMIN_TOKEN", "s3cret")
    _multi_experiments_file(tmp_path, experiment_id)
    at = start()
    at.number_input(key="ctl_multi_margin").set_value(0.02)
    at.text_input(key="ctl_actor").input("mallory")
    at.text_input(key="ctl_token").input("guess")
    at.button(key="ctl_multi_push").click().run()
    assert any("admin token" in e.value for e in at.error)
    assert _control_messages(kafka_settings) == []


def test_multi_floor_recommendation_shown_and_copied_only_on_request(app_env, ch_settings, kafka_settings,
                                                                      monkeypatch, tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    seed.multi_experiments_file(tmp_path / "e.yaml", experiment_id)
    client = connect(ch_settings)
    seed.seed_multi_tuning(client, experiment_id, datetime.now(timezone.utc))
    client.close()
    at = start()
    assert not at.exception and not at.error, [e.value for e in at.error]
    note = next(i.value for i in at.info if "Auto-tune recommends score floor" in i.value)
    assert f"score floor **{seed.MULTI_TUNED_FLOOR:.3f}** and answer margin **0.005**" in note
    assert "over 400 labelled hits, from 1000 logged decisions" in note  # the time-uniform bound split over the pairs
    assert "false-hit rate 0.0% with time-uniform 95% upper bound 3.1%" in note
    # shown, not applied: the inputs keep the arm's current values until the button is pressed
    assert at.number_input(key="ctl_multi_floor").value == pytest.approx(0.5)
    at.button(key="ctl_multi_use_rec").click().run()
    assert at.number_input(key="ctl_multi_floor").value == pytest.approx(seed.MULTI_TUNED_FLOOR)
    assert at.number_input(key="ctl_multi_margin").value == pytest.approx(0.005)
    assert _control_messages(kafka_settings) == []  # copying pushes nothing
    at.text_input(key="ctl_actor").input("tester")
    at.button(key="ctl_multi_push").click().run()
    assert not at.error, [e.value for e in at.error]
    (pushed,) = _control_messages(kafka_settings)
    assert pushed.experiment.arm("control").multi.threshold == pytest.approx(seed.MULTI_TUNED_FLOOR)
    assert pushed.reason.startswith("score floor 0.500 → 0.520; auto-tune recommendation: best hit rate")
    # After the push the arm is in its cool-down: no recommendation, and the panel says why.
    assert "ctl_multi_use_rec" not in [b.key for b in at.button]
    assert "Auto-tune recommends no change to control's floor / margin: cool-down" in _texts(at)


def test_multi_floor_exploration_offered_and_pushed_as_a_canary(app_env, ch_settings, kafka_settings,
                                                               monkeypatch, tmp_path):
    experiment_id, start = app_env
    _kafka_env(monkeypatch, kafka_settings)
    seed.multi_experiments_file(tmp_path / "e.yaml", experiment_id, floor=0.53)
    client = connect(ch_settings)
    seed.seed_multi_tuning(client, experiment_id, datetime.now(timezone.utc), served_from=530)
    client.close()
    at = start()
    assert not at.exception and not at.error, [e.value for e in at.error]
    note = next(i.value for i in at.info if "would explore on a canary" in i.value)
    assert "exploring score floor 0.500 on a canary: 0.530 is the best replayable floor" in note
    at.button(key="ctl_multi_use_explore").click().run()
    assert at.number_input(key="ctl_multi_floor").value == pytest.approx(0.50)
    assert at.radio(key="ctl_multi_mode").value == "canary"
    assert _control_messages(kafka_settings) == []  # copying pushes nothing
    at.text_input(key="ctl_actor").input("tester")
    at.button(key="ctl_multi_push").click().run()
    assert not at.error, [e.value for e in at.error]
    (pushed,) = _control_messages(kafka_settings)
    arm = pushed.experiment.arm("control")
    assert arm.multi.threshold == 0.53 and arm.canary.score_floor == pytest.approx(0.50)
    assert arm.canary.answer_margin is None and arm.canary.share == 0.1
    assert any("score floor 0.500 (arm 0.530)" in m.value for m in at.markdown)  # the running-canary panel


def test_multi_arm_without_mixed_scores_says_why_no_recommendation(app_env, tmp_path):
    experiment_id, start = app_env
    seed.multi_experiments_file(tmp_path / "e.yaml", experiment_id)
    at = start()
    assert "Auto-tune recommends no change to control's floor / margin: only 0 logged decisions" in _texts(at)
    assert "ctl_multi_use_rec" not in [b.key for b in at.button]
