"""How the service answers a request it cannot take: validation errors, invalid input, unknown experiments."""
from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cache_core.records import InvalidRequest
from cache_core.registry import UnknownExperiment


class Refused(Exception):
    """Raised by a dependency (e.g. an auth check) to answer with ``response`` instead of running the route."""

    def __init__(self, response: JSONResponse):
        super().__init__(response.status_code)
        self.response = response


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


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def unprocessable(_request: Request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": errors_detail(exc.errors())})

    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused):
        return exc.response

    @app.exception_handler(InvalidRequest)
    async def invalid(_request: Request, exc: InvalidRequest):
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(UnknownExperiment)
    async def unknown(_request: Request, exc: UnknownExperiment):
        return JSONResponse(status_code=404, content={"detail": str(exc)})
