"""``POST /v1/feedback``: a verdict on an answer served, published for the attribution job and
applied here (a "wrong" hit is taken out of service; the other replicas follow the topic)."""
from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from cache_core.events import FeedbackEvent
from cache_core.service.auth import CallerDep
from cache_core.service.deps import CacheDep, MetricsDep, PublisherDep
from cache_core.service.schemas import FeedbackRequest

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/feedback", status_code=202)
def feedback(body: FeedbackRequest, cache: CacheDep, metrics: MetricsDep, publisher: PublisherDep,
             caller: CallerDep):
    """Needs the feedback (or write) right."""
    caller.require_right("feedback")
    event = FeedbackEvent(request_id=body.request_id, verdict=body.verdict, source=body.source)
    try:
        publisher.publish_feedback(event)
    except Exception:  # e.g. publisher closed during shutdown
        log.exception("publish_feedback failed", extra={"request_id": body.request_id})
        return JSONResponse(status_code=503, content={"detail": "feedback could not be queued"})
    metrics.feedback.labels(body.verdict).inc()
    cache.learn(body.request_id, body.verdict)  # error-bounded arms learn from user and shadow verdicts alike
    if body.source != "user":  # a shadow verdict measures; only users take entries out of service
        return {"accepted": True, "request_id": body.request_id, "outcome": "not_applied"}
    # A hit served here is settled now; the others' hits through their feedback followers.
    outcome = cache.apply_feedback(body.request_id, body.verdict)
    return {"accepted": True, "request_id": body.request_id, "outcome": outcome}
