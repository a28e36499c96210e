"""How the service answers a request it cannot take.

The OpenAI-compatible routes (``/v1/chat/...``, ``/v1/models``) answer in OpenAI's error shape,
``{"error": {"message", "type", "param", "code"}}``, with 400 for an invalid request (so the
official SDK raises ``BadRequestError`` with the message), and ``x-should-retry: false`` where a
retry cannot help (the SDK honours it). scache's own API (lookup, store, feedback, admin) keeps
``{"detail": ...}`` with 422 for validation errors. A body over the size limit is 413 in OpenAI's
shape on every route (``cache_core.service.transport``).
"""
from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cache_core.records import InvalidRequest
from cache_core.registry import UnknownExperiment
from cache_core.service.transport import BodyTooLarge

OPENAI_PATHS = ("/v1/chat/", "/v1/models", "/v1/embeddings")
NO_RETRY = {"x-should-retry": "false"}
# OpenAI's error types by status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}


class Refused(Exception):
    """Raised by a dependency (e.g. an auth check) to answer with ``response`` instead of running the route."""

    def __init__(self, response: JSONResponse):
        super().__init__(response.status_code)
        self.response = response


def openai_error(status: int, message: str, *, type_: str | None = None, param: str | None = None,
                 code: str | None = None, retry: bool | None = None, headers: dict | None = None) -> JSONResponse:
    """An error in OpenAI's shape. ``retry`` False adds ``x-should-retry: false`` (default: for
    every 4xx but 408/409/429, where the SDK would not retry anyway or a retry cannot help)."""
    if retry is None:
        retry = status in (408, 409, 429) or status >= 500
    type_ = type_ or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse(status_code=status, headers={**(headers or {}), **({} if retry else NO_RETRY)},
                        content={"error": {"message": message, "type": type_, "param": param, "code": code}})


def is_openai_path(request: Request) -> bool:
    # the scope's path, not request.url: building the URL object was a tenth of the lookup route's
    # dependency solving (every request asks, in auth.caller_of)
    return request.scope["path"].startswith(OPENAI_PATHS)


def errors_detail(errors: list[dict]) -> list[dict]:
    """Validation errors as a JSON-safe ``detail``: an echoed ``input`` (or ``ctx``) that cannot be
    rendered (NaN or Infinity, a lone surrogate, the raw bytes of a body that is not JSON, an
    exception object) is given as its repr (str), so the 422 never turns into a 500 while written."""
    def safe(value, show=repr):
        try:
            json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
            return value
        except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
            return show(value)[:200]

    detail = []
    for error in errors:
        error = {key: value for key, value in error.items() if key != "url"}
        if "input" in error:
            error["input"] = safe(error["input"])
        if isinstance(error.get("ctx"), dict):
            error["ctx"] = {key: safe(value, str) for key, value in error["ctx"].items()}
        detail.append(error)
    return detail


def _param(loc) -> str | None:
    """A validation error's location as OpenAI's ``param`` ("messages[0].content"), body prefix dropped."""
    parts = [part for part in loc if part != "body"]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def unprocessable(request: Request, exc: RequestValidationError):
        if is_openai_path(request):
            errors = exc.errors()
            first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
            param = _param(first.get("loc", ()))
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
            if len(errors) > 1:
                message += f" (and {len(errors) - 1} more)"
            return openai_error(400, message, param=param)
        return JSONResponse(status_code=422, content={"detail": errors_detail(exc.errors())})

    @app.exception_handler(BodyTooLarge)
    async def too_large(_request: Request, exc: BodyTooLarge):
        return openai_error(413, exc.detail, code="request_too_large", headers={"connection": "close"})

    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused):
        return exc.response

    @app.exception_handler(InvalidRequest)
    async def invalid(request: Request, exc: InvalidRequest):
        if is_openai_path(request):
            return openai_error(400, str(exc))
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(UnknownExperiment)
    async def unknown(request: Request, exc: UnknownExperiment):
        if is_openai_path(request):
            return openai_error(404, str(exc), code="experiment_not_found")
        return JSONResponse(status_code=404, content={"detail": str(exc)})
