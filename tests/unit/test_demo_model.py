"""infra.demo_model, the demo's stand-in model, behind the real chat endpoint: a miss is
forwarded and stored, a paraphrase is served from the cache without reaching it, and
its stream is valid OpenAI SSE that the cache relays and stores."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from infra import demo_model
from tests.unit.cache_core.service.test_service_chat_admin import Served, chat, make_client

QUESTION = "How do I reset my card PIN?"


@pytest.fixture(scope="module")
def model():
    with Served(demo_model.create_app(delay_s=0.0), "demo model") as server:
        yield f"http://127.0.0.1:{server.port}"


def test_answers_like_an_openai_model_and_says_it_is_a_stand_in(model):
    body = httpx.post(f"{model}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": QUESTION}]}).json()
    assert body["object"] == "chat.completion" and body["model"] == demo_model.MODEL
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == demo_model.answer_to(QUESTION)
    assert "(demo model)" in choice["message"]["content"] and QUESTION in choice["message"]["content"]
    bad = httpx.post(f"{model}/v1/chat/completions", json={"messages": []})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]


def test_a_miss_goes_to_it_and_a_paraphrase_is_served_from_the_cache(minilm_embedder, tmp_path, model):
    with make_client(minilm_embedder, tmp_path, f"{model}/v1/chat/completions") as client:
        first = chat(client, QUESTION, user="u1")
        assert first.status_code == 200 and first.headers["x-scache-hit"] == "0"
        assert first.headers["x-scache-store"] == "admitted"
        again = chat(client, "how can I reset the PIN of my card", user="u1")
        assert again.status_code == 200 and again.headers["x-scache-hit"] == "1"
        assert again.json()["choices"][0]["message"]["content"] == demo_model.answer_to(QUESTION)


def test_its_stream_is_relayed_in_pieces_and_cached(minilm_embedder, tmp_path, model):
    with make_client(minilm_embedder, tmp_path, f"{model}/v1") as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": QUESTION}], "stream": True, "user": "u2"}) as response:
            assert response.status_code == 200 and response.headers["x-scache-hit"] == "0"
            lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(line) for line in lines[:-1]]
        pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks]
        assert len(pieces) > 5 and "".join(pieces) == demo_model.answer_to(QUESTION)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        again = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}],
                                                          "user": "u2"})
        assert again.headers["x-scache-hit"] == "1"  # the stream was cached (same context: no system prompt)


@pytest.mark.parametrize("args, says", [
    ([], "--port"), (["--port", "0"], "1-65535"), (["--port", "8100", "--delay-ms", "-1"], "0-60000"),
])
def test_bad_arguments_are_one_line_not_a_traceback(args, says):
    run = subprocess.run([sys.executable, "-m", "infra.demo_model", *args], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr
