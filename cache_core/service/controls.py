"""Per-request cache controls of the chat proxy, as headers or in the request body (``extra_body``).

| what | header | body (``extra_body={"scache": {...}}``) | LiteLLM's ``cache`` field |
|---|---|---|---|
| skip the lookup (still store the answer) | ``x-scache-no-lookup: 1`` | ``"no_lookup": true`` | ``"no-cache": true`` |
| do not store the answer | ``x-scache-no-store: 1`` | ``"no_store": true`` | ``"no-store": true`` |
| force a refresh (skip the lookup, store the new answer over the old) | ``x-scache-refresh: 1`` | ``"refresh": true`` | |
| lifetime of the stored answer (s) | ``x-scache-ttl: 600`` | ``"ttl_s": 600`` | ``"ttl": 600`` |
| namespace | ``x-scache-namespace: acme`` | ``"namespace": "acme"`` | ``"namespace": "acme"`` |

The body's value wins over the header's. Neither field goes upstream nor into the cache key. What was
applied comes back in ``x-scache-controls`` (e.g. ``no-lookup, ttl=600``) and ``x-scache-namespace``;
a skipped lookup is a ``bypass`` decision with the reason ``no_lookup`` or ``refresh``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cache_core.service.chat import ChatError
from cache_core.service.schemas import ChatCompletionRequest

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_LITELLM = {"no-cache": "no_lookup", "no-store": "no_store", "ttl": "ttl_s", "namespace": "namespace"}
MAX_NAMESPACE = 128


@dataclass
class CacheControls:
    no_lookup: bool = False
    no_store: bool = False
    refresh: bool = False
    ttl_s: float | None = None
    namespace: str | None = None

    @property
    def skip_reason(self) -> str | None:
        """Why the lookup is skipped (a bypass reason), or None."""
        return "refresh" if self.refresh else ("no_lookup" if self.no_lookup else None)

    def applied(self) -> str:
        """The controls in force, for ``x-scache-controls`` ("" when none)."""
        parts = [name for name, on in (("no-lookup", self.no_lookup), ("no-store", self.no_store),
                                       ("refresh", self.refresh)) if on]
        if self.ttl_s is not None:
            parts.append(f"ttl={self.ttl_s:g}")
        return ", ".join(parts)


def read_controls(body: ChatCompletionRequest, headers) -> CacheControls:
    """The request's controls; ChatError(422) naming the one that is not valid."""
    given: dict[str, object] = {}
    for name in ("no_lookup", "no_store", "refresh"):
        header = f"x-scache-{name.replace('_', '-')}"
        if header in headers:
            given[name] = _flag(headers[header], header)
    if "x-scache-ttl" in headers:
        given["ttl_s"] = headers["x-scache-ttl"]
    extra = body.model_extra or {}
    litellm = extra.get("cache")
    if isinstance(litellm, dict):
        given.update({_LITELLM[k]: v for k, v in litellm.items() if k in _LITELLM})
    ours = extra.get("scache")
    if ours is not None:
        if not isinstance(ours, dict):
            raise ChatError(422, "scache must be an object of cache controls", param="scache")
        unknown = sorted(set(ours) - {"no_lookup", "no_store", "refresh", "ttl_s", "namespace"})
        if unknown:
            raise ChatError(422, f"unknown cache control(s): {', '.join(unknown)}", param="scache")
        given.update(ours)
    controls = CacheControls()
    for name in ("no_lookup", "no_store", "refresh"):
        if name in given:
            value = given[name]
            setattr(controls, name, _flag(value, name) if isinstance(value, str) else _bool(value, name))
    if given.get("ttl_s") is not None:
        controls.ttl_s = _ttl(given["ttl_s"])
    namespace = given.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str) or not 1 <= len(namespace) <= MAX_NAMESPACE:
            raise ChatError(422, f"namespace must be a string of 1 to {MAX_NAMESPACE} characters", param="namespace")
        controls.namespace = namespace
    return controls


def _flag(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ChatError(422, f"{name} must be true or false, not {value[:40]!r}", param=name)


def _bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ChatError(422, f"{name} must be true or false", param=name)


def _ttl(value: object) -> float:
    try:
        ttl = float(value)  # a header's text, or a number
    except (TypeError, ValueError):
        ttl = math.nan
    if isinstance(value, bool) or not math.isfinite(ttl) or ttl <= 0:
        raise ChatError(422, "ttl must be a positive number of seconds", param="ttl_s")
    return ttl
