"""``./scache serve`` (which services it starts) and ``./scache replay`` (reading a user's log, its pace,
and a replay through the real service with judged feedback), without starting any real service."""
from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra import replay as replay_module
from infra.replay import ReplayError, read_log, schedule
from infra.stack import Stack
from infra.traffic import Tally
from tests.unit.cache_core.helpers import RecordingPublisher


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_json_lines_and_csv_read_alike_with_optional_fields(tmp_path):
    jsonl = _write(tmp_path, "log.jsonl", "\n".join(json.dumps(r) for r in [
        {"query": "reset my PIN", "unit": "u1", "namespace": "cards", "timestamp": "2026-01-01T00:00:00+00:00",
         "label": "pin"},
        {"text": "card lost", "unit_id": 7, "ts": 1767225605000, "expected_answer": "Freeze it."},
        {"query": "no extras"},
    ]) + "\n\n")
    csv = _write(tmp_path, "log.csv", "query,unit,namespace,timestamp,answer,label\n"
                                      "reset my PIN,u1,cards,1767225600,,pin\ncard lost,7,,1767225605,Freeze it.,\n"
                                      "no extras,,,,,\n")
    for path in (jsonl, csv):
        first, second, third = read_log(path)
        assert (first.text, first.unit_id, first.namespace, first.label, first.answer) == \
            ("reset my PIN", "u1", "cards", "pin", None)
        assert first.at_s == 1767225600.0 and second.at_s == 1767225605.0  # ISO, epoch s and ms agree
        assert (second.unit_id, second.answer, second.label) == ("7", "Freeze it.", None)
        assert third.unit_id.startswith("user-") and third.at_s is None and third.namespace is None


@pytest.mark.parametrize("line, reason", [
    ('{"answer": "a"}', "query must be a non-empty string"),
    ('{"query": "q", "timestamp": "yesterday"}', "neither a number nor ISO 8601"),
    ('{"query": "q", "timestamp": -5}', "non-negative"),
    ('{"query": "q", "label": ["a"]}', "label must be text"),
    ('{"query": "q", "bogus": 1}', "unknown fields ['bogus']"),
    ('["q"]', "a record must be an object"),
])
def test_a_bad_record_is_named_by_line_and_nothing_is_sent(tmp_path, line, reason):
    path = _write(tmp_path, "bad.jsonl", '{"query": "fine"}\n' + line + "\n")
    with pytest.raises(ReplayError, match=r"bad\.jsonl:2: ") as caught:
        read_log(path)
    assert reason in str(caught.value) and "nothing sent" in str(caught.value)


def test_recorded_pace_or_a_given_rate(tmp_path):
    path = _write(tmp_path, "log.jsonl", '{"query": "a", "ts": 100}\n{"query": "b", "ts": 103}\n'
                                         '{"query": "c", "ts": 101}\n{"query": "d", "ts": 110.5}\n')
    queries = read_log(path)
    assert [o for o, _ in schedule(queries, None)] == [0, 3, 3, 10.5]  # out of order: sent at once
    assert [o for o, _ in schedule(queries, 4)] == [0, 0.25, 0.5, 0.75]
    untimed = read_log(_write(tmp_path, "untimed.jsonl", '{"query": "a"}\n{"query": "b", "ts": 5}\n'))
    assert [o for o, _ in schedule(untimed, None)] == [0, 0.1]  # the default rate


@pytest.fixture()
def api(minilm_embedder):
    publisher = RecordingPublisher()
    with TestClient(create_app(build_components(Settings(service={"open_access": True}), publisher, minilm_embedder)), raise_server_exceptions=False) as client:
        client.publisher = publisher
        yield client


def test_a_replay_stores_misses_and_judges_hits_by_label_or_expected_answer(api, tmp_path):
    rows = [
        {"query": "How do I reset my card PIN?", "unit": "u1", "label": "pin"},
        {"query": "How do I reset my card PIN?", "unit": "u1", "label": "pin"},          # hit, right
        {"query": "How do I reset my card PIN?", "unit": "u1", "label": "lost-card"},    # hit, wrong
        {"query": "Where is my parcel?", "unit": "u1", "answer": "Track it in the app."},
        {"query": "Where is my parcel?", "unit": "u1", "answer": "Track it in the app."},  # hit, right
        {"query": "What time is it in Tokyo?", "unit": "u1"},
        {"query": "What time is it in Tokyo?", "unit": "u1"},                            # hit, unjudged
    ]
    path = _write(tmp_path, "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    tally = Tally()
    assert replay_module.replay(api, read_log(path), 1000.0, None, tally) == len(rows)
    (arm,) = tally.requests
    if arm == "holdout":
        pytest.skip("u1 landed in the holdout")
    assert (tally.requests[arm], tally.hits[arm], tally.false_hits[arm], tally.unjudged[arm]) == (7, 4, 1, 1)
    assert [f.verdict for f in api.publisher.feedback] == ["correct", "wrong", "correct"]
    assert f"{arm}: 7 req, hit 57.1%, false 1 (1 unjudged)" == tally.line()


def test_replay_main_prints_the_per_arm_summary(api, tmp_path, capsys):
    path = _write(tmp_path, "log.csv", "query,unit\nhello there,u2\nhello there,u2\n")
    assert replay_module.main([str(path), "--rate", "1000"], client=api) == 0
    out = capsys.readouterr().out
    assert "replaying 2 queries" in out and "sent 2 of 2: " in out and "req, hit" in out


def test_serve_uses_the_services_the_environment_names_and_starts_the_rest(tmp_path, monkeypatch):
    started: list[tuple] = []
    stack = Stack(state_dir=tmp_path)
    for name in ("start_kafka", "start_warehouse", "start_flink_job", "start_demo_model", "start_cache",
                 "start_dashboard", "start_autotune"):
        monkeypatch.setattr(stack, name, lambda *a, _n=name, **k: started.append((_n, a, k)))
    for name in [n for n in os.environ if n.startswith("SCACHE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SCACHE_KAFKA__BOOTSTRAP_SERVERS", "kafka.example:9092")
    monkeypatch.setenv("SCACHE_SERVICE__UPSTREAM_URL", "http://model.example/v1/chat/completions")
    stack.start_all(use_configured=True, cache_port=8123, dashboard_port=8124)
    assert [s[0] for s in started] == ["start_kafka", "start_warehouse", "start_flink_job", "start_cache",
                                       "start_dashboard"]
    assert started[0][2] == {"external": True} and started[1][2] == {"external": False}
    assert started[3][1] == (8123,) and started[4][1] == (8124,)
    started.clear()
    monkeypatch.setenv("SCACHE_DASHBOARD__AUTOTUNE_EVERY_S", "600")
    monkeypatch.delenv("SCACHE_SERVICE__UPSTREAM_URL")
    stack.start_all()  # the demo: starts its own Kafka whatever the environment says
    assert started[0][2] == {"external": False}
    assert [s[0] for s in started][-3:] == ["start_cache", "start_dashboard", "start_autotune"]
    assert "start_demo_model" in [s[0] for s in started] and started[-1][1] == (600.0,)


def test_replay_finds_the_running_stack_and_ignores_a_stale_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SCACHE_HOME", str(tmp_path))
    with pytest.raises(ReplayError, match="no running cache found"):
        replay_module.running_cache_url()
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "stack.json").write_text(json.dumps({"pid": 2 ** 22 + 1, "cache_url": "http://x"}))
    with pytest.raises(ReplayError):  # no such process: stale
        replay_module.running_cache_url()
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "stack.json").write_text(json.dumps({"pid": os.getpid(),
                                                               "cache_url": "http://127.0.0.1:8000"}))
    assert replay_module.running_cache_url() == "http://127.0.0.1:8000"


def test_a_canned_answer_stored_by_an_earlier_run_is_still_judged_by_its_label():
    from infra.traffic import Judge, Query, answer_for

    judge = Judge()  # a fresh run: it stored nothing itself
    asked = Query("reset my PIN", "u1", label="change_pin")
    assert judge.verdict(answer_for("change_pin"), asked) == "correct"
    assert judge.verdict(answer_for("lost_card"), asked) == "wrong"
    assert judge.verdict("[not canned] something else", asked) is None


def test_serve_starts_with_arms_meant_for_real_traffic_unless_given_a_file(tmp_path, monkeypatch):
    """Not the demo's arms (one at cosine 0.80, two-minute lifetimes): every arm of serve's own file
    serves at 0.95 or above and keeps answers a day; a file the user names wins."""
    from cache_core.experiments import load_experiments
    from infra.stack import SERVE_EXPERIMENTS, serve_experiments

    monkeypatch.delenv("SCACHE_EXPERIMENTS_FILE", raising=False)
    path = serve_experiments(Stack(state_dir=tmp_path))
    assert path == SERVE_EXPERIMENTS
    arms = [arm for experiment in load_experiments(path).values() for arm in experiment.arms]
    assert len(arms) >= 2 and all(arm.threshold >= 0.95 and arm.ttl_s >= 86400 for arm in arms)
    assert {e.partition_mode for e in load_experiments(path).values()} == {"shared"}
    own = _write(tmp_path, "mine.yaml", "experiments: []\n")
    monkeypatch.setenv("SCACHE_EXPERIMENTS_FILE", str(own))
    stack = Stack(state_dir=tmp_path)
    assert serve_experiments(stack) == own and "SCACHE_EXPERIMENTS_FILE" not in stack.env


def test_a_cache_started_without_a_file_serves_the_safe_arms_and_only_the_demo_shows_the_showcase(tmp_path,
                                                                                                  monkeypatch):
    """``python -m cache_core.service`` (the images' command) and anything else that reads the settings get
    serve's arms by default; the demo alone asks for its showcase (one arm at 0.80), and a named file wins."""
    from cache_core.experiments import load_experiments
    from cache_core.settings import Settings
    from infra.stack import DEMO_EXPERIMENTS, SERVE_EXPERIMENTS, demo_experiments

    monkeypatch.delenv("SCACHE_EXPERIMENTS_FILE", raising=False)
    assert Settings().experiments_file == SERVE_EXPERIMENTS
    assert demo_experiments(Stack(state_dir=tmp_path)) == DEMO_EXPERIMENTS
    assert min(arm.threshold for e in load_experiments(DEMO_EXPERIMENTS).values() for arm in e.arms) < 0.95
    own = _write(tmp_path, "mine.yaml", "experiments: []\n")
    monkeypatch.setenv("SCACHE_EXPERIMENTS_FILE", str(own))
    stack = Stack(state_dir=tmp_path)
    assert demo_experiments(stack) == own and "SCACHE_EXPERIMENTS_FILE" not in stack.env
