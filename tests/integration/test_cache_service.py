"""The cache service as a subprocess against a real broker: events out, control in."""
from __future__ import annotations

import time

import httpx
import pytest
import yaml

from cache_core.publish.control_topic import publish_control
from cache_core.events import CacheEvent, ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from tests.integration.kafka_helpers import consume

pytestmark = pytest.mark.integration

QUESTION = "How do I reset my password?"
PARAPHRASE = "how can I reset my password"


def experiment(threshold: float, version: int) -> ExperimentConfig:
    return ExperimentConfig(experiment_id="itest", salt="itest-salt", version=version,
                            arms=[ArmConfig(name="only", threshold=threshold, ann_check_rate=1.0)])


def decisions(kafka, expected: int) -> list[CacheEvent]:
    records = consume(kafka.bootstrap_servers, kafka.events_topic, expected, timeout_s=30,
                      keep=lambda r: b'"event_type":"decision"' in r.value)
    return sorted((CacheEvent.model_validate_json(r.value) for r in records), key=lambda e: e.ts_ms)


def test_events_are_complete_and_control_changes_decisions(kafka_settings, cache_service_factory,
                                                           tmp_path):
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [experiment(0.99, 1).model_dump(mode="json")]}))
    base = cache_service_factory(kafka=kafka_settings, experiments_file=path)
    client = httpx.Client(base_url=base, timeout=10)

    assert client.post("/v1/store", json={"query": QUESTION, "answer": "Use the reset link.",
                                          "unit_id": "u1"}).json()["stored"]
    miss = client.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": "u1"}).json()
    hit = client.post("/v1/lookup", json={"query": QUESTION, "unit_id": "u1"}).json()
    assert not miss["hit"] and 0.8 < miss["similarity"] < 0.99 and hit["hit"]

    events = decisions(kafka_settings, 2)
    assert [e.request_id for e in events] == [miss["request_id"], hit["request_id"]]
    for event in events:
        assert event.instance_id and event.experiment_id == "itest" and event.arm == "only"
        assert event.config_version == 1 and event.threshold == 0.99 and event.index_kind == "flat"
        assert event.similarity is not None and event.embedding_l2_norm > 0
        assert event.entry_id and event.entry_age_s >= 0 and event.entry_ttl_s > 0
        assert event.ann_checked and event.ann_agree and event.ann_recall_at_k == 1.0
        assert event.intent_cluster >= 0 and event.latency_ms > 0 and event.query_chars > 0
        assert event.query_text is None and event.unit_id == "u1" and event.assignment_prob == 1.0

    publish_control(kafka_settings, ControlMessage(experiment=experiment(0.8, 2), actor="test"))
    deadline, answer = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        answer = client.post("/v1/lookup", json={"query": PARAPHRASE, "unit_id": "u1"}).json()
        if answer["hit"]:
            break
        time.sleep(0.2)
    assert answer["hit"] and answer["config_version"] == 2 and answer["threshold"] == 0.8
    served = client.get("/v1/experiments").json()["experiments"]
    assert served[0]["version"] == 2

    latest = [e for e in decisions(kafka_settings, 3) if e.request_id == answer["request_id"]]
    assert latest and latest[0].config_version == 2 and latest[0].threshold == 0.8 and latest[0].hit
    metrics = client.get("/metrics").text
    assert 'scache_hits_total{arm="only",experiment="itest"}' in metrics

    service = cache_service_factory.services[-1]
    service.stop()
    log_text = service.log_path.read_text()
    assert "cache service stopped" in log_text  # the shutdown hook ran: publisher flushed


def test_admin_put_publishes_on_the_control_topic_and_applies(kafka_settings, cache_service_factory,
                                                               tmp_path):
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [experiment(0.99, 1).model_dump(mode="json")]}))
    base = cache_service_factory(kafka=kafka_settings, experiments_file=path,
                                 env={"SCACHE_SERVICE__ADMIN_TOKEN": "s3cret",
                                      "SCACHE_SERVICE__PUBLISH_QUEUE_SIZE": "5000", "SCACHE_SERVICE__SPOOL_MAX_MIB": "64"})
    client = httpx.Client(base_url=base, timeout=10)
    body = experiment(0.7, 2).model_dump_json()
    publisher = client.get("/healthz").json()["publisher"]
    assert (publisher["queue_size"], publisher["max_spool_bytes"]) == (5000, 64 * 1024 * 1024), publisher

    denied = client.put("/v1/admin/experiments/itest", content=body,
                        headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 403 and "invalid admin token" in denied.json()["detail"]

    ok = client.put("/v1/admin/experiments/itest", content=body,
                    headers={"Authorization": "Bearer s3cret", "x-scache-actor": "ops"})
    # applied here, whether the handler or this instance's control listener installed it first
    assert ok.status_code == 200 and (ok.json()["applied"], ok.json()["version"]) == (True, 2), ok.text
    stale = client.put("/v1/admin/experiments/itest", content=body,
                       headers={"Authorization": "Bearer s3cret"})
    assert stale.status_code == 409

    records = consume(kafka_settings.bootstrap_servers, kafka_settings.control_topic, 1, timeout_s=20)
    messages = [ControlMessage.model_validate_json(r.value) for r in records]
    assert [(m.experiment.version, m.actor) for m in messages] == [(2, "ops")]
    assert messages[0].experiment.arms[0].threshold == 0.7
    (served,) = client.get("/v1/experiments").json()["experiments"]
    assert served["version"] == 2 and served["arms"][0]["threshold"] == 0.7
