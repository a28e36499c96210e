"""The OpenAI-compatible routes answer errors as OpenAI does; every response has an x-request-id; a
body over the limit is refused before it is read; GET /v1/models."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import free_port
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


def client_for(embedder, upstream_url: str | None, **service) -> TestClient:
    settings = Settings(service={"upstream_url": upstream_url, "open_access": True, **service})
    return TestClient(create_app(build_components(settings, RecordingPublisher(), embedder, expiry_sweep_s=None)),
                      raise_server_exceptions=False)


def test_invalid_requests_are_400_in_openais_shape(minilm_embedder):
    with client_for(minilm_embedder, None) as api:
        response = api.post("/v1/chat/completions", json={"model": "m", "messages": [{"content": "no role"}]})
        assert response.status_code == 400 and response.headers["x-should-retry"] == "false"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages[0].role"
        assert "Field required" in error["message"] and error["code"] is None
        broken = api.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
        # scache's own API keeps its 422 with the validation details
        lookup = api.post("/v1/lookup", json={"query": "x"})
        assert lookup.status_code == 422 and lookup.json()["detail"][0]["loc"] == ["body", "unit_id"]


def test_no_upstream_is_not_worth_a_retry_but_an_unreachable_one_is(minilm_embedder):
    with client_for(minilm_embedder, None) as api:
        response = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}]})
        assert response.status_code == 503 and response.headers["x-should-retry"] == "false"
        assert response.json()["error"]["code"] == "no_upstream"
    with client_for(minilm_embedder, f"http://127.0.0.1:{free_port()}/v1") as api:
        response = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}]})
        assert response.status_code == 502 and "x-should-retry" not in response.headers
        assert response.json()["error"]["type"] == "server_error"


def test_every_response_has_a_request_id(minilm_embedder, upstream):
    with client_for(minilm_embedder, f"http://127.0.0.1:{upstream.port}/v1") as api:
        responses = [api.get("/healthz"), api.post("/v1/lookup", json={}),
                     api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]}),
                     api.post("/v1/chat/completions", json={"stream": True,
                                                            "messages": [{"role": "user", "content": "hello"}]}),
                     api.get("/no/such/route")]
        ids = [r.headers["x-request-id"] for r in responses]
        assert all(ids) and len(set(ids)) == len(ids)
        assert api.get("/healthz", headers={"x-request-id": "mine-42"}).headers["x-request-id"] == "mine-42"


def test_a_body_over_the_limit_is_refused_before_it_is_read(minilm_embedder):
    with client_for(minilm_embedder, None, max_request_mib=1) as api:
        read = []

        def body():  # sent without a content-length: counted as it arrives
            for _ in range(64):
                read.append(1)
                yield b"x" * 65536

        chunked = api.post("/v1/store", content=body(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert chunked.headers["x-should-retry"] == "false"
        big = b'{"query": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        declared = api.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert declared.status_code == 413 and declared.json()["error"]["type"] == "invalid_request_error"
        assert api.post("/v1/lookup", json={"query": "small", "unit_id": "u"}).status_code == 200


def test_models_come_from_the_upstream_else_the_configured_model(minilm_embedder, upstream):
    with client_for(minilm_embedder, f"http://127.0.0.1:{upstream.port}/v1") as api:
        assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["stub-model"]
    with client_for(minilm_embedder, None, upstream_model="gpt-4o-mini") as api:
        listing = api.get("/v1/models").json()
        assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == ["gpt-4o-mini"]
