"""infra.demo_model, the demo's stand-in model: it answers by meaning (one answer per banking77
intent, so shadow checks agree on paraphrases and disagree across intents); behind the real chat
endpoint a miss is forwarded and stored, a paraphrase is served from the cache without reaching it,
and its stream is valid OpenAI SSE that the cache relays and stores."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app as create_service
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra import demo_model
from infra.runtime import wait_until
from infra.traffic import answer_for
from tests.unit.cache_core.helpers import RecordingPublisher
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


# Two banking77 test questions of one intent, and one of another (exact texts the model knows).
SAME = ("What do I do with my card PIN?", "How do I find my card PIN?")  # get_physical_card
OTHER = "I still have not received my new card, I ordered over a week ago."  # card_arrival


def test_a_question_it_knows_gets_its_intents_one_answer():
    knows = demo_model.Knowledge()
    assert knows.answer(SAME[0]) == knows.answer("  how do i FIND my card pin ") == answer_for("get_physical_card")
    assert knows.answer(OTHER) == answer_for(knows.intent_of(OTHER)) != knows.answer(SAME[0])
    assert knows.answer("What is the capital of France?") == demo_model.answer_to("What is the capital of France?")


def test_an_unknown_paraphrase_gets_its_nearest_intents_answer_and_the_vectors_are_cached(minilm_embedder, tmp_path):
    knows = demo_model.Knowledge(minilm_embedder.encode, cache_dir=tmp_path)
    assert knows.intent_of("my new card still has not shown up in the post") == "card_arrival"
    assert knows.intent_of("what is the capital of France") is None  # nothing near: not a question it knows
    assert knows.answer("What is the capital of France?") == demo_model.answer_to("What is the capital of France?")
    assert len(list(tmp_path.glob("banking77-examples-*.npy"))) == 1

    def no_encoding(texts):
        assert len(texts) == 1, "the examples' vectors come from the cache file"
        return minilm_embedder.encode(texts)

    again = demo_model.Knowledge(no_encoding, cache_dir=tmp_path)
    assert again.intent_of("my new card still has not shown up in the post") == "card_arrival"


def test_the_app_answers_by_meaning_once_its_knowledge_has_loaded(minilm_embedder, tmp_path):
    app = demo_model.create_app(0.0, load=lambda: demo_model.Knowledge(minilm_embedder.encode, cache_dir=tmp_path))
    with Served(app, "demo model") as server:
        def ask(question):
            return httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": question}]}).json()["choices"][0]["message"]["content"]

        assert ask(SAME[0]) == answer_for("get_physical_card")  # known texts at once
        wait_until(lambda: ask("my new card still has not shown up in the post") == answer_for("card_arrival"),
                   60, "the encoder-backed knowledge")


def test_shadow_checks_against_it_agree_on_paraphrases_and_disagree_across_intents(minilm_embedder, tmp_path):
    """The demo's path: /v1/lookup traffic, hits checked by asking it again, near-misses (the lookup
    ones, asked in the background) compared with the nearest candidate's answer."""
    publisher = RecordingPublisher()
    with Served(demo_model.create_app(0.0), "demo model") as model:
        settings = Settings(service={"upstream_url": f"http://127.0.0.1:{model.port}/v1/chat/completions",
                                     "open_access": True},
                            shadow={"hit_rate": 1.0, "near_miss_band": 0.5, "near_miss_rate": 1.0,
                                    "equivalence": "exact", "calls_per_minute": 1000})
        config = ExperimentConfig(experiment_id="demo", salt="s", version=1,
                                  arms=[ArmConfig(name="only", threshold=0.75)])
        components = build_components(settings, publisher, minilm_embedder, control_publisher=lambda m: None,
                                      registry=ExperimentRegistry({"demo": config}))
        from fastapi.testclient import TestClient
        with TestClient(create_service(components)) as client:
            client.post("/v1/store", json={"query": SAME[0], "answer": answer_for("get_physical_card"),
                                           "unit_id": "u"}).raise_for_status()
            asked = {question: client.post("/v1/lookup", json={"query": question, "unit_id": "u"}).json()
                     for question in (SAME[1], OTHER)}
            assert asked[SAME[1]]["hit"] and not asked[OTHER]["hit"]
            ids = {asked[q]["request_id"]: q for q in asked}
            wait_until(lambda: {e.request_id for e in publisher.feedback} >= set(ids), 30, "shadow verdicts")
    verdicts = {ids[e.request_id]: e.verdict for e in publisher.feedback if e.source == "shadow"}
    assert verdicts == {SAME[1]: "correct", OTHER: "wrong"}
    assert components.shadow.stats()["near_miss_wrong"] == 1 and components.shadow.stats()["hit_correct"] == 1
