"""``POST /v1/lookup`` answered without FastAPI's request handling gives what the route gives."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.deps import get_publisher
from cache_core.service.fast_lookup import FastLookup
from cache_core.service.keys import key_digest
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher

READER = "sk-reader"
KEYS = [{"sha256": key_digest(READER), "tenant": "t", "namespaces": ["t"], "rights": ["read"]}]
PLAIN = {"content-type": "application/json"}
# a content type FastAPI reads as JSON but the fast path leaves to it: the route's own answer
VIA_FASTAPI = {"content-type": "application/json; charset=utf-8"}


def fast_path(app) -> FastLookup:
    layer = app.middleware_stack
    while not isinstance(layer, FastLookup):
        layer = layer.app
    return layer


@pytest.fixture()
def api(minilm_embedder):
    settings = Settings(cache={"max_query_chars": 200}, service={"api_keys": KEYS})
    publisher = RecordingPublisher()
    app = create_app(build_components(settings, publisher, minilm_embedder, expiry_sweep_s=None))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.publisher = publisher
        yield client


def post(api, body, headers: dict, key: str | None = READER):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return api.post("/v1/lookup", content=raw, headers={**headers, **({"x-scache-api-key": key} if key else {})})


def comparable(response) -> tuple:
    body = response.json()
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in ("request_id", "latency_ms", "entry_age_s")}
    headers = sorted(k for k in response.headers if k != "content-length")
    return response.status_code, body, headers


CASES = [
    ("a lookup", {"query": "how do I reset my password", "unit_id": "u1"}, READER),
    ("no key", {"query": "how do I reset my password", "unit_id": "u1"}, None),
    ("an unknown key", {"query": "how do I reset my password", "unit_id": "u1"}, "sk-nobody"),
    ("no read right on the namespace", {"query": "reset", "unit_id": "u1", "namespace": "other"}, READER),
    ("an unknown experiment", {"query": "reset", "unit_id": "u1", "experiment_id": "nope"}, READER),
    ("a query over the limit", {"query": "x" * 201, "unit_id": "u1"}, READER),
    ("a blank query", {"query": "  ", "unit_id": "u1"}, READER),
    ("an unknown field", {"query": "reset", "unit_id": "u1", "extra": 1}, READER),
]


@pytest.mark.parametrize("case,body,key", CASES, ids=[c[0] for c in CASES])
def test_the_fast_path_answers_as_the_route_does(api, case, body, key):
    fast = fast_path(api.app)
    before = fast.answered
    quick = post(api, body, PLAIN, key)
    routed = post(api, body, VIA_FASTAPI, key)
    assert comparable(quick) == comparable(routed), case
    assert "x-request-id" in quick.headers
    if quick.status_code == 200:
        assert fast.answered == before + 1 and quick.headers["x-scache-request-id"] == quick.json()["request_id"]
        assert quick.headers["content-type"] == "application/json"


@pytest.mark.parametrize("raw", [b"{not json", b"", b'["a"]', b'{"query": 5, "unit_id": "u"}', b"\xff\xfe",
                                 b"[" * 100_000 + b"]" * 100_000], ids=["not json", "empty", "a list", "a wrong type",
                                                                        "not utf-8", "nested 100k deep"])
def test_bodies_it_cannot_read_get_fastapis_own_answer(api, raw):
    fast = fast_path(api.app)
    before = fast.answered
    quick, routed = post(api, raw, PLAIN), post(api, raw, VIA_FASTAPI)
    assert quick.status_code == routed.status_code and 400 <= quick.status_code < 500
    assert quick.json() == routed.json()
    assert fast.answered == before


def test_one_event_per_lookup_and_the_access_line_names_the_decision(api, caplog):
    with caplog.at_level("INFO", logger="scache.access"):
        looked = post(api, {"query": "where is my card", "unit_id": "u2"}, PLAIN)
    assert looked.status_code == 200
    api.app.state.components.cache.flush_events()
    assert [e.request_id for e in api.publisher.events] == [looked.json()["request_id"]]
    line = next(r for r in caplog.records if r.name == "scache.access")
    assert line.decision_id == looked.json()["request_id"] and line.request_id == looked.headers["x-request-id"]


def test_dependency_overrides_send_lookups_through_fastapi(api):
    fast = fast_path(api.app)
    api.app.dependency_overrides[get_publisher] = RecordingPublisher
    before = fast.answered
    assert post(api, {"query": "where is my card", "unit_id": "u3"}, PLAIN).status_code == 200
    assert fast.answered == before


def test_an_oversize_body_is_still_refused_before_it_is_read(api):
    limit = int(api.app.state.components.settings.service.max_request_mib * 1024 * 1024)
    response = post(api, b"{" + b" " * limit + b"}", PLAIN)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
