"""Who may do what: client API keys bound to a tenant, its namespaces and rights.

A key arrives as ``x-scache-api-key: <key>`` or ``Authorization: Bearer <key>``; only its sha256 is
kept (settings ``SCACHE_SERVICE__API_KEYS`` and the file ``SCACHE_SERVICE__API_KEYS_FILE``). Routes
ask for a right on a namespace (``Caller.require``): lookups and cached chat answers need ``read``,
stores ``write``, verdicts ``feedback`` (or ``write``). No key or an unknown one: 401; a key without
the right on that namespace: 403. With ``SCACHE_SERVICE__OPEN_ACCESS=true`` (local use) every caller
may do everything but the admin API, which keeps its own token.

``python -m cache_core.service.auth KEY`` prints the sha256 to put in the settings.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from cache_core.service.deps import ComponentsDep
from cache_core.service.errors import Refused, is_openai_path, openai_error
from cache_core.service.keys import key_digest
from cache_core.service.wiring import Components
from cache_core.settings import ClientKey, Right

KEY_HEADER = "x-scache-api-key"


@dataclass(frozen=True)
class Caller:
    """Who sent the request: a client key, or anyone (open access)."""

    key: ClientKey | None
    """None: open access."""
    openai: bool = False
    """The request came to an OpenAI-compatible route (errors in OpenAI's shape)."""
    consumed_authorization: bool = False
    """The key came in the Authorization header (so that header is not the caller's upstream key)."""

    @property
    def tenant(self) -> str:
        return self.key.tenant if self.key is not None else "open"

    def may(self, right: Right, namespace: str) -> bool:
        if self.key is None:
            return right != "admin"
        rights = set(self.key.rights)
        if right not in rights and not (right == "feedback" and "write" in rights):
            return False
        return any(namespace == allowed or (allowed.endswith("*") and namespace.startswith(allowed[:-1]))
                   for allowed in self.key.namespaces)

    def require(self, right: Right, namespace: str) -> None:
        """Raises Refused (403) unless the caller has ``right`` on ``namespace``."""
        if not self.may(right, namespace):
            message = f"this API key has no {right} right on namespace {namespace!r}"
            raise Refused(openai_error(403, message, code="namespace_forbidden") if self.openai
                          else JSONResponse(status_code=403, content={"detail": message}))

    def require_right(self, right: Right) -> None:
        """Raises Refused (403) unless the caller has ``right`` on some namespace (feedback names none)."""
        if self.key is not None and not any(self.may(right, ns.rstrip("*")) for ns in self.key.namespaces):
            raise Refused(JSONResponse(status_code=403, content={"detail": f"this API key has no {right} right"}))

    def namespace(self, requested: str | None) -> str:
        """The namespace a request uses: the one it names, else the key's first (if not a prefix)."""
        if requested:
            return requested
        first = self.key.namespaces[0] if self.key is not None else "default"
        return "default" if first.endswith("*") else first


def presented_key(request: Request) -> tuple[str | None, bool]:
    """The key the request carries and whether it came as the Authorization bearer."""
    given = request.headers.get(KEY_HEADER)
    if given:
        return given, False
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip(), True
    return None, False


async def get_caller(request: Request, components: ComponentsDep) -> Caller:
    return caller_of(request, components)


def caller_of(request: Request, components: Components) -> Caller:
    """The request's caller; raises Refused (401) without a known key unless access is open."""
    openai = is_openai_path(request)
    if components.settings.service.open_access:
        return Caller(None, openai)
    key, from_authorization = presented_key(request)
    found = components.keys.find(key) if key else None
    if found is None:
        message = ("invalid API key" if key else
                   f"an API key is required: {KEY_HEADER}: <key> or Authorization: Bearer <key>")
        headers = {"www-authenticate": "Bearer"}
        raise Refused(openai_error(401, message, code="invalid_api_key", headers=headers) if openai
                      else JSONResponse(status_code=401, headers={**headers, "x-should-retry": "false"},
                                        content={"detail": message}))
    return Caller(found, openai, from_authorization)


CallerDep = Annotated[Caller, Depends(get_caller)]


@dataclass(frozen=True, slots=True)
class Access:
    """What the hot routes (lookup, chat) need, resolved as one dependency: FastAPI solves
    every dependency of a route on every request, with sub-dependencies and bookkeeping per hop
    (the lookup route's four, each through ``get_components``, were 0.1-0.2 ms of its event-loop CPU;
    bench/front_throughput.py)."""

    components: Components
    caller: Caller


async def get_access(request: Request) -> Access:
    components = request.app.state.components
    return Access(components, caller_of(request, components))


AccessDep = Annotated[Access, Depends(get_access)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cache_core.service.auth",
                                     description="Print the SCACHE_SERVICE__API_KEYS entry of a client key "
                                                 "(only its sha256 is kept).")
    parser.add_argument("key", help="the client's API key")
    parser.add_argument("--tenant", default="TENANT")
    parser.add_argument("--namespace", action="append", help="a namespace the key may use (repeatable)")
    parser.add_argument("--right", action="append", choices=["read", "write", "feedback", "admin"],
                        help="a right (repeatable; default read, write, feedback)")
    args = parser.parse_args(argv)
    print(json.dumps({"sha256": key_digest(args.key), "tenant": args.tenant,
                      "namespaces": args.namespace or ["default"], "rights": args.right or ["read", "write", "feedback"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
