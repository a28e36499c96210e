"""Request and response bodies of the HTTP API (strict types: wrong types are 422)."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from cache_core.events import FeedbackSource

_ID = Field(min_length=1, max_length=256)


def _unicode(text: str) -> str:
    # JSON may escape a lone surrogate ("\ud800"); such a string cannot be encoded, logged or embedded.
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it contains a lone surrogate)") from None
    return text


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must be a non-empty string")
    return text


Text = Annotated[str, AfterValidator(_unicode)]
"""Free text (a query, an answer): any length here, valid Unicode. Constrained strings
(ids, with a length) are checked for it by pydantic already."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LookupRequest(_Strict):
    query: Text
    """The user's question; length is checked against ``max_query_chars``."""
    unit_id: str = _ID
    """The randomisation unit (user, session, tenant) whose arm decides."""
    experiment_id: str | None = Field(None, min_length=1, max_length=64)
    namespace: str = Field("default", min_length=1, max_length=128)
    scope: str | None = Field(None, min_length=1, max_length=256)
    """Conversation fingerprint: scoped entries answer only the same scope."""


class Provenance(_Strict):
    source: str = Field("", max_length=256)
    version: str = Field("", max_length=128)


class StoreRequest(LookupRequest):
    answer: Text
    ttl_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    provenance: Provenance = Provenance()

    model_config = ConfigDict(extra="forbid", strict=True)


MAX_STORE_BATCH = 512


class StoreBatchRequest(_Strict):
    """``POST /v1/store/batch``: seed or refresh many answers in one call (one encode batch,
    one fsync). ``every_arm``: into every store of each item's experiment, so that every arm
    starts equally warm (the default stores into the unit's arm only, as ``/v1/store``)."""

    items: list[StoreRequest] = Field(min_length=1, max_length=MAX_STORE_BATCH)
    every_arm: bool = False


class PurgeRequest(_Strict):
    """``POST /v1/admin/namespaces/{namespace}/purge``: at least a source or a query."""

    provenance_source: str | None = Field(None, min_length=1, max_length=256)
    provenance_version: str | None = Field(None, max_length=128)
    query: Annotated[Text, AfterValidator(_not_blank)] | None = None
    """As stored: blank is refused, as by lookup and store."""


class FeedbackRequest(_Strict):
    request_id: str = Field(min_length=1, max_length=128)
    verdict: Literal["correct", "wrong"]
    source: FeedbackSource = "user"
    """"shadow": an outside shadow checker's verdict (counted apart, never takes an entry out)."""


class LookupResponse(BaseModel):
    request_id: str
    decision: str
    hit: bool
    answer: str | None
    similarity: float | None
    threshold: float | None
    experiment_id: str
    arm: str
    config_version: int
    intent_cluster: int
    entry_id: str | None
    entry_age_s: float | None
    provenance: Provenance | None
    latency_ms: float
    variant: str = "base"
    """"canary" when the unit is in the arm's canary share."""
    guard: str | None = None
    """The lexical guard that turned a would-be hit into this miss."""
    score: float | None = None
    """Multi-similarity arms: the best-ranked candidate's mixed score (null on cosine arms)."""
    score_margin: float | None = None
    """Multi-similarity arms: its lead over the best candidate with another answer."""
    judge_version: str | None = None
    """Arms with a judge: the judge version that decided."""
    judge_probability: float | None = None
    """Its probability that the most probable candidate's answer fits (served if >= its cut)."""
    feedback_requested: bool = False
    """Ask the user whether this answer was right and post the verdict to /v1/feedback: the hit is in
    the arm's random sample (``feedback_sample_rate``), whose verdicts estimate the false-hit rate."""


class StoreResponse(BaseModel):
    stored: bool
    reason: str
    entry_id: str | None
    similarity: float | None
    experiment_id: str
    arm: str
    config_version: int
    intent_cluster: int


class StoreBatchResponse(BaseModel):
    results: list[list[StoreResponse]]
    """Per item, in order: one result per store it was offered to (see ``every_arm``)."""
    stored: int


class ChatMessage(BaseModel):
    """One OpenAI chat message; unknown fields (name, tool_calls...) pass through."""

    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat-completions request; fields we do not use are forwarded as-is."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    user: str | None = Field(None, max_length=256)
    stream: StrictBool = False
    """Strict: "yes" or 1 is refused, not taken for true."""

    @model_validator(mode="after")
    def _forwardable(self) -> "ChatCompletionRequest":
        # The request goes upstream as JSON: a NaN / Infinity literal or a lone surrogate in any
        # field (passed-through ones included) could not be sent.
        try:
            json.dumps(self.model_dump(), ensure_ascii=False, allow_nan=False).encode()
        except ValueError as exc:  # UnicodeEncodeError included
            reason = "a lone surrogate" if isinstance(exc, UnicodeEncodeError) else "NaN or Infinity"
            raise ValueError(f"the request cannot be forwarded as JSON: it contains {reason}") from None
        return self
