"""LangChain's ``ChatOpenAI`` and LiteLLM's OpenAI-compatible provider against the running proxy (a
stub upstream behind it): a miss, a hit on the repeat, streaming and an error, as a user's code
would see them. The official SDK: test_openai_sdk.py."""
from __future__ import annotations

import asyncio
import os

import openai
import pytest

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported: no network here

import litellm  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

from tests.unit.cache_core.service.test_openai_sdk import KEY, base_url, upstream  # noqa: E402,F401 (fixtures)


def test_langchain_invoke_and_stream(base_url):
    llm = ChatOpenAI(model="m", base_url=base_url, api_key=KEY, include_response_headers=True, max_retries=0)
    first = llm.invoke("How do I order a new cheque book?")
    again = llm.invoke("How can I order a new cheque book?")
    assert first.response_metadata["headers"]["x-scache-hit"] == "0"
    assert again.response_metadata["headers"]["x-scache-hit"] == "1"
    assert again.content == first.content and first.content.startswith("answer #")
    chunks = list(llm.stream("How do I order a new cheque book?"))
    assert "".join(c.content for c in chunks) == first.content
    stranger = ChatOpenAI(model="m", base_url=base_url, api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):  # LangChain lets the SDK's typed error through
        stranger.invoke("How do I order a new cheque book?")


def test_litellm_completion(base_url):
    def ask(text: str, **extra):
        return litellm.completion(model="openai/m", api_base=base_url, api_key=KEY,
                                  messages=[{"role": "user", "content": text}], **extra)

    def hit(response) -> str:
        return response._hidden_params["additional_headers"]["llm_provider-x-scache-hit"]

    first = ask("Where can I see my IBAN?")
    again = ask("Where do I see my IBAN?")
    assert (hit(first), hit(again)) == ("0", "1")
    assert again.choices[0].message.content == first.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in ask("Where can I see my IBAN?", stream=True))
    assert streamed == first.choices[0].message.content
    unstored = ask("Is my IBAN secret?", extra_body={"scache": {"no_store": True}})
    assert unstored._hidden_params["additional_headers"]["llm_provider-x-scache-store"] == "no_store"
    assert hit(ask("Is my IBAN secret?")) == "0"
    with pytest.raises(litellm.AuthenticationError):
        litellm.completion(model="openai/m", api_base=base_url, api_key="sk-nope", max_retries=0,
                           messages=[{"role": "user", "content": "Where can I see my IBAN?"}])


def test_litellm_async(base_url):
    questions = ["Do you charge for foreign ATM withdrawals?", "How long does a SEPA transfer take?"]

    async def run():
        return await asyncio.gather(*[litellm.acompletion(
            model="openai/m", api_base=base_url, api_key=KEY,
            messages=[{"role": "user", "content": questions[i % 2]}]) for i in range(4)])

    replies = asyncio.run(run())
    assert [r.choices[0].message.content.split(": ", 1)[1] for r in replies] == questions * 2
