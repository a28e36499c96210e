"""Per-request cache controls (headers and extra_body): skip lookup, skip store, refresh, ttl,
namespace; what each did comes back in the response headers."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


@pytest.fixture()
def api(minilm_embedder, upstream):
    settings = Settings(service={"upstream_url": f"http://127.0.0.1:{upstream.port}/v1", "open_access": True})
    clock = Clock()
    with TestClient(create_app(build_components(settings, RecordingPublisher(), minilm_embedder, clock=clock,
                                                expiry_sweep_s=None))) as client:
        client.clock = clock
        yield client


def ask(api, text, headers=None, **fields):
    return api.post("/v1/chat/completions", headers={"x-scache-unit-id": "u1", **(headers or {})},
                    json={"model": "m", "messages": [{"role": "user", "content": text}], **fields})


def answer(response) -> str:
    return response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("how", [{"headers": {"x-scache-no-lookup": "1"}}, {"scache": {"no_lookup": True}},
                                 {"cache": {"no-cache": True}}])
def test_skip_lookup_forwards_and_still_stores(api, upstream, how):
    first = ask(api, "What are your opening hours?")
    skipped = ask(api, "What are your opening hours?", **how)
    assert skipped.headers["x-scache-decision"] == "bypass" and skipped.headers["x-scache-bypass"] == "no_lookup"
    assert skipped.headers["x-scache-controls"] == "no-lookup" and answer(skipped) != answer(first)
    assert skipped.headers["x-scache-store"] == "updated"
    assert "scache" not in upstream.calls[-1] and "cache" not in upstream.calls[-1]  # controls stay here
    assert answer(ask(api, "What are your opening hours?")) == answer(skipped)


@pytest.mark.parametrize("how", [{"headers": {"x-scache-no-store": "true"}}, {"scache": {"no_store": True}},
                                 {"cache": {"no-store": True}}])
def test_skip_store_serves_but_does_not_cache(api, how):
    first = ask(api, "Do you have a branch in Leeds?", **how)
    assert first.headers["x-scache-store"] == "no_store" and first.headers["x-scache-controls"] == "no-store"
    assert ask(api, "Do you have a branch in Leeds?").headers["x-scache-hit"] == "0"


def test_refresh_replaces_the_cached_answer(api):
    old = ask(api, "What is the savings rate?")
    assert answer(ask(api, "What is the savings rate?")) == answer(old)
    fresh = ask(api, "What is the savings rate?", headers={"x-scache-refresh": "1"})
    assert fresh.headers["x-scache-bypass"] == "refresh" and answer(fresh) != answer(old)
    hit = ask(api, "What is the savings rate?")
    assert hit.headers["x-scache-hit"] == "1" and answer(hit) == answer(fresh)


@pytest.mark.parametrize("how", [{"headers": {"x-scache-ttl": "60"}}, {"scache": {"ttl_s": 60}}, {"cache": {"ttl": 60}}])
def test_ttl_sets_the_stored_answers_lifetime(api, how):
    stored = ask(api, "How long does a card take to arrive?", **how)
    assert stored.headers["x-scache-controls"] == "ttl=60"
    api.clock.now += 30
    assert ask(api, "How long does a card take to arrive?").headers["x-scache-hit"] == "1"
    api.clock.now += 31
    assert ask(api, "How long does a card take to arrive?").headers["x-scache-hit"] == "0"


def test_namespace_from_the_body_or_a_header(api):
    ask(api, "Where is the nearest ATM?", scache={"namespace": "tenant-a"})
    assert ask(api, "Where is the nearest ATM?").headers["x-scache-hit"] == "0"  # default namespace
    in_a = ask(api, "Where is the nearest ATM?", headers={"x-scache-namespace": "tenant-a"})
    assert in_a.headers["x-scache-hit"] == "1" and in_a.headers["x-scache-namespace"] == "tenant-a"


@pytest.mark.parametrize(("fields", "param"), [({"scache": {"ttl_s": -1}}, "ttl_s"), ({"scache": {"nope": 1}}, "scache"),
                                               ({"scache": {"no_store": "maybe"}}, "no_store"),
                                               ({"scache": "x"}, "scache"), ({"scache": {"namespace": ""}}, "namespace")])
def test_a_bad_control_is_a_400_naming_it(api, fields, param):
    response = ask(api, "Anything at all?", **fields)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    bad_header = ask(api, "Anything at all?", headers={"x-scache-ttl": "soon"})
    assert bad_header.status_code == 400 and bad_header.json()["error"]["param"] == "ttl_s"


def test_a_sampled_hit_asks_for_a_verdict(api):
    """An arm whose feedback_sample_rate is 1 asks on every hit: the chat header and the lookup
    response say so; a miss never asks (docs/solicited_feedback.md)."""
    from cache_core.events import ControlMessage

    registry = api.app.state.components.registry
    config = registry.get()
    asking = config.model_copy(update={"version": config.version + 1, "arms": [
        arm.model_copy(update={"feedback_sample_rate": 1.0}) for arm in config.arms]})
    assert registry.apply(ControlMessage(experiment=asking))
    miss = ask(api, "Can I freeze my card from the app?")
    assert miss.headers["x-scache-hit"] == "0" and "x-scache-feedback-requested" not in miss.headers
    hit = ask(api, "Can I freeze my card from the app?")
    assert hit.headers["x-scache-hit"] == "1" and hit.headers["x-scache-feedback-requested"] == "1"
    api.post("/v1/store", json={"query": "How do I close my account?", "answer": "In settings.", "unit_id": "u1"})
    looked = api.post("/v1/lookup", json={"query": "How do I close my account?", "unit_id": "u1"}).json()
    assert looked["hit"] and looked["feedback_requested"]
    missed = api.post("/v1/lookup", json={"query": "What is the weather on Mars?", "unit_id": "u1"}).json()
    assert not missed["hit"] and not missed["feedback_requested"]
