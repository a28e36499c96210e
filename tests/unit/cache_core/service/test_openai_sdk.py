"""The official ``openai`` SDK against the running proxy (a stub upstream behind it): requests, hits,
streaming, async, tools, n > 1, image parts, errors and per-request controls, as a user's code would
see them. The SDK is in the test extra (requirements.lock); LangChain and LiteLLM: test_real_clients.py."""
from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest

from cache_core.service.app import create_app
from cache_core.service.keys import key_digest
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream
from tests.unit.cache_core.service.test_service_chat_admin import Served

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


def test_a_paraphrase_is_a_hit(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    first = client.chat.completions.with_raw_response.create(model="m", messages=ask("How do I reset my PIN?"))
    again = client.chat.completions.with_raw_response.create(model="m", messages=ask("How can I reset my PIN?"))
    assert first.headers["x-scache-hit"] == "0"
    assert again.headers["x-scache-hit"] == "1" and again.headers["x-scache-decision"] == "hit"
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content


def test_async_hits_errors_and_streams(base_url):
    async def run():
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
            first = await client.chat.completions.with_raw_response.create(
                model="m", messages=ask("When does the branch open?"))
            again = await client.chat.completions.with_raw_response.create(
                model="m", messages=ask("When does the branch open on weekdays?"))
            stream = await client.chat.completions.create(model="m", messages=ask("When does the branch open?"),
                                                          stream=True)
            chunks = [c async for c in stream]
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(model="m", messages=[{"role": "user"}], temperature=9)
            async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-nope", max_retries=0) as stranger:
                with pytest.raises(openai.AuthenticationError) as denied:
                    await stranger.chat.completions.create(model="m", messages=ask("When does the branch open?"))
            return first, again, chunks, bad.value, denied.value

    first, again, chunks, bad, denied = asyncio.run(run())
    assert first.headers["x-scache-hit"] == "0" and again.headers["x-scache-hit"] == "1"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == first.parse().choices[0].message.content  # the streamed repeat: a hit
    assert bad.status_code == 400 and bad.type == "invalid_request_error" and bad.param
    assert denied.status_code == 401 and denied.type == "authentication_error"


def test_n_above_one_bypasses_and_gets_every_choice(base_url, upstream):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    client.chat.completions.create(model="m", messages=ask("Name a savings product."))
    calls = len(upstream.calls)
    reply = client.chat.completions.with_raw_response.create(model="m", messages=ask("Name a savings product."), n=3)
    assert reply.headers["x-scache-decision"] == "bypass" and reply.headers["x-scache-bypass"] == "n"
    assert len(reply.parse().choices) == 3 and len(upstream.calls) == calls + 1


def image_question(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_image_parts_are_in_the_key(base_url):
    client = openai.OpenAI(base_url=base_url, api_key=KEY)
    cat, dog = "data:image/png;base64,Y2F0", "data:image/png;base64,ZG9n"
    first = client.chat.completions.with_raw_response.create(model="m", messages=image_question(cat))
    other = client.chat.completions.with_raw_response.create(model="m", messages=image_question(dog))
    same = client.chat.completions.with_raw_response.create(model="m", messages=image_question(cat))
    assert (first.headers["x-scache-hit"], other.headers["x-scache-hit"], same.headers["x-scache-hit"]) == ("0", "0", "1")
    alone = client.chat.completions.with_raw_response.create(model="m", messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": cat}}]}])
    assert alone.headers["x-scache-bypass"] == "no_text"  # nothing to look up: forwarded, not stored


def test_a_body_over_the_limit_is_a_413(minilm_embedder, upstream):
    with serve(minilm_embedder, upstream_url=f"http://127.0.0.1:{upstream.port}/v1", open_access=True,
               max_request_mib=0.01) as small:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{small.port}/v1", api_key="-", max_retries=2)
        calls = len(upstream.calls)
        with pytest.raises(openai.APIStatusError) as big:
            client.chat.completions.create(model="m", messages=ask("x" * 20_000))
        assert big.value.status_code == 413 and big.value.type == "invalid_request_error"
        assert big.value.response.headers["x-should-retry"] == "false" and len(upstream.calls) == calls
