"""Client API keys: bound to a tenant's namespaces and rights; without open access, no key, no service."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from cache_core.service.app import create_app
from cache_core.service.keys import key_digest
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream

ACME, ACME_READER, GLOBEX = "sk-acme-writer", "sk-acme-reader", "sk-globex"
KEYS = [{"sha256": key_digest(ACME), "tenant": "acme", "namespaces": ["acme", "acme/*"],
         "rights": ["read", "write", "feedback"]},
        {"sha256": key_digest(ACME_READER), "tenant": "acme", "namespaces": ["acme"], "rights": ["read"]}]
FILE_KEYS = f"- sha256: {key_digest(GLOBEX)}\n  tenant: globex\n  namespaces: [globex]\n  rights: [read, write, admin]\n"


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


@pytest.fixture()
def api(minilm_embedder, upstream, tmp_path):
    (tmp_path / "keys.yaml").write_text(FILE_KEYS)
    settings = Settings(service={"api_keys": KEYS, "api_keys_file": tmp_path / "keys.yaml",
                                 "upstream_url": f"http://127.0.0.1:{upstream.port}/v1"})
    with TestClient(create_app(build_components(settings, RecordingPublisher(), minilm_embedder,
                                                expiry_sweep_s=None))) as client:
        yield client


def as_(key: str | None, bearer: bool = False) -> dict:
    if key is None:
        return {}
    return {"authorization": f"Bearer {key}"} if bearer else {"x-scache-api-key": key}


def entries(api) -> int:
    return sum(len(p) for p in api.app.state.components.cache.partitions())


POISON = {"query": "How do I reset my password?", "answer": "Send your password to evil@example.com"}


def test_default_settings_refuse_store_lookup_chat_and_feedback_without_a_key(minilm_embedder):
    with TestClient(create_app(build_components(Settings(), RecordingPublisher(), minilm_embedder,
                                                expiry_sweep_s=None))) as api:
        for unit in range(6):  # the poisoning finding: one store per unit id, so every arm
            assert api.post("/v1/store", json={**POISON, "unit_id": f"u{unit}"}).status_code == 401
        assert entries(api) == 0
        assert api.post("/v1/store/batch", json={"items": [{**POISON, "unit_id": "u"}]}).status_code == 401
        assert api.post("/v1/lookup", json={"query": "reset my password", "unit_id": "u"}).status_code == 401
        assert api.post("/v1/feedback", json={"request_id": "r", "verdict": "wrong"}).status_code == 401
        chat = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"
        assert chat.headers["x-should-retry"] == "false"
        assert api.get("/v1/models").status_code == 401
        assert api.get("/healthz").status_code == 200 and api.get("/readyz").status_code == 200  # probes stay open


def test_keys_bind_tenants_to_their_namespaces_and_rights(api):
    stored = api.post("/v1/store", headers=as_(ACME), json={**POISON, "answer": "Use the reset link.", "unit_id": "u1"})
    assert stored.status_code == 200 and stored.json()["stored"]  # no namespace named: the key's first, "acme"
    look = {"query": "how can I reset my password", "unit_id": "u1"}
    assert api.post("/v1/lookup", headers=as_(ACME_READER), json=look).json()["hit"]
    assert api.post("/v1/lookup", headers=as_(ACME, bearer=True), json={**look, "namespace": "acme/eu"}).status_code == 200
    assert not api.post("/v1/lookup", headers=as_(GLOBEX), json=look).json()["hit"]  # its own namespace
    assert api.post("/v1/lookup", headers=as_(GLOBEX), json={**look, "namespace": "acme"}).status_code == 403
    assert api.post("/v1/lookup", headers=as_("sk-wrong"), json=look).status_code == 401
    before = entries(api)
    assert api.post("/v1/store", headers=as_(ACME_READER), json={**POISON, "unit_id": "u2"}).status_code == 403
    assert api.post("/v1/store", headers=as_(GLOBEX), json={**POISON, "unit_id": "u", "namespace": "acme"}).status_code == 403
    batch = {"items": [{**POISON, "unit_id": "u", "namespace": "acme"}, {**POISON, "unit_id": "u", "namespace": "x"}]}
    assert api.post("/v1/store/batch", headers=as_(ACME), json=batch).status_code == 403  # all or nothing
    assert entries(api) == before
    verdict = {"request_id": "r1", "verdict": "wrong"}
    assert api.post("/v1/feedback", headers=as_(ACME_READER), json=verdict).status_code == 403
    assert api.post("/v1/feedback", headers=as_(ACME), json=verdict).status_code == 202
    assert api.post("/v1/feedback", headers=as_(GLOBEX), json=verdict).status_code == 202  # write allows it


def test_a_cached_chat_answer_is_served_only_to_a_reader_of_its_namespace(api, upstream):
    ask = {"model": "m", "messages": [{"role": "user", "content": "What is the fee for a wire transfer?"}]}
    first = api.post("/v1/chat/completions", headers=as_(ACME), json=ask)
    assert first.headers["x-scache-hit"] == "0" and first.headers["x-scache-store"] == "admitted"
    assert api.post("/v1/chat/completions", json=ask).status_code == 401
    assert api.post("/v1/chat/completions", headers=as_("sk-invalid", bearer=True), json=ask).status_code == 401
    other = api.post("/v1/chat/completions", headers=as_(GLOBEX), json=ask)
    assert other.headers["x-scache-hit"] == "0"  # globex's namespace holds no answer of acme's
    hit = api.post("/v1/chat/completions", headers=as_(ACME_READER), json=ask)
    assert hit.headers["x-scache-hit"] == "1"
    denied = api.post("/v1/chat/completions", headers={**as_(GLOBEX), "x-scache-namespace": "acme"}, json=ask)
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    reader_miss = api.post("/v1/chat/completions", headers=as_(ACME_READER),
                           json={**ask, "messages": [{"role": "user", "content": "Is there a fee for cash?"}]})
    assert reader_miss.headers["x-scache-store"] == "not_allowed"


def test_the_caller_key_stays_here_and_the_upstream_key_goes_upstream(minilm_embedder, upstream):
    settings = Settings(service={"api_keys": KEYS, "upstream_url": f"http://127.0.0.1:{upstream.port}/v1"})
    with TestClient(create_app(build_components(settings, RecordingPublisher(), minilm_embedder,
                                                expiry_sweep_s=None))) as api:
        ask = {"model": "m", "messages": [{"role": "user", "content": "Where is my nearest branch?"}]}
        api.post("/v1/chat/completions", headers=as_(ACME, bearer=True), json={**ask, "seed": 1})
        assert "authorization" not in upstream.headers[-1]  # the scache key is not the upstream's
        api.post("/v1/chat/completions", headers={**as_(ACME), "authorization": "Bearer sk-openai"}, json={**ask, "seed": 2})
        assert upstream.headers[-1]["authorization"] == "Bearer sk-openai"
    settings = Settings(service={"api_keys": KEYS, "upstream_url": f"http://127.0.0.1:{upstream.port}/v1",
                                 "upstream_api_key": "sk-upstream"})
    with TestClient(create_app(build_components(settings, RecordingPublisher(), minilm_embedder,
                                                expiry_sweep_s=None))) as api:
        api.post("/v1/chat/completions", headers=as_(ACME, bearer=True), json={**ask, "seed": 3})
        assert upstream.headers[-1]["authorization"] == "Bearer sk-upstream"


def test_a_key_with_the_admin_right_may_use_the_admin_api(api):
    assert api.delete("/v1/admin/namespaces/globex", headers=as_(GLOBEX, bearer=True)).status_code == 200
    assert api.delete("/v1/admin/namespaces/acme", headers=as_(ACME, bearer=True)).status_code == 403


def test_open_access_is_for_local_use_only():
    with pytest.raises(ValidationError, match="OPEN_ACCESS"):
        Settings(environment="production", service={"open_access": True, "admin_token": "t"},
                 dashboard={"admin_token": "t"})
