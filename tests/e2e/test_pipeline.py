"""The whole pipe, for real: cache service -> Kafka -> Flink -> ClickHouse, and the
control topic back into the cache.

Known requests go through the HTTP API; the per-arm request and hit counts that the
Flink job writes to ClickHouse must equal what the cache answered, and a threshold
pushed on the control topic must change the decisions that follow.
"""
from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from cache_core.chclient import connect
from cache_core.publish.control_topic import publish_control
from cache_core.events import ControlMessage
from cache_core.experiments import load_experiments
from dashboard.control import queries as dashboard_queries
from infra.stack import Stack
from infra.traffic import answer_for, load_queries, units_per_arm

pytestmark = pytest.mark.e2e
EXPERIMENT = "threshold-ab"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(state_dir=tmp_path_factory.mktemp("stack"), window_s=2)
    stack.env["SCACHE_CACHE__EMIT_QUERY_TEXT"] = "true"  # the cluster-examples test reads them back
    try:
        stack.start_kafka()
        stack.start_warehouse()
        stack.start_flink_job()
        stack.start_demo_model()
        stack.start_cache()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def api(stack):
    with httpx.Client(base_url=stack.service("cache-service").info["url"], timeout=30) as client:
        yield client


def _arm_totals(stack: Stack) -> dict[str, tuple[int, int]]:
    settings = stack.settings()
    client = connect(settings.clickhouse)
    rows = client.query(
        "SELECT arm, sum(requests), sum(hits) FROM window_agg FINAL "
        "WHERE experiment_id = {exp:String} GROUP BY arm",
        parameters={"exp": EXPERIMENT},
    ).result_rows
    return {arm: (int(n), int(h)) for arm, n, h in rows}


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(1)
    raise AssertionError(f"{what}: still {last!r} after {timeout_s:.0f}s")


def test_counts_in_clickhouse_equal_requests_sent(stack, api):
    train = load_queries("train")
    by_intent: dict[str, list[str]] = {}
    for text, intent in train:
        by_intent.setdefault(intent, []).append(text)
    intents = sorted(by_intent)[:10]
    units = units_per_arm(stack.settings().experiments_file, EXPERIMENT, per_arm=3)
    for arm_units in units.values():
        for intent in intents:
            r = api.post("/v1/store", json={"query": by_intent[intent][0], "answer": answer_for(intent),
                                            "unit_id": arm_units[0], "experiment_id": EXPERIMENT})
            assert r.status_code == 200, r.text

    # Exact repeats (certain hits), paraphrases from the same intent, and unrelated text.
    queries = [by_intent[i][0] for i in intents] + [by_intent[i][5] for i in intents] + [
        "What is the boiling point of water on Mars?", "Recommend a good sci-fi novel",
    ]
    sent, hits = Counter(), Counter()
    for arm, arm_units in units.items():
        for unit in arm_units:
            for q in queries:
                body = api.post("/v1/lookup", json={"query": q, "unit_id": unit,
                                                    "experiment_id": EXPERIMENT}).json()
                assert body["arm"] == arm
                sent[arm] += 1
                hits[arm] += bool(body["hit"])
    assert all(hits[arm] >= len(intents) * len(units[arm]) for arm in units), hits
    assert all(hits[arm] < sent[arm] for arm in units), "unrelated queries must miss"

    expected = {arm: (sent[arm], hits[arm]) for arm in sent}
    _wait_for(lambda: ((t := _arm_totals(stack)) == expected, t), timeout_s=180,
              what=f"ClickHouse per-arm (requests, hits) to equal {expected}")


def test_threshold_pushed_on_control_topic_changes_decisions(stack, api):
    settings = stack.settings()
    experiment = load_experiments(settings.experiments_file)[EXPERIMENT]
    arm = experiment.arms[0]
    unit = units_per_arm(settings.experiments_file, EXPERIMENT)[arm.name][0]
    stored, probe = "How do I reset my card PIN?", "I forgot the PIN for my card, how can I change it"
    assert api.post("/v1/store", json={"query": stored, "answer": "Use the app: Card > PIN.",
                                       "unit_id": unit, "experiment_id": EXPERIMENT}).status_code == 200
    before = api.post("/v1/lookup", json={"query": probe, "unit_id": unit, "experiment_id": EXPERIMENT}).json()
    similarity = before["similarity"]
    assert similarity is not None and 0.3 < similarity < arm.threshold, before
    assert before["hit"] is False

    current = before["config_version"]
    new_arms = [a.model_copy(update={"threshold": round(similarity - 0.05, 3)}) if a.name == arm.name else a
                for a in experiment.arms]
    new_config = experiment.model_copy(update={"arms": new_arms, "version": current + 1})
    publish_control(settings.kafka, ControlMessage(experiment=new_config, actor="e2e-test", reason="lower"))

    def changed():
        body = api.post("/v1/lookup", json={"query": probe, "unit_id": unit, "experiment_id": EXPERIMENT}).json()
        return body["hit"] and body["config_version"] == current + 1, body

    after = _wait_for(changed, timeout_s=30, what="decision after the threshold push")
    assert after["threshold"] == pytest.approx(similarity - 0.05, abs=1e-3)


def test_emitted_query_texts_name_their_intent_cluster_on_the_dashboard(stack, api):
    """Query text on (as the demo runs): the dashboard's cluster examples come back from
    ClickHouse through Kafka and Flink, each under the cluster the cache assigned."""
    unit = units_per_arm(stack.settings().experiments_file, EXPERIMENT)["control"][0]
    asked = ["Is there a fee for topping up by card?", "Which currencies can I hold?"]
    clusters = {}
    for text in asked:  # asked more often than any earlier query, so among the top examples
        for _ in range(8):
            body = api.post("/v1/lookup", json={"query": text, "unit_id": unit, "experiment_id": EXPERIMENT}).json()
        clusters[text] = body["intent_cluster"]
    client = connect(stack.settings().clickhouse)
    now = datetime.now(timezone.utc)
    filters = dashboard_queries.Filters(EXPERIMENT, now - timedelta(hours=1), now + timedelta(minutes=5))

    def named():
        examples = dashboard_queries.cluster_examples(client, filters).set_index("intent_cluster")
        found = {t: t in list(examples.at[c, "examples"]) if c in examples.index else False
                 for t, c in clusters.items()}
        return all(found.values()), found

    _wait_for(named, timeout_s=120, what="each asked query among its cluster's examples")


def test_chat_misses_reach_the_demo_model_and_repeats_are_served_from_the_cache(stack, api):
    unit = units_per_arm(stack.settings().experiments_file, EXPERIMENT)["treatment"][0]
    # Far from every banking77 intent, so the demo model names the question whether or not it has
    # loaded its encoder yet (a banking question gets its intent's answer once it has).
    ask = {"messages": [{"role": "user", "content": "Which river flows through the city of Vienna?"}], "user": unit}
    first = api.post("/v1/chat/completions", json=ask)
    assert first.status_code == 200 and first.headers["x-scache-hit"] == "0", first.text
    answer = first.json()["choices"][0]["message"]["content"]
    assert answer.startswith("(demo model)") and "river flows through the city of Vienna" in answer
    again = api.post("/v1/chat/completions", json=ask)
    assert again.headers["x-scache-hit"] == "1" and again.json()["choices"][0]["message"]["content"] == answer
