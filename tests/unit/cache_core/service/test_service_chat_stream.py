"""Streaming chat completions (stream=true, Server-Sent Events) against the real local upstream
stub of test_service_chat_admin: hits streamed from the cache, misses relayed as they arrive
and cached only when the stream finished with "stop", upstream errors answered clearly."""
from __future__ import annotations

import json

import httpx
import pytest

from cache_core.experiments import ExperimentConfig
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import free_port
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.test_service_chat_admin import Served, Upstream, make_client, new_config

DONE = "[DONE]"


def parse_sse(text: str) -> list:
    """The data of each event (JSON decoded, [DONE] as the string) of a complete SSE body:
    events end with a blank line; an event's data lines are joined with newlines."""
    assert text.endswith("\n\n"), f"stream does not end with a complete event: {text[-80:]!r}"
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        assert lines and all(line.startswith("data:") for line in lines), block
        data = "\n".join(line[5:].removeprefix(" ") for line in lines)
        events.append(data if data == DONE else json.loads(data))
    return events


def content_of(events: list) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))


def finish_reasons(events: list) -> list:
    return [e["choices"][0]["finish_reason"] for e in events
            if isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")]


def stream(client, text: str, **extra):
    return client.post("/v1/chat/completions",
                       json={"model": "tiny", "stream": True, **extra,
                             "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": text}]})


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as server:
        yield server


@pytest.fixture()
def client(minilm_embedder, tmp_path, upstream):
    with make_client(minilm_embedder, tmp_path, f"http://127.0.0.1:{upstream.port}/v1") as client:
        yield client


def test_miss_is_relayed_then_the_same_question_streams_from_the_cache(client, upstream):
    before = len(upstream.calls)
    miss = stream(client, "How do I reset my password?")
    assert miss.status_code == 200, miss.text
    assert miss.headers["content-type"].startswith("text/event-stream")
    assert miss.headers["x-scache-hit"] == "0" and miss.headers["x-scache-decision"] == "miss"
    events = parse_sse(miss.text)
    assert upstream.calls[-1]["stream"] is True and len(upstream.calls) == before + 1
    assert events[-1] == DONE and {e["id"] for e in events[:-1]} == {f"up-{before + 1}"}  # relayed as sent
    assert content_of(events) == "upstream says: How do I reset my password?"
    assert finish_reasons(events) == ["stop"]

    hit = stream(client, "how can I reset my password", stream_options={"include_usage": True})
    assert hit.status_code == 200 and hit.headers["x-scache-hit"] == "1"
    assert hit.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(hit.text)
    assert len(upstream.calls) == before + 1                  # the hit never reached upstream
    chunks, done = events[:-1], events[-1]
    assert done == DONE
    assert {c["id"] for c in chunks} == {f"chatcmpl-{hit.headers['x-scache-request-id']}"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"tiny"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(pieces) > 1 and "".join(pieces) == "upstream says: How do I reset my password?"
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 0  # include_usage
    # The same entry serves the non-streaming path too.
    plain = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "How do I reset my password?"}]})
    assert plain.headers["x-scache-hit"] == "1"
    assert plain.json()["choices"][0]["message"]["content"] == "upstream says: How do I reset my password?"
    metrics = client.get("/metrics").text
    assert 'scache_chat_requests_total{outcome="hit"} 2.0' in metrics
    assert 'scache_chat_requests_total{outcome="forwarded"} 1.0' in metrics


def test_truncated_stream_is_relayed_but_not_cached(client, upstream):
    before = len(upstream.calls)
    for _ in range(2):
        response = stream(client, "truncate please")
        events = parse_sse(response.text)
        assert response.headers["x-scache-hit"] == "0" and events[-1] == DONE
        assert finish_reasons(events) == ["length"] and content_of(events) == "upstream says: truncate please"
    assert len(upstream.calls) == before + 2


def test_stream_broken_off_upstream_ends_with_an_error_event_and_is_not_cached(client, upstream):
    before = len(upstream.calls)
    for _ in range(2):
        response = stream(client, "break please")
        events = parse_sse(response.text)
        assert response.status_code == 200 and response.headers["x-scache-hit"] == "0"
        assert DONE not in events and content_of(events) == "upstream says:"   # what arrived was relayed
        assert "broke off" in events[-1]["error"]["message"]
    assert len(upstream.calls) == before + 2
    assert 'scache_chat_requests_total{outcome="stream_incomplete"} 2.0' in client.get("/metrics").text


def test_upstream_error_status_is_answered_as_without_streaming(client, upstream, minilm_embedder, tmp_path):
    for _ in range(2):
        response = stream(client, "fail please")
        assert response.status_code == 429 and response.headers["x-scache-hit"] == "0"
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == {"error": {"message": "rate limited"}}
    with make_client(minilm_embedder, tmp_path / "dead", f"http://127.0.0.1:{free_port()}") as dead:
        response = stream(dead, "anything at all")
        assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]


def test_upstream_that_ignores_stream_still_gives_the_client_a_stream(client, upstream):
    first = stream(client, "no stream please")
    events = parse_sse(first.text)
    assert first.headers["x-scache-hit"] == "0" and first.headers["x-scache-store"] == "admitted"
    assert events[-1] == DONE and content_of(events) == "upstream says: no stream please"
    assert stream(client, "no stream please").headers["x-scache-hit"] == "1"


def test_miss_chunks_reach_the_client_before_the_upstream_has_finished(minilm_embedder, upstream):
    settings = Settings(service={"upstream_url": f"http://127.0.0.1:{upstream.port}/v1", "open_access": True})
    registry = ExperimentRegistry({"chat-exp": ExperimentConfig.model_validate(new_config(1, 0.8))})
    app = create_app(build_components(settings, RecordingPublisher(), minilm_embedder, registry=registry,
                                      control_publisher=lambda message: None))
    upstream.gate.clear()
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "wait for the gate"}]}
    # A real server: TestClient hands over a streamed body only once it is complete.
    with Served(app) as served, httpx.Client(timeout=30) as http:
        url = f"http://127.0.0.1:{served.port}/v1/chat/completions"
        with http.stream("POST", url, json=body) as response:
            assert response.headers["x-scache-hit"] == "0"
            received = ""
            lines = response.iter_lines()
            for line in lines:
                received += line + "\n"
                if '"upstream"' in line:        # the first word, sent before the upstream waits
                    break
            assert not upstream.gate.is_set()   # it arrived while the upstream was still held
            upstream.gate.set()
            received += "\n".join(lines) + "\n"
        assert upstream.gate_released          # the upstream went on because the client had chunks
        events = parse_sse(received)
        assert events[-1] == DONE and content_of(events) == "upstream says: wait for the gate"
        again = http.post(url, json=body)     # stored once the stream finished: a hit now
        assert again.headers["x-scache-hit"] == "1"
        assert content_of(parse_sse(again.text)) == "upstream says: wait for the gate"
