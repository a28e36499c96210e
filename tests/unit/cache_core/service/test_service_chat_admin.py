"""Chat completions (against a real local upstream HTTP server), admin API, new metrics."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from cache_core.publish.control_topic import ControlLost, ControlUnconfirmed
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.state.persistence import Persistence
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import free_port, wait_until
from tests.unit.cache_core.helpers import RecordingPublisher

TOKEN = "s3cret-admin"


class Served:
    """An ASGI app under a real uvicorn server on a free port, in a daemon thread, for the
    length of a ``with`` block (``port``: where it listens)."""

    def __init__(self, app, name: str = "scache server", start_timeout_s: float = 30,
                 stop_timeout_s: float = 15):
        self.name, self.start_timeout_s, self.stop_timeout_s = name, start_timeout_s, stop_timeout_s
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.server.started, self.start_timeout_s, self.name)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(self.stop_timeout_s)


class Upstream(Served):
    """A tiny OpenAI-compatible server on a free port, run by uvicorn in a thread.

    ``stream: true`` is answered with SSE chunks, one per word. Questions that misbehave:
    "fail please" (429), "truncate please" (finish_reason "length"), "break please" (the
    connection drops mid-stream), "no stream please" (plain JSON despite stream=true),
    "wait for the gate" (stops after the first word until ``gate`` is set)."""

    def __init__(self):
        self.calls: list[dict] = []
        self.headers: list[dict] = []
        self.gate = threading.Event()
        self.gate_released = False
        """Whether the last gated stream went on because the gate was set (not a timeout)."""
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def completions(request: Request):
            body = await request.json()
            self.calls.append(body)
            self.headers.append(dict(request.headers))
            question = body["messages"][-1]["content"]
            if question == "fail please":
                return _error()
            if body.get("stream") and question != "no stream please":
                return StreamingResponse(self._chunks(question, body["model"], len(self.calls)),
                                         media_type="text/event-stream")
            return {"id": f"up-{len(self.calls)}", "object": "chat.completion", "created": 1,
                    "model": body["model"], "usage": {"prompt_tokens": 7, "completion_tokens": 5,
                                                      "total_tokens": 12},
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"upstream says: {question}"}}]}

        def _error():
            from fastapi.responses import JSONResponse
            return JSONResponse(status_code=429, content={"error": {"message": "rate limited"}})

        super().__init__(app, "upstream server", start_timeout_s=20, stop_timeout_s=10)

    async def _chunks(self, question: str, model: str, call: int):
        def event(delta: dict, finish_reason=None) -> bytes:
            chunk = {"id": f"up-{call}", "object": "chat.completion.chunk", "created": 1, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        yield event({"role": "assistant", "content": ""})
        for i, word in enumerate(f"upstream says: {question}".split(" ")):
            yield event({"content": word if i == 0 else f" {word}"})
            if i == 0 and question == "wait for the gate":
                self.gate_released = await asyncio.to_thread(self.gate.wait, 20)
            if i == 1 and question == "break please":
                raise RuntimeError("upstream crashed mid-stream")
        yield event({}, "length" if question == "truncate please" else "stop")
        yield b"data: [DONE]\n\n"


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as server:
        yield server


class ControlRecorder:
    def __init__(self):
        self.messages = []
        self.fail = False
        self.outcome = None  # None: published and won; else the exception publishing raises

    def __call__(self, message):
        if self.fail:
            raise ConnectionError("broker down")
        self.messages.append(message)
        if self.outcome is not None:
            raise self.outcome(message)


def make_client(minilm_embedder, tmp_path, upstream_url=None, admin_token=TOKEN):
    settings = Settings(service={"upstream_url": upstream_url, "admin_token": admin_token, "open_access": True})
    control = ControlRecorder()
    registry = ExperimentRegistry({"chat-exp": ExperimentConfig.model_validate(new_config(1, 0.8))})
    app = create_app(build_components(settings, RecordingPublisher(), minilm_embedder, control_publisher=control,
                                      registry=registry, persistence=Persistence(tmp_path / "snap")))
    client = TestClient(app, raise_server_exceptions=False)
    client.control = control
    return client


def chat(client, text, headers=None, **extra):
    return client.post("/v1/chat/completions", headers=headers or {},
                       json={"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                                           {"role": "user", "content": text}], **extra})


def test_miss_forwards_then_paraphrase_hits_from_cache(minilm_embedder, tmp_path, upstream):
    with make_client(minilm_embedder, tmp_path, f"http://127.0.0.1:{upstream.port}/v1") as client:
        before = len(upstream.calls)
        first = chat(client, "How do I reset my password?", user="alice",
                     headers={"authorization": "Bearer user-key"})
        assert first.status_code == 200 and first.headers["x-scache-hit"] == "0"
        assert first.json()["choices"][0]["message"]["content"] == "upstream says: How do I reset my password?"
        assert first.json()["usage"]["total_tokens"] == 12 and first.headers["x-scache-store"] == "admitted"
        assert len(upstream.calls) == before + 1 and upstream.calls[-1]["user"] == "alice"
        assert upstream.headers[-1]["authorization"] == "Bearer user-key"
        second = chat(client, "how can I reset my password", user="bob")
        body = second.json()
        assert second.status_code == 200 and second.headers["x-scache-hit"] == "1"
        assert body["object"] == "chat.completion" and body["model"] == "tiny"
        assert body["choices"][0]["message"] == {"role": "assistant",
                                                 "content": "upstream says: How do I reset my password?"}
        assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        assert len(upstream.calls) == before + 1          # the hit never reached upstream
        metrics = client.get("/metrics").text
        assert 'scache_chat_requests_total{outcome="hit"} 1.0' in metrics
        assert 'scache_chat_requests_total{outcome="forwarded"} 1.0' in metrics
        assert "scache_persistence_fsyncs_total 1.0" in metrics


def test_conversation_header_scopes_the_cache(minilm_embedder, tmp_path, upstream):
    with make_client(minilm_embedder, tmp_path, f"http://127.0.0.1:{upstream.port}/v1/chat/completions") as client:
        conv = {"x-scache-conversation-id": "c1"}
        assert chat(client, "what about the second one?", headers=conv).headers["x-scache-hit"] == "0"
        assert chat(client, "what about the second one?", headers=conv).headers["x-scache-hit"] == "1"
        other = chat(client, "what about the second one?", headers={"x-scache-conversation-id": "c2"})
        assert other.headers["x-scache-hit"] == "0"


def test_system_prompt_and_earlier_turns_are_part_of_the_context(minilm_embedder, tmp_path, upstream):
    def ask(client, messages):
        return client.post("/v1/chat/completions",
                           json={"model": "tiny", "messages": messages}).headers["x-scache-hit"]

    question = {"role": "user", "content": "and how much does it cost?"}
    with make_client(minilm_embedder, tmp_path, f"http://127.0.0.1:{upstream.port}/v1") as client:
        brief = [{"role": "system", "content": "be brief"}, question]
        assert ask(client, brief) == "0" and ask(client, brief) == "1"
        assert ask(client, [{"role": "system", "content": "answer in French"}, question]) == "0"
        card = [{"role": "user", "content": "tell me about the metal card"},
                {"role": "assistant", "content": "It is made of steel."}, question]
        loan = [{"role": "user", "content": "tell me about personal loans"},
                {"role": "assistant", "content": "Rates start at 5%."}, question]
        assert ask(client, card) == "0" and ask(client, card) == "1"
        assert ask(client, loan) == "0"          # same follow-up, another history: never shared


def test_upstream_errors_pass_through_and_are_not_cached(minilm_embedder, tmp_path, upstream):
    with make_client(minilm_embedder, tmp_path, f"http://127.0.0.1:{upstream.port}/v1") as client:
        for _ in range(2):
            response = chat(client, "fail please")
            assert response.status_code == 429 and response.headers["x-scache-hit"] == "0"
        dead = make_client(minilm_embedder, tmp_path / "dead", f"http://127.0.0.1:{free_port()}")
        with dead:
            response = chat(dead, "anything at all")
            assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]


@pytest.mark.parametrize("payload, status, reason", [
    ({"model": "m", "messages": [{"role": "system", "content": "x"}]}, 400, "no user message"),
    ({"model": "m", "messages": []}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}, 503, "upstream"),
    ({"model": "m", "messages": [{"role": "user", "content": "an unseen question"}]}, 503, "upstream"),
])
def test_chat_bad_requests_and_no_upstream(minilm_embedder, tmp_path, payload, status, reason):
    with make_client(minilm_embedder, tmp_path) as client:
        response = client.post("/v1/chat/completions", json=payload)
        assert response.status_code == status and reason in response.text


def new_config(version: int, threshold: float) -> dict:
    return ExperimentConfig(experiment_id="chat-exp", salt="chat-exp-v1", version=version,
                            arms=[ArmConfig(name="only", threshold=threshold)]).model_dump(mode="json")


def test_admin_put_experiment_publishes_and_applies(minilm_embedder, tmp_path):
    with make_client(minilm_embedder, tmp_path) as client:
        auth = {"authorization": f"Bearer {TOKEN}"}
        response = client.put("/v1/admin/experiments/chat-exp", json=new_config(5, 0.7), headers=auth)
        assert response.status_code == 200, response.text
        assert response.json() == {"applied": True, "published": True,
                                   "experiment_id": "chat-exp", "version": 5}
        assert client.control.messages[-1].experiment.version == 5
        served = client.get("/v1/experiments").json()["experiments"][0]
        assert served["version"] == 5 and served["arms"][0]["threshold"] == 0.7
        stale = client.put("/v1/admin/experiments/chat-exp", json=new_config(5, 0.9), headers=auth)
        assert stale.status_code == 409 and "not higher" in stale.text
        mismatch = client.put("/v1/admin/experiments/other", json=new_config(6, 0.9), headers=auth)
        assert mismatch.status_code == 422 and "does not match" in mismatch.text
        invalid = client.put("/v1/admin/experiments/chat-exp", json={"arms": []}, headers=auth)
        assert invalid.status_code == 422
        client.control.fail = True
        down = client.put("/v1/admin/experiments/chat-exp", json=new_config(6, 0.9), headers=auth)
        assert down.status_code == 503 and "not applied" in down.text
        assert client.get("/v1/experiments").json()["experiments"][0]["version"] == 5


def test_admin_put_that_loses_a_race_or_cannot_be_confirmed_applies_nowhere(minilm_embedder, tmp_path):
    winner = ExperimentConfig.model_validate({**new_config(6, 0.6), "updated_by": "bob"})
    with make_client(minilm_embedder, tmp_path) as client:
        auth = {"authorization": f"Bearer {TOKEN}"}
        client.control.outcome = lambda message: ControlLost(message, winner)
        lost = client.put("/v1/admin/experiments/chat-exp", json=new_config(6, 0.9), headers=auth)
        assert lost.status_code == 409 and "lost to a concurrent push (by bob at version 6)" in lost.text
        client.control.outcome = lambda message: ControlUnconfirmed("read-back timed out")
        unsure = client.put("/v1/admin/experiments/chat-exp", json=new_config(6, 0.9), headers=auth)
        assert unsure.status_code == 503 and "read-back timed out" in unsure.text
        assert len(client.control.messages) == 2  # both were published ...
        assert client.get("/v1/experiments").json()["experiments"][0]["version"] == 1  # ... neither applied here


def test_admin_auth(minilm_embedder, tmp_path):
    with make_client(minilm_embedder, tmp_path) as client:
        missing = client.delete("/v1/admin/namespaces/t1")
        assert missing.status_code == 401 and "Bearer" in missing.text
        wrong = client.delete("/v1/admin/namespaces/t1", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 403 and "invalid" in wrong.text
        put = client.put("/v1/admin/experiments/chat-exp", json=new_config(9, 0.5))
        assert put.status_code == 401 and client.control.messages == []
    with make_client(minilm_embedder, tmp_path / "b", admin_token=None) as client:
        disabled = client.delete("/v1/admin/namespaces/t1", headers={"authorization": f"Bearer {TOKEN}"})
        assert disabled.status_code == 403 and "disabled" in disabled.text


def test_admin_clear_namespace(minilm_embedder, tmp_path):
    with make_client(minilm_embedder, tmp_path) as client:
        for namespace in ("t1", "t2"):
            client.post("/v1/store", json={"query": "card arrival time", "answer": "3 days",
                                           "unit_id": "u", "namespace": namespace})
        cleared = client.delete("/v1/admin/namespaces/t1", headers={"authorization": f"Bearer {TOKEN}"})
        assert cleared.status_code == 200 and cleared.json() == {"namespace": "t1", "removed": 1}
        ask = {"query": "card arrival time", "unit_id": "u"}
        assert not client.post("/v1/lookup", json={**ask, "namespace": "t1"}).json()["hit"]
        assert client.post("/v1/lookup", json={**ask, "namespace": "t2"}).json()["hit"]
