"""Shadow checks through the service: a stalled upstream never delays a lookup or chat response,
checks past the queue are dropped and counted, and verdicts reach the feedback topic tagged shadow
(a recording publisher stands in for Kafka)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import wait_until
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.test_service_chat_admin import Served, chat

STALL_S = 8.0


class StallingUpstream(Served):
    """Answers "answer to: <question>"; while ``stalled`` is set, each call waits until ``released``
    (or STALL_S)."""

    def __init__(self):
        self.calls: list[dict] = []
        self.stalled = threading.Event()
        self.released = threading.Event()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def completions(request: Request):
            body = await request.json()
            self.calls.append(body)
            if self.stalled.is_set():
                await asyncio.to_thread(self.released.wait, STALL_S)
            question = body["messages"][-1]["content"]
            return {"id": "up", "object": "chat.completion", "created": 1, "model": body.get("model", "m"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"answer to: {question}"}}]}

        super().__init__(app, "stalling upstream", start_timeout_s=20, stop_timeout_s=10)


@pytest.fixture()
def upstream():
    with StallingUpstream() as server:
        yield server


def make_client(embedder, upstream, publisher, **shadow):
    settings = Settings(service={"upstream_url": f"http://127.0.0.1:{upstream.port}/v1", "open_access": True},
                        shadow={"hit_rate": 1.0, "equivalence": "exact", **shadow})
    config = ExperimentConfig(experiment_id="shadow-exp", salt="s", version=1,
                              arms=[ArmConfig(name="only", threshold=0.8)])
    components = build_components(settings, publisher, embedder, control_publisher=lambda m: None,
                                  registry=ExperimentRegistry({"shadow-exp": config}))
    return TestClient(create_app(components), raise_server_exceptions=False), components


def shadow_verdicts(publisher) -> dict[str, str]:
    return {event.request_id: event.verdict for event in publisher.feedback if event.source == "shadow"}


def test_a_stalled_upstream_never_delays_hits_and_verdicts_arrive_tagged_shadow(minilm_embedder, upstream):
    publisher = RecordingPublisher()
    client, components = make_client(minilm_embedder, upstream, publisher, concurrency=1, queue_size=2,
                                      calls_per_minute=1000)
    with client:
        question = "How do I reset my password?"
        assert chat(client, question).headers["x-scache-hit"] == "0"          # stored, no stall
        client.post("/v1/store", json={"query": "What is the card fee?", "answer": "answer to: What is the card fee?",
                                       "unit_id": "u"})
        lookup_ms = lambda: _timed(lambda: client.post("/v1/lookup", json={"query": "What is the card fee?",
                                                                           "unit_id": "u"}))
        chat_ms = lambda: _timed(lambda: chat(client, question))
        baseline = sorted(lookup_ms()[0] for _ in range(5))[2], sorted(chat_ms()[0] for _ in range(5))[2]
        wait_until(lambda: components.shadow.stats().get("waiting", 0) == 0
                   and len(shadow_verdicts(publisher)) >= 6, 20, "the baseline's checks")
        upstream.stalled.set()
        hits = []
        stalled_times = []
        for _ in range(10):
            for timed in (lookup_ms, chat_ms):
                elapsed, response = timed()
                assert response.status_code == 200
                stalled_times.append(elapsed)
                hits.append(response.headers["x-scache-request-id"])
        stats = components.shadow.stats()
        assert stats["dropped_queue"] >= 15           # one running, two waiting: the rest dropped
        # Every response took about what it took with a live upstream, far under the stall.
        assert max(stalled_times) < 1000 * STALL_S / 4
        assert sorted(stalled_times)[len(stalled_times) // 2] < 3 * max(baseline) + 100
        upstream.released.set()
        # The two queued checks are hits'; the one running when the stall began may still have been a
        # baseline check (``waiting`` counts only the queue), so two of the hits' verdicts are certain.
        wait_until(lambda: sum(1 for r in hits if r in shadow_verdicts(publisher)) >= 2, 45, "stalled checks' verdicts")
    verdicts = shadow_verdicts(publisher)
    assert all(event.source in ("shadow", "user") for event in publisher.feedback)
    # the cached answer is what the upstream says to the stored question: the same question agrees,
    # a paraphrase (none here) would be judged by the configured check
    assert set(verdicts.values()) == {"correct"}


def test_a_near_miss_compares_the_upstream_answer_with_the_nearest_at_no_extra_call(minilm_embedder, upstream):
    publisher = RecordingPublisher()
    client, components = make_client(minilm_embedder, upstream, publisher, hit_rate=0.0, near_miss_band=0.79)
    with client:
        assert chat(client, "How do I reset my password?").headers["x-scache-hit"] == "0"
        calls = len(upstream.calls)
        miss = chat(client, "How do I change my email address?")
        assert miss.headers["x-scache-hit"] == "0"
        request_id = miss.headers["x-scache-request-id"]
        wait_until(lambda: request_id in shadow_verdicts(publisher), 30, "near-miss verdict")
        assert len(upstream.calls) == calls + 1         # only the miss's own forward
        assert shadow_verdicts(publisher)[request_id] == "wrong"
        wait_until(lambda: any(e.request_id == request_id for e in publisher.events), 30, "the miss's event")
        event = next(e for e in publisher.events if e.request_id == request_id)
        assert event.decision == "miss" and 0.01 <= event.similarity < 0.8   # the curve below the threshold


def test_a_shadow_verdict_does_not_settle_the_hit_for_users(minilm_embedder, upstream):
    publisher = RecordingPublisher()
    client, components = make_client(minilm_embedder, upstream, publisher, hit_rate=0.0)
    with client:
        chat(client, "How do I reset my password?")
        hit = chat(client, "How do I reset my password?")
        request_id = hit.headers["x-scache-request-id"]
        shadow = client.post("/v1/feedback", json={"request_id": request_id, "verdict": "wrong", "source": "shadow"})
        assert shadow.status_code == 202 and shadow.json()["outcome"] == "not_applied"
        user = client.post("/v1/feedback", json={"request_id": request_id, "verdict": "wrong"})
        assert user.json()["outcome"] != "unknown"
        assert client.post("/v1/feedback", json={"request_id": request_id, "verdict": "wrong",
                                                 "source": "bot"}).status_code == 422


def _timed(call):
    started = time.perf_counter()
    response = call()
    return (time.perf_counter() - started) * 1000, response


def test_shadow_checks_are_on_metrics_when_enabled(minilm_embedder, upstream):
    client, components = make_client(minilm_embedder, upstream, RecordingPublisher(), calls_per_minute=1)
    with client:
        client.post("/v1/store", json={"query": "What is the card fee?", "answer": "x", "unit_id": "u"})
        for _ in range(3):
            client.post("/v1/lookup", json={"query": "What is the card fee?", "unit_id": "u"})
        wait_until(lambda: components.shadow.stats().get("hit_wrong", 0) == 1, 10, "the one check in budget")
        text = client.get("/metrics").text
    assert 'scache_shadow_checks_total{outcome="dropped_budget"} 2.0' in text
    assert 'scache_shadow_checks_total{outcome="hit_wrong"} 1.0' in text
    assert "scache_shadow_upstream_calls_total 1.0" in text and "scache_shadow_waiting 0.0" in text


def test_a_shadow_check_never_sends_the_callers_scache_key_upstream():
    from cache_core.service.schemas import ChatCompletionRequest
    from cache_core.service.shadow import shadow_request

    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    headers = {"authorization": "Bearer sk-scache-tenant", "openai-project": "p1"}
    assert shadow_request(body, headers, key_in_authorization=True)[1] == {"openai-project": "p1"}
    assert shadow_request(body, headers)[1] == headers  # the caller's own upstream credentials
