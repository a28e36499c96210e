"""The chat proxy serves a cached answer only to a request that would get the same kind of answer:
answer-shaping fields are in the key, the others bypass the cache (counted, with a reason)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cache_core.service.app import create_app
from cache_core.service.chat_key import FIELD_POLICY
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream

DOCS = Path(__file__).resolve().parents[4] / "docs" / "proxy.md"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


@pytest.fixture()
def api(minilm_embedder, upstream):
    settings = Settings(service={"upstream_url": f"http://127.0.0.1:{upstream.port}/v1", "open_access": True})
    publisher = RecordingPublisher()
    with TestClient(create_app(build_components(settings, publisher, minilm_embedder,
                                                expiry_sweep_s=None))) as client:
        client.publisher = publisher
        yield client


def ask(api, text="What is the capital of France?", content=None, **fields):
    return api.post("/v1/chat/completions", headers={"x-scache-unit-id": "u1"},
                    json={"model": "m", "messages": [{"role": "user", "content": content or text}], **fields})


def test_tools_bypass_the_cache_and_get_the_tool_call(api):
    assert ask(api).headers["x-scache-hit"] == "0"
    assert ask(api).headers["x-scache-hit"] == "1"  # the prose answer is cached
    answer = ask(api, tools=TOOLS, tool_choice="required")
    assert answer.status_code == 200 and answer.headers["x-scache-decision"] == "bypass"
    assert answer.headers["x-scache-bypass"] == "tools"
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"]
    api.app.state.components.cache.flush_events()
    (event,) = [e for e in api.publisher.events if e.request_id == answer.headers["x-scache-request-id"]]
    assert event.decision == "bypass" and event.bypass_reason == "tools" and event.arm


@pytest.mark.parametrize(("fields", "reason"), [
    ({"n": 3}, "n"), ({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "logprobs"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"web_search_options": {}}, "web_search"), ({"functions": [{"name": "f"}]}, "tools")])
def test_fields_that_a_cache_cannot_answer_bypass_it(api, fields, reason):
    ask(api, "Name a primary colour.")
    answer = ask(api, "Name a primary colour.", **fields)
    assert answer.headers["x-scache-decision"] == "bypass" and answer.headers["x-scache-bypass"] == reason
    assert answer.headers["x-scache-store"] == "bypass"  # nor is its answer stored
    if reason == "n":
        assert len(answer.json()["choices"]) == 3


@pytest.mark.parametrize("fields", [{"response_format": {"type": "json_object"}}, {"temperature": 0.2},
                                    {"seed": 7}, {"max_tokens": 5}, {"stop": ["\n"]}, {"some_new_field": 1}])
def test_answer_shaping_fields_are_part_of_the_key(api, fields):
    text = f"Tell me about {sorted(fields)[0]}."
    plain = ask(api, text)
    assert ask(api, text).headers["x-scache-hit"] == "1"
    shaped = ask(api, text, **fields)
    assert shaped.headers["x-scache-hit"] == "0" and shaped.json() != plain.json()
    again = ask(api, text, **fields)
    assert again.headers["x-scache-hit"] == "1"
    assert again.json()["choices"][0]["message"] == shaped.json()["choices"][0]["message"]


def test_defaults_and_ignored_fields_share_the_key(api):
    ask(api, "How tall is Mont Blanc?")
    same = ask(api, "How tall is Mont Blanc?", temperature=1, top_p=1, n=1, logprobs=False, user="x",
               metadata={"a": "b"}, store=False, stream_options=None)
    assert same.headers["x-scache-hit"] == "1"


def test_images_are_in_the_key(api):
    def picture(url):
        return [{"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": url}}]

    first = ask(api, content=picture("https://example.com/cat.png"))
    assert first.headers["x-scache-hit"] == "0"
    other = ask(api, content=picture("https://example.com/invoice.png"))
    assert other.headers["x-scache-hit"] == "0"  # the same words about another picture
    assert ask(api, content=picture("https://example.com/cat.png")).headers["x-scache-hit"] == "1"
    only_image = ask(api, content=[{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}])
    assert only_image.headers["x-scache-bypass"] == "no_text"


def test_a_later_tool_result_is_part_of_the_key(api):
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    first = api.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    messages[-1]["content"] = "raining"
    second = api.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert first.headers["x-scache-hit"] == "0" and second.headers["x-scache-hit"] == "0"


def test_docs_table_lists_every_field_with_its_policy():
    doc = DOCS.read_text()
    for name, (policy, _why) in FIELD_POLICY.items():
        row = re.search(rf"^\| `{name}` \| (\w+) \|", doc, re.MULTILINE)
        assert row is not None, f"docs/proxy.md has no row for {name}"
        assert row.group(1) == policy, f"docs/proxy.md: {name} is {row.group(1)}, the code says {policy}"
