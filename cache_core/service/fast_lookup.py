"""``POST /v1/lookup`` without FastAPI's request handling, for requests that are well formed.

The hottest route spent about half of the HTTP app's CPU per request in FastAPI and Starlette
(routing over every route, dependency solving, the request and response objects; an in-process run
of the app: bench/front_throughput.py's reading in bench/results/front_throughput.md). This ASGI
middleware sits inside the access log and the size limit (so a request still gets its request id,
its log line and its 413) and answers a lookup itself when the request is plainly good: ``POST`` to
exactly ``/v1/lookup``, ``content-type: application/json``, a body that ``json.loads`` parses (as FastAPI
reads it) and ``LookupRequest`` validates. It runs the route's own ``routes.lookup.answer`` with the
caller that ``auth.caller_of`` finds, and an exception from it (401/403 ``Refused``, ``InvalidRequest``,
``UnknownExperiment``) is answered by the app's own exception handler for it, so the answer is the
one the route gives.

Everything else (other paths and methods, a body that is not JSON or not a valid ``LookupRequest``,
an app with dependency overrides, as tests set them) goes to FastAPI unchanged, with the body read
here handed on as it came: its error shapes (422 ``detail``, the JSON decode error) are FastAPI's
own, not a copy. The route stays in the app, so the OpenAPI description is the same.
"""
from __future__ import annotations

import inspect
import json

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cache_core.service.access_log import DECISION_HEADER
from cache_core.service.auth import caller_of
from cache_core.service.routes.lookup import PATH, answer
from cache_core.service.schemas import LookupRequest


def _plain_json(content_type: bytes | None) -> bool:
    """The request says ``content-type: application/json`` (what clients send). FastAPI parses more
    (``application/*+json``, parameters such as a charset) and refuses a body without a content type:
    anything but the plain value goes to FastAPI, so its reading decides."""
    return content_type is not None and content_type.lower() == b"application/json"


class FastLookup:
    """ASGI middleware: answers well-formed ``POST /v1/lookup`` requests; ``service`` is the FastAPI
    app (its components, exception handlers and dependency overrides)."""

    def __init__(self, app: ASGIApp, service) -> None:
        self.app = app
        self.service = service
        self.answered = 0
        """Requests answered here (the rest went to FastAPI)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST" \
                or self.service.dependency_overrides:
            await self.app(scope, receive, send)
            return
        content_type = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
                break
        if not _plain_json(content_type):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: FastAPI handles it as before
                await self.app(scope, _replay(chunks, receive, message), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body = LookupRequest.model_validate(json.loads(raw)) if raw else None
        except Exception:  # not JSON, not UTF-8, nested too deep (RecursionError), not a LookupRequest:
            body = None    # FastAPI reads it again and answers as it does
        if body is None:
            await self.app(scope, _replay([raw], receive), send)
            return
        request = Request(scope, receive)
        try:
            content, decision_id = await answer(self.service.state.components,
                                                caller_of(request, self.service.state.components), body)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
            await response(scope, receive, send)
            return
        self.answered += 1
        await send({"type": "http.response.start", "status": 200, "headers": [
            (DECISION_HEADER, decision_id.encode()), (b"content-length", b"%d" % len(content)),
            (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": content})

    def _handler(self, exc: Exception):
        """The app's exception handler for ``exc`` (by class, most specific first), as Starlette picks it."""
        handlers = self.service.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                return handlers[cls]
        return None


def _replay(chunks: list[bytes], receive: Receive, last: Message | None = None) -> Receive:
    """``receive`` that gives the body read so far as one message first (then ``last``, if the read
    stopped at it), then the real ``receive``."""
    pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": last is not None}]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
