"""The HTTP API through FastAPI's TestClient, with the real model and a recording publisher."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cache_core.events import CacheEvent
from cache_core.service.app import create_app
from cache_core.service.schemas import LookupResponse
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher


@pytest.fixture()
def api(minilm_embedder):
    settings = Settings(cache={"max_query_chars": 200}, service={"open_access": True})
    publisher = RecordingPublisher()
    app = create_app(build_components(settings, publisher, minilm_embedder))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.publisher = publisher
        yield client


def test_store_then_paraphrase_hits_and_event_is_published(api):
    stored = api.post("/v1/store", json={"query": "How do I reset my password?",
                                         "answer": "Use the reset link.", "unit_id": "user-1",
                                         "provenance": {"source": "kb", "version": "7"}})
    assert stored.status_code == 200 and stored.json()["stored"], stored.text
    looked = api.post("/v1/lookup", json={"query": "how can I reset my password",
                                          "unit_id": "user-1"})
    body = looked.json()
    assert looked.status_code == 200 and body["hit"] and body["answer"] == "Use the reset link."
    assert body["similarity"] >= body["threshold"] and body["provenance"]["version"] == "7"
    assert body["experiment_id"] == "threshold-ab" and body["config_version"] == 1
    assert body["score"] is None and body["score_margin"] is None  # cosine arms have no mixed score
    assert api.app.state.components.cache.flush_events()  # events are finished after the answer
    event = api.publisher.events[-1]
    assert isinstance(event, CacheEvent) and event.request_id == body["request_id"]
    assert event.embedding_l2_norm > 0 and event.arm == body["arm"]


def test_lookup_answers_exactly_the_lookup_response_model(api):
    # the route writes its JSON itself (routes/lookup.response_body), not through the response_model
    api.post("/v1/store", json={"query": "How do I reset my password?", "answer": "Use the reset link.",
                                "unit_id": "user-1", "provenance": {"source": "kb"}})
    for query in ("how can I reset my password", "what is the weather on Mars"):
        looked = api.post("/v1/lookup", json={"query": query, "unit_id": "user-1"})
        assert looked.status_code == 200 and looked.headers["content-type"] == "application/json"
        body = looked.json()
        assert set(body) == set(LookupResponse.model_fields)
        assert LookupResponse.model_validate(body).model_dump(mode="json") == body
        assert looked.headers["x-scache-request-id"] == body["request_id"]
    assert LookupResponse.model_validate(api.post("/v1/lookup", json={
        "query": "how can I reset my password", "unit_id": "user-1"}).json()).provenance.version == ""


def test_feedback_is_published(api):
    response = api.post("/v1/feedback", json={"request_id": "abc", "verdict": "wrong"})
    assert response.status_code == 202 and response.json()["outcome"] == "unknown"
    assert api.publisher.feedback[-1].verdict == "wrong"


def test_a_wrong_verdict_on_a_hit_served_here_removes_its_entry(api):
    api.post("/v1/store", json={"query": "How do I reset my password?", "answer": "Use the reset link.",
                                "unit_id": "user-1"})
    hit = api.post("/v1/lookup", json={"query": "how can I reset my password", "unit_id": "user-1"}).json()
    assert hit["hit"]
    verdict = api.post("/v1/feedback", json={"request_id": hit["request_id"], "verdict": "wrong"})
    assert verdict.status_code == 202 and verdict.json()["outcome"] == "invalidated"
    assert not api.post("/v1/lookup", json={"query": "how can I reset my password", "unit_id": "user-1"}).json()["hit"]
    assert api.publisher.feedback[-1].request_id == hit["request_id"]  # the warehouse still gets it
    text = api.get("/metrics").text
    assert (f'scache_feedback_applied_total{{arm="{hit["arm"]}",experiment="threshold-ab",outcome="invalidated"}} 1.0'
            in text), text
    assert api.get("/healthz").json()["feedback"]["remembered_hits"] == 0


def test_metrics_and_experiments_and_health(api):
    api.post("/v1/lookup", json={"query": "card arrival", "unit_id": "u9"})
    api.app.state.components.cache.flush_events()  # the lookup's metrics are counted with its event, off the request
    text = api.get("/metrics").text
    assert 'scache_requests_total{arm=' in text and "scache_lookup_latency_seconds_bucket" in text
    assert "scache_publisher_queue_depth 0.0" in text and "scache_publisher_dropped" in text
    assert 'scache_intent_cluster_merges_total{reason="concurrent_open"} 0.0' in text
    experiments = api.get("/v1/experiments").json()["experiments"]
    assert experiments[0]["experiment_id"] == "threshold-ab" and experiments[0]["version"] == 1
    assert api.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize("path, body, status, reason", [
    ("/v1/lookup", {"query": "", "unit_id": "u"}, 422, "non-empty"),
    ("/v1/lookup", {"query": "  ", "unit_id": "u"}, 422, "non-empty"),
    ("/v1/lookup", {"query": "x" * 201, "unit_id": "u"}, 422, "limit is 200"),
    ("/v1/lookup", {"query": "hi"}, 422, "unit_id"),
    ("/v1/lookup", {"query": 5, "unit_id": "u"}, 422, "query"),
    ("/v1/lookup", {"query": "hi", "unit_id": 7}, 422, "unit_id"),
    ("/v1/lookup", {"query": "hi", "unit_id": "u", "experiment_id": "nope"}, 404, "nope"),
    ("/v1/lookup", {"query": "hi", "unit_id": "u", "extra": 1}, 422, "extra"),
    ("/v1/lookup", ["not", "an", "object"], 422, "object"),
    ("/v1/store", {"query": "hi", "unit_id": "u"}, 422, "answer"),
    ("/v1/store", {"query": "hi", "unit_id": "u", "answer": " "}, 422, "non-empty"),
    ("/v1/store", {"query": "hi", "unit_id": "u", "answer": "a", "ttl_s": -1}, 422, "ttl_s"),
    ("/v1/store", {"query": "hi", "unit_id": "u", "answer": "a", "ttl_s": "soon"}, 422, "ttl_s"),
    ("/v1/feedback", {"request_id": "r", "verdict": "maybe"}, 422, "verdict"),
])
def test_bad_input_is_4xx_with_reason(api, path, body, status, reason):
    response = api.post(path, json=body)
    assert response.status_code == status, response.text
    assert reason in response.text
    assert api.publisher.events == []


def test_malformed_json_is_422(api):
    response = api.post("/v1/lookup", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "json" in response.text.lower()


class _Follower:
    def __init__(self, caught_up: bool):
        self.caught_up = caught_up

    def stats(self) -> dict:
        return {"caught_up": self.caught_up}

    def stop(self) -> None:
        pass


def test_ready_only_once_every_topic_follower_has_replayed(api):
    assert api.get("/readyz").json() == {"ready": True}  # no followers: nothing to wait for
    control, entries = _Follower(False), _Follower(True)
    api.app.state.components.followers.update(control=control, entries=entries)
    waiting = api.get("/readyz")
    assert waiting.status_code == 503 and waiting.json()["detail"] == "still replaying: control"
    assert api.get("/healthz").status_code == 200  # alive all the same
    control.caught_up = True
    assert api.get("/readyz").status_code == 200
