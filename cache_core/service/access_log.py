"""One access-log line per HTTP request, and a request id that every log line of the request carries.

The id is the caller's ``X-Request-ID`` when it sends a usable one (so a gateway's id follows the request
through), else a fresh one; it is echoed in the response's ``X-Request-ID``. While the request runs it sits
in ``cache_core.logs.request_id`` (a context variable), which the log handler adds to every record as
``request_id`` (``http_request_id`` when the record names a decision's ``request_id`` of its own). The access
line (logger ``scache.access``) names the method, path, status and duration, and ``decision_id``: the
cache decision's ``request_id`` (``X-Scache-Request-Id``, the id that ``/v1/feedback`` takes).

A plain ASGI middleware, not ``BaseHTTPMiddleware``: streamed answers pass through unbuffered, and the line
is written when the last chunk has gone out. With tracing on (``cache_core.tracing``) the request is also the
root span of its trace (or a child of the caller's ``traceparent``), named ``METHOD /path`` and carrying the
request id, so the lookup, upstream and publish spans of one request are one trace.
"""
from __future__ import annotations

import logging
import re
import time

from cache_core.ids import new_id
from cache_core.logs import request_id
from cache_core.tracing import OFF, Tracing, annotate

log = logging.getLogger("scache.access")

HEADER = b"x-request-id"
DECISION_HEADER = b"x-scache-request-id"
_USABLE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}\Z")


def incoming_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's X-Request-ID if it is a short token, else a fresh id (never a header injection)."""
    for name, value in headers:
        if name.lower() == HEADER and _USABLE.match(value):
            return value.decode()
    return new_id()


class AccessLog:
    """ASGI middleware: request id in, request id out, one log line per request."""

    def __init__(self, app, tracing: Tracing = OFF) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = incoming_id(scope.get("headers") or [])
        token = request_id.set(rid)
        started = time.perf_counter()
        response: dict = {"status": 500, "decision_id": None}

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                headers = list(message.get("headers") or [])
                response["decision_id"] = next((v.decode() for k, v in headers if k.lower() == DECISION_HEADER), None)
                message = {**message, "headers": [*headers, (HEADER, rid.encode())]}
            await send(message)

        try:
            await self._traced(scope, receive, send_with_id, rid, response)
        finally:
            client = scope.get("client")
            fields = {"request_id": rid, "method": scope["method"], "path": scope["path"], "status": response["status"],
                      "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                      "client": f"{client[0]}:{client[1]}" if client else None}
            if response["decision_id"]:
                fields["decision_id"] = response["decision_id"]
            log.info("%s %s %s", scope["method"], scope["path"], response["status"], extra=fields)
            request_id.reset(token)

    async def _traced(self, scope, receive, send, rid: str, response: dict) -> None:
        if not self.tracing.enabled:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"], "scache.http_request_id": rid}
        with self.tracing.span(f"{scope['method']} {scope['path']}", attributes,
                               parent=self.tracing.extract(headers), kind="server") as span:
            await self.app(scope, receive, send)
            span.set_attribute("http.response.status_code", response["status"])
            annotate(span, request_id=response["decision_id"])
