"""A stub OpenAI-compatible upstream for the chat proxy's tests, served by uvicorn on a free port.

Every answer is numbered (``answer #N: <last user text>``), so a test tells a cache hit (an old
number) from a forwarded request. It honours ``n``, answers ``tool_choice: "required"`` with a tool
call, streams with ``pause_s`` between chunks, and serves ``GET /v1/models``."""
from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.unit.cache_core.service.test_service_chat_admin import Served


def last_text(body: dict) -> str:
    content = body["messages"][-1].get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content or ""


class StubUpstream(Served):
    def __init__(self, pause_s: float = 0.0):
        self.calls: list[dict] = []
        self.headers: list[dict] = []
        self.pause_s = pause_s
        self.open_streams = 0
        self.abandoned_streams = 0
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "stub-model", "object": "model", "created": 1,
                                                "owned_by": "stub"}]}

        @app.post("/v1/chat/completions")
        async def completions(request: Request):
            body = await request.json()
            self.calls.append(body)
            self.headers.append(dict(request.headers))
            number, text = len(self.calls), last_text(body)
            if text == "fail please":
                return JSONResponse(status_code=429, content={"error": {
                    "message": "rate limited", "type": "rate_limit_error", "param": None, "code": None}})
            if body.get("stream"):
                return StreamingResponse(self._chunks(number, text, body.get("model") or "stub-model"),
                                         media_type="text/event-stream")
            choices = [self._choice(i, number, text, body) for i in range(body.get("n") or 1)]
            return {"id": f"up-{number}", "object": "chat.completion", "created": 1,
                    "model": body.get("model") or "stub-model", "choices": choices,
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}

        super().__init__(app, "stub upstream", start_timeout_s=20, stop_timeout_s=10)

    @staticmethod
    def _choice(index: int, number: int, text: str, body: dict) -> dict:
        if body.get("tools") and body.get("tool_choice") == "required":
            call = {"id": f"call-{number}", "type": "function",
                    "function": {"name": body["tools"][0]["function"]["name"], "arguments": "{}"}}
            return {"index": index, "finish_reason": "tool_calls", "logprobs": None,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]}}
        return {"index": index, "finish_reason": "stop", "logprobs": None,
                "message": {"role": "assistant", "content": f"answer #{number}: {text}"}}

    async def _chunks(self, number: int, text: str, model: str):
        def event(delta: dict, finish_reason=None) -> bytes:
            chunk = {"id": f"up-{number}", "object": "chat.completion.chunk", "created": 1, "model": model,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        self.open_streams += 1
        completed = False
        try:
            yield event({"role": "assistant", "content": ""})
            for i, word in enumerate(f"answer #{number}: {text}".split(" ")):
                if self.pause_s:
                    await asyncio.sleep(self.pause_s)
                yield event({"content": word if i == 0 else f" {word}"})
            yield event({}, "stop")
            yield b"data: [DONE]\n\n"
            completed = True
        finally:
            self.open_streams -= 1
            if not completed:  # the cache closed the request (its client went away)
                self.abandoned_streams += 1
