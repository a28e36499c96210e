"""The official ``openai`` SDK against the running proxy (a stub upstream behind it): requests, hits,
streaming, async, tools, errors and per-request controls, as a user's code would see them.

Skipped where the SDK is not installed: it is not in requirements.lock yet (openai==3.51.0 with
jiter==0.19.0 and sniffio==1.3.1 would add it to the test extra; adding them rebuilds every venv)."""
from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from cache_core.service.app import create_app
from cache_core.service.keys import key_digest
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream
from tests.unit.cache_core.service.test_service_chat_admin import Served

openai = pytest.importorskip("openai")

KEY = "sk-scache-test"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def upstream():
    with StubUpstream() as server:
        yield server


def serve(embedder, **service):
    settings = Settings(service=service)
    return Served(create_app(build_components(settings, RecordingPublisher(), embedder, expiry_sweep_s=None)))


@pytest.fixture(scope="module")
def base_url(minilm_embedder, upstream):
    keys = [{"sha256": key_digest(KEY), "tenant": "t", "rights": ["read", "write", "feedback"]}]
    with serve(minilm_embedder, upstream_url=f"http://127.0.0.1:{upstream.port}/v1", api_keys=keys) as server:
        yield f"http://127.0.0.1:{server.port}/v1"


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_sync_requests_miss_then_hit(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    first = client.chat.completions.with_raw_response.create(model="m", messages=ask("How do I close my account?"))
    again = client.chat.completions.with_raw_response.create(model="m", messages=ask("How do I close my account?"))
    assert first.headers["x-scache-hit"] == "0" and again.headers["x-scache-hit"] == "1"
    assert again.headers["x-request-id"]
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert again.parse().choices[0].finish_reason == "stop"
    assert [m.id for m in client.models.list()] == ["stub-model"]


def test_streaming_hits_and_misses_look_alike(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)

    def streamed() -> tuple[str, list]:
        chunks = list(client.chat.completions.create(model="m", messages=ask("Can I freeze my card?"), stream=True))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks

    miss_text, miss = streamed()
    hit_text, hit = streamed()
    assert hit_text == miss_text and miss_text.startswith("answer #")
    for chunks in (miss, hit):
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "stop"
        assert {c.object for c in chunks} == {"chat.completion.chunk"}


def test_async_client(base_url):
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY) as client:
            replies = await asyncio.gather(*[client.chat.completions.create(
                model="m", messages=ask(f"Async question {i}?")) for i in range(5)])
            stream = await client.chat.completions.create(model="m", messages=ask("Async question 0?"), stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return [r.choices[0].message.content for r in replies] + [text]

    answers = asyncio.run(run())
    assert answers[-1] == answers[0]  # the streamed repeat was served from the cache


def test_tools_get_the_tool_call(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    client.chat.completions.create(model="m", messages=ask("Weather in Paris?"))
    reply = client.chat.completions.with_raw_response.create(model="m", messages=ask("Weather in Paris?"),
                                                               tools=TOOLS, tool_choice="required")
    assert reply.headers["x-scache-bypass"] == "tools"
    choice = reply.parse().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"


def test_controls_through_extra_body(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    first = client.chat.completions.with_raw_response.create(
        model="m", messages=ask("Is there a fee for a new card?"), extra_body={"scache": {"no_store": True}})
    assert first.headers["x-scache-store"] == "no_store"
    again = client.chat.completions.with_raw_response.create(model="m", messages=ask("Is there a fee for a new card?"))
    assert again.headers["x-scache-hit"] == "0"


def test_errors_are_the_sdks_own(base_url, minilm_embedder):
    with pytest.raises(openai.AuthenticationError) as denied:
        openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0).chat.completions.create(
            model="m", messages=ask("hello"))
    assert denied.value.code == "invalid_api_key" and "invalid API key" in denied.value.message
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=[{"content": "no role"}])
    assert bad.value.param == "messages[0].role" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.RateLimitError):  # the upstream's own error, relayed
        client.with_options(max_retries=0).chat.completions.create(model="m", messages=ask("fail please"))
    with serve(minilm_embedder, open_access=True) as lonely:  # no upstream: a 503 not worth a retry
        url = f"http://127.0.0.1:{lonely.port}"
        with pytest.raises(openai.InternalServerError) as down:
            openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=3).chat.completions.create(
                model="m", messages=ask("anything new"))
        assert down.value.status_code == 503 and down.value.code == "no_upstream"
        metrics = httpx.get(url + "/metrics").text
        assert re.search(r'scache_chat_requests_total\{outcome="error_503"\} 1\.0', metrics)  # not retried
