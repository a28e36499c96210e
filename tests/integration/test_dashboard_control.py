"""Control actions against the real broker and warehouse: concurrency, canaries, rollback, auto-tune."""
from datetime import datetime, timezone

import pytest

from cache_core.publish.control_topic import read_latest_configs
from cache_core.events import ControlMessage
from dashboard.control import autotune, changes, publishing, queries
from dashboard.control.guardrails import Guardrails
from dashboard.control.canary import rolled_back_canaries
from tests.fixtures import dashboard_seed as seed
from tests.integration.test_dashboard_app import _control_messages

pytestmark = pytest.mark.integration


def _feedback_tables_ready(client) -> bool:
    names = {r[0] for r in client.query("SELECT name FROM system.tables WHERE database = currentDatabase()").result_rows}
    return {"feedback_raw", "feedback_agg"} <= names


@pytest.fixture
def env(kafka_settings, ch_settings, tmp_path):
    with seed.control_env(kafka_settings, ch_settings, tmp_path, "ctl") as values:
        yield values


def test_second_push_from_the_same_version_is_refused(env):
    settings, experiment_id, client = env
    first = publishing.push_threshold(settings, experiment_id, "treatment", 0.75, "alice", "", client=client,
                                   expected_version=1)
    assert first.experiment.version == 2
    with pytest.raises(publishing.VersionConflict, match="now at config version 2.*not version 1"):
        publishing.push_threshold(settings, experiment_id, "treatment", 0.70, "bob", "", client=client,
                               expected_version=1)
    assert [m.experiment.version for m in _control_messages(settings.kafka)] == [2]


def test_canary_promote_then_rollback_publishes_new_versions(env):
    settings, experiment_id, client = env
    push = lambda change, v: publishing.publish_change(settings, experiment_id, change, "op", "t",
                                                   expected_version=v, client=client)
    push(changes.start_canary("treatment", 0.76, 0.2, 0.05, at_ms=1), 1)
    promoted = push(changes.promote_canary("treatment"), 2).experiment
    assert promoted.version == 3 and promoted.arm("treatment").threshold == 0.76
    assert promoted.arm("treatment").canary is None
    history = queries.change_history(client, experiment_id)
    previous = changes.previous_config(history, promoted)
    assert previous.version == 2 and previous.arm("treatment").canary is not None
    rolled = push(changes.restore_thresholds(previous), 3).experiment
    assert rolled.version == 4 and rolled.arm("treatment").threshold == 0.80 and rolled.arm("treatment").canary is None
    assert read_latest_configs(settings.kafka)[experiment_id].experiment.version == 4
    rows = queries.change_history(client, experiment_id)
    assert rows["new_version"].tolist() == [4, 3, 2]
    assert rows.set_index("new_version").at[2, "canary_share"] == 0.2


def test_admin_api_pushes_are_audited_from_the_control_topic(env):
    """A push that reached only the topic (the cache's admin API has no warehouse) gets its
    audit rows from sync_audit, once; a racing loser on the topic is never audited."""
    from cache_core.publish.control_topic import publish_confirmed, publish_control
    settings, experiment_id, client = env
    live = publishing.current_config(settings, experiment_id)
    admin = changes.set_threshold("treatment", 0.75)(live).model_copy(update={"version": 2})
    publish_confirmed(settings.kafka, ControlMessage(experiment=admin, actor="admin-api", reason="ops", ts_ms=5_000),
                      base=publishing.file_configs(settings))
    loser = changes.set_threshold("control", 0.99)(live).model_copy(update={"version": 2})
    publish_control(settings.kafka, ControlMessage(experiment=loser, actor="late", ts_ms=6_000))
    assert publishing.sync_audit(settings, experiment_id, client) == [2]
    rows = queries.change_history(client, experiment_id)
    assert rows[["arm", "actor", "old_threshold", "new_threshold", "old_version", "new_version"]].values.tolist() == [
        ["treatment", "admin-api", 0.80, 0.75, 1, 2]]
    assert rows["reason"].iloc[0] == f"ops {publishing.TOPIC_AUDIT_NOTE}"
    assert rows["ts"].iloc[0].timestamp() == 5.0
    assert publishing.sync_audit(settings, experiment_id, client) == []  # already audited
    # a sync that raced the pusher's own audit write left two rows for v2: the pusher's is shown
    publishing.record_change(client, ControlMessage(experiment=admin, actor="admin-api", reason="pusher", ts_ms=5_000),
                          "treatment", 0.80, 1)
    rows = queries.change_history(client, experiment_id)
    assert rows[["new_version", "arm", "reason"]].values.tolist() == [[2, "treatment", "pusher"]]
    # the dashboard's next push builds on it and audits itself
    pushed = publishing.push_threshold(settings, experiment_id, "control", 0.91, "op", "", client=client,
                                    expected_version=2)
    assert pushed.experiment.arm("treatment").threshold == 0.75
    assert publishing.sync_audit(settings, experiment_id, client) == []
    assert queries.audited_versions(client, experiment_id) == {2, 3}


def test_cluster_threshold_push_is_audited(env):
    settings, experiment_id, client = env
    msg = publishing.publish_change(settings, experiment_id, changes.set_cluster_threshold("control", 7, 0.93),
                                 "op", "cluster 7 is risky", expected_version=1, client=client)
    assert msg.experiment.arm("control").cluster_thresholds == {7: 0.93}
    assert queries.change_history(client, experiment_id)["arm"].tolist() == ["control"]
    with pytest.raises(ValueError, match="nothing to push"):
        publishing.publish_change(settings, experiment_id, changes.set_cluster_threshold("control", 7, 0.93),
                               "op", "", expected_version=2, client=client)


def _canary_traffic(client, experiment_id: str, arm: str, canary, wrong: int, n: int = 100) -> None:
    """``n`` labelled canary hits of ``arm`` since its canary started, ``wrong`` of them wrong."""
    ids = [f"{experiment_id}-canary-{arm}-{i}" for i in range(n)]
    client.insert("events_raw", [["decision", rid, canary.started_at_ms + 10 + i, experiment_id, arm, "hit",
                                  True, canary.threshold + 0.01, "canary"] for i, rid in enumerate(ids)],
                  column_names=["event_type", "request_id", "ts_ms", "experiment_id", "arm", "decision", "hit",
                                "similarity", "variant"])
    client.insert("feedback_raw", [[1, rid, "wrong" if i < wrong else "correct", canary.started_at_ms + 500, "test"]
                                   for i, rid in enumerate(ids)],
                  column_names=["schema_version", "request_id", "verdict", "ts_ms", "source"])


def _base_traffic(client, experiment_id: str, arm: str, canary, hits: int, n: int = 200) -> None:
    """``n`` decisions of ``arm``'s other units since its canary started, ``hits`` of them hits
    (the canary's measured hit rate is compared with theirs before a loosening is promoted)."""
    client.insert("events_raw", [["decision", f"{experiment_id}-base-{arm}-{i}", canary.started_at_ms + 10 + i,
                                  experiment_id, arm, "hit" if i < hits else "miss", i < hits, 0.85, "base"]
                                 for i in range(n)],
                  column_names=["event_type", "request_id", "ts_ms", "experiment_id", "arm", "decision", "hit",
                                "similarity", "variant"])


def test_autotune_recommends_pushes_a_canary_and_rolls_it_back(env):
    settings, experiment_id, client = env
    if not _feedback_tables_ready(client):
        pytest.fail("feedback_raw / feedback_agg migrations are not in infra/clickhouse/migrations yet")
    now = datetime.now(timezone.utc)
    seed.seed_tuning(client, experiment_id, now)
    guardrails = Guardrails(target_false_hit_rate=0.05, min_decisions=200, min_labelled=30, cooldown_s=0)
    dry = autotune.tune_experiment(settings, experiment_id, guardrails, client=client, apply=False)
    by_arm = {a.arm: a for a in dry}
    assert (by_arm["control"].action, by_arm["control"].threshold) == ("change", pytest.approx(0.87))
    # treatment is safe at 0.80 and nothing is labelled below it: explore one max step down
    assert (by_arm["treatment"].action, by_arm["treatment"].threshold) == ("explore", pytest.approx(0.77))
    assert _control_messages(settings.kafka) == []
    no_explore = autotune.tune_experiment(settings, experiment_id, guardrails, client=client, apply=False,
                                          explore=False)
    assert {a.arm: a.action for a in no_explore}["treatment"] == "hold"

    applied = autotune.tune_experiment(settings, experiment_id, guardrails, client=client, canary_share=0.1,
                                       explore_share=0.05)
    assert [a.version for a in applied if a.applied] == [2, 3]
    live = read_latest_configs(settings.kafka)[experiment_id].experiment
    canary = live.arm("control").canary
    assert canary is not None and canary.threshold == pytest.approx(0.87) and canary.share == 0.1
    probe = live.arm("treatment").canary
    assert probe is not None and probe.threshold == pytest.approx(0.77) and live.arm("treatment").threshold == 0.80
    assert probe.share == 0.05  # explorations run on their own, smaller share

    # control's canary units get wrong answers (30 of 100), treatment's right ones (0 of 200:
    # the sequential test needs that many to promote at a 5% target).
    _canary_traffic(client, experiment_id, "control", canary, wrong=30)
    _canary_traffic(client, experiment_id, "treatment", probe, wrong=0, n=200)
    _base_traffic(client, experiment_id, "treatment", probe, hits=100)  # 50% hits there, 100% on the canary
    after = autotune.tune_experiment(settings, experiment_id, guardrails, client=client)
    verdicts = {a.arm: a for a in after if a.kind == "canary"}
    assert (verdicts["control"].action, verdicts["control"].applied, verdicts["control"].version) == ("rollback", True, 4)
    assert (verdicts["treatment"].action, verdicts["treatment"].applied, verdicts["treatment"].version) == (
        "promote", True, 5)
    live = read_latest_configs(settings.kafka)[experiment_id].experiment
    assert live.arm("control").canary is None and live.arm("control").threshold == 0.90
    assert live.arm("treatment").canary is None and live.arm("treatment").threshold == pytest.approx(0.77)
    history = queries.change_history(client, experiment_id)
    reasons = history.set_index("new_version")["reason"]
    assert "exploring 0.770 on a canary" in reasons[3] and "canary promote" in reasons[5]
    # the audit remembers control's rollback (what bounds its later explorations), not the promotion
    failed = rolled_back_canaries(history, autotune.logged_configs(settings, client, live))
    assert [(f.arm, f.threshold, f.score_floor) for f in failed] == [("control", pytest.approx(0.87), None)]
    assert abs(failed[0].at_ms - history.set_index("new_version").at[4, "ts"].timestamp() * 1000) < 1
