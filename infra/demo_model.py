"""The demo's stand-in for the model behind the cache: no LLM runs on this machine.

An OpenAI-compatible ``POST /v1/chat/completions`` that answers after a model-like delay, by
meaning: a question it knows (banking77's, train or test) gets its intent's one answer
(``infra.traffic.answer_for``, the text the demo traffic stores), any other question the intent of
its nearest banking77 train question when that is close enough (the cache's own encoder, loaded in
the background at start; its vectors cached under ``$SCACHE_HOME/demo-model``), else a text naming
the question. So a shadow check (``cache_core.shadow``) that asks it again agrees on a paraphrase
and disagrees across intents, as a real model would. ``stream: true`` is answered with Server-Sent
Events in pieces, as a real model streams. Demo only: production sets
``SCACHE_SERVICE__UPSTREAM_URL`` to the real model.

    python -m infra.demo_model --port 8100 --delay-ms 400
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from cache_core.service.chat import completion_chunks
from cache_core.shadow.equivalence import normalise
from infra.traffic import answer_for, load_queries

log = logging.getLogger("scache.demo_model")
MODEL = "scache-demo-model"
NEAREST_FLOOR = 0.6
"""A question whose nearest banking77 train question is less similar than this is not one it knows."""
PER_INTENT = 10
"""Train questions per intent it compares an unknown question with (770 encodes, once per machine)."""


def answer_to(question: str) -> str:
    """The answer to a question it does not know: names the question."""
    return (f"(demo model) You asked: “{question}”. In production this is your model's answer; "
            "scache stores it and serves it to the paraphrases that follow.")


class Knowledge:
    """Which banking77 intent a question asks about: by its exact text (normalised) for the questions
    it knows, else by the nearest of a few train questions per intent (``encode``: texts to rows, as
    ``Embedder.encode``; None: exact texts only)."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray] | None = None, *,
                 floor: float = NEAREST_FLOOR, per_intent: int = PER_INTENT, cache_dir: Path | None = None):
        self.floor = floor
        self.exact: dict[str, str] = {}
        for name in ("train", "test"):
            for text, intent in load_queries(name):
                self.exact.setdefault(normalise(text), intent)
        seen: dict[str, int] = {}
        self.examples: list[tuple[str, str]] = []
        for text, intent in load_queries("train"):
            if seen.get(intent, 0) < per_intent:
                seen[intent] = seen.get(intent, 0) + 1
                self.examples.append((text, intent))
        self._vectors: np.ndarray | None = None
        self._encode = encode
        if encode is not None:
            self._vectors = self._example_vectors(encode, cache_dir)

    def _example_vectors(self, encode, cache_dir: Path | None) -> np.ndarray:
        texts = [text for text, _ in self.examples]
        key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
        path = None if cache_dir is None else cache_dir / f"banking77-examples-{key}.npy"
        if path is not None and path.exists():
            try:
                vectors = np.load(path)
                if vectors.shape[0] == len(texts):
                    return vectors
            except (OSError, ValueError):
                pass  # a damaged cache file: encode again
        vectors = _unit_rows(encode(texts))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vectors)
            tmp.replace(path)
        return vectors

    def intent_of(self, question: str) -> str | None:
        known = self.exact.get(normalise(question))
        if known is not None or self._vectors is None:
            return known
        scores = self._vectors @ _unit_rows(self._encode([question]))[0]
        best = int(np.argmax(scores))
        return self.examples[best][1] if scores[best] >= self.floor else None

    def answer(self, question: str) -> str:
        intent = self.intent_of(question)
        return answer_for(intent) if intent is not None else answer_to(question)


def _unit_rows(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


class _Loading:
    """The knowledge the app answers with: exact texts at once, by meaning once ``load`` (run in the
    background at start, so the health check answers while the encoder loads) has finished."""

    def __init__(self, knowledge: Knowledge, load: Callable[[], Knowledge] | None):
        self.current = knowledge
        if load is not None:
            threading.Thread(target=self._load, args=(load,), name="demo-model-knowledge", daemon=True).start()

    def _load(self, load: Callable[[], Knowledge]) -> None:
        try:
            self.current = load()
            log.info("demo model answers by meaning")
        except Exception:  # the encoder could not load: known questions are still answered by intent
            log.exception("demo model: answering known questions only")


def encoder_knowledge() -> Knowledge:
    """Knowledge by meaning with the cache's configured encoder (``SCACHE_CACHE__*``)."""
    from cache_core.embedding.load import load_embedder
    from cache_core.runtime import scache_home
    from cache_core.settings import Settings

    embedder = load_embedder(Settings().cache)
    return Knowledge(embedder.encode, cache_dir=scache_home() / "demo-model")


def create_app(delay_s: float = 0.4, knowledge: Knowledge | None = None,
               load: Callable[[], Knowledge] | None = None) -> FastAPI:
    """``knowledge``: what it answers with from the start (default: exact texts); ``load``: a better
    one built in the background (``encoder_knowledge``), used once ready."""
    app = FastAPI(title="scache demo model")
    ids = itertools.count(1)
    knows = _Loading(knowledge if knowledge is not None else Knowledge(), load)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "model": MODEL}

    @app.post("/v1/chat/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            question = str(body["messages"][-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return JSONResponse(status_code=400, content={"error": {
                "message": "expected a JSON body with a non-empty messages list", "type": "invalid_request_error"}})
        model, call = str(body.get("model") or MODEL), f"demo-{next(ids)}"
        await asyncio.sleep(delay_s)  # what a model takes; a cache hit saves it
        answer = knows.current.answer(question)
        if body.get("stream"):
            return StreamingResponse(_chunks(answer, model, call), media_type="text/event-stream")
        words = len(answer.split())
        return {"id": call, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": len(question.split()), "completion_tokens": words,
                          "total_tokens": len(question.split()) + words}}

    return app


async def _chunks(answer: str, model: str, call: str):
    """The chat endpoint's own chunking (role, pieces, finish_reason, [DONE]), paced like a model."""
    for event in completion_chunks(call, model, answer):
        yield event
        await asyncio.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.demo_model", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=400.0, help="how long each answer takes (default 400)")
    parser.add_argument("--exact-only", action="store_true",
                        help="answer by intent only the banking77 questions it knows word for word (no encoder)")
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1-65535, got {args.port}")
    if not 0 <= args.delay_ms <= 60_000:
        parser.error(f"--delay-ms must be in 0-60000, got {args.delay_ms}")
    import uvicorn

    app = create_app(args.delay_ms / 1000, load=None if args.exact_only else encoder_knowledge)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
