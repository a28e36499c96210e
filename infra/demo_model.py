"""The demo's stand-in for the model behind the cache: no LLM runs on this machine.

An OpenAI-compatible ``POST /v1/chat/completions`` that answers after a model-like delay
with a text naming the question it was asked, so a paraphrase answered from the cache
shows whose answer it got (and what the hit saved: the delay). ``stream: true`` is
answered with Server-Sent Events in pieces, as a real model streams. Demo only:
production sets ``SCACHE_SERVICE__UPSTREAM_URL`` to the real model.

    python -m infra.demo_model --port 8100 --delay-ms 400
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from cache_core.service.chat import completion_chunks

MODEL = "scache-demo-model"


def answer_to(question: str) -> str:
    return (f"(demo model) You asked: “{question}”. In production this is your model's answer; "
            "scache stores it and serves it to the paraphrases that follow.")


def create_app(delay_s: float = 0.4) -> FastAPI:
    app = FastAPI(title="scache demo model")
    ids = itertools.count(1)

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
        answer = answer_to(question)
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
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1-65535, got {args.port}")
    if not 0 <= args.delay_ms <= 60_000:
        parser.error(f"--delay-ms must be in 0-60000, got {args.delay_ms}")
    import uvicorn

    uvicorn.run(create_app(args.delay_ms / 1000), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
