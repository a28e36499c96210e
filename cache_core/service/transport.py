"""ASGI middleware in front of every route: a request-size limit enforced before the body is read.

A ``content-length`` over the limit is refused at once with 413 (OpenAI's error shape,
``x-should-retry: false``) without reading a byte of the body; a body sent without a length
(chunked) is counted as it arrives and refused once it passes the limit. (The request id on every
response is ``cache_core.service.access_log``'s.)
"""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a body without a content-length passes the limit (an HTTPException,
    so FastAPI's body reading lets it through to the handler in ``cache_core.service.errors``)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes (SCACHE_SERVICE__MAX_REQUEST_MIB)")


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class TransportMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(send_started)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        try:
            await self.app(scope, counted if length is None else receive, send_started)
        except BodyTooLarge:
            if not started:
                await self._too_large(send_started)

    async def _too_large(self, send: Send) -> None:
        body = error_body(BodyTooLarge(self.max_body_bytes).detail, "invalid_request_error",
                          code="request_too_large")
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"x-should-retry", b"false"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
