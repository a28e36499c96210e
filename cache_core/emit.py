"""From a decided lookup to its event: ``LookupRecord`` is what the request path hands
over (plain values and references, so it builds no pydantic model); the
``EventEmitter`` finishes it in the event executor — the sampled ANN-vs-exact check,
the ``CacheEvent`` (cache_core.events), the sink (the publisher, metrics) — after the
answer has left. ``LookupRecord.result`` is what the caller gets back at once.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from cache_core.events import CacheEvent
from cache_core.publish.event_worker import InlineExecutor, PendingEvent
from cache_core.store.faiss import IndexMark
from cache_core.store.partition import Partition
from cache_core.records import CacheEntry, Candidate, LookupResult, Request, SearchOutcome
from cache_core.tracing import OFF, Tracing

# Sampled ANN checks are skipped while this many events wait to be finished.
MAX_CHECK_BACKLOG = 64

log = logging.getLogger(__name__)

EventSink = Callable[[CacheEvent], None]


def entry_snapshot(shown: Candidate | None, now: float) -> dict:
    """The event's fields about the entry served (or the nearest one)."""
    if shown is None:
        return {"entry_id": None, "entry_age_s": None, "entry_ttl_s": None, "matched_query_text": None}
    entry = shown.entry
    return {"entry_id": entry.entry_id, "entry_age_s": max(0.0, now - entry.created_at),
            "entry_ttl_s": entry.expires_at() - entry.created_at, "matched_query_text": entry.query}


@dataclass
class LookupRecord:
    """A decided lookup, as the request path hands it to the event executor."""

    req: Request
    query: str
    unit_id: str
    namespace: str
    decision: str
    threshold: float | None
    similarity: float | None
    index_kind: str
    search_ms: float
    guard: str | None
    entry: dict
    ts_ms: int
    latency_ms: float
    check: tuple[Partition, str | None, list, IndexMark | None] | None = None
    """(partition, scope, ANN answer, index mark) when this request was sampled for an ANN check."""
    check_future: Future | None = None
    """Instead of ``check``: the batched check's result to come (``AnnChecker``)."""
    similarity_mode: str = "cosine"
    score: float | None = None
    score_margin: float | None = None
    judge_version: str | None = None
    judge_probability: float | None = None
    judge_ms: float | None = None
    tier: str | None = None
    """The store tier that served the hit ("memory" / "disk"); None on a miss."""
    threshold_source: str | None = None
    feedback_requested: bool = False
    feedback_prob: float | None = None
    """The arm's feedback sample rate on a hit of an arm that samples (CacheEvent.feedback_prob)."""
    ttl_fields: dict = field(default_factory=dict)
    """Adaptive-TTL arms: the prediction and its inputs (``cache_core.adaptive_ttl.event_fields``)."""

    def result(self, pending: PendingEvent, served: CacheEntry | None = None,
               nearest: CacheEntry | None = None) -> LookupResult:
        """What the caller gets back (``served``: the entry whose answer it is, on a hit;
        ``nearest``: on a miss, the nearest candidate's entry)."""
        req = self.req
        return LookupResult(
            request_id=req.request_id, decision=self.decision, hit=served is not None,
            answer=served.answer if served else None, similarity=self.similarity,
            threshold=self.threshold, threshold_source=self.threshold_source, experiment_id=req.experiment.experiment_id, arm=req.arm_name,
            config_version=req.experiment.version, intent_cluster=req.cluster,
            entry_id=served.entry_id if served else None, pending=pending,
            provenance={"source": served.provenance_source, "version": served.provenance_version}
            if served else None, variant=req.variant, guard=self.guard,
            entry_age_s=self.entry["entry_age_s"], latency_ms=self.latency_ms,
            embed_ms=req.embed_ms, search_ms=self.search_ms, score=self.score,
            score_margin=self.score_margin, judge_version=self.judge_version,
            judge_probability=self.judge_probability, feedback_requested=self.feedback_requested,
            nearest_answer=nearest.answer if served is None and nearest is not None else None,
        )


class EventEmitter:
    """Finishes lookup records into events in ``executor`` (default: inline, in the caller)."""

    def __init__(self, *, executor=None, sink: EventSink | None = None, instance_id: str = "",
                 emit_query_text: bool = False, ann_checker=None, tracing: Tracing = OFF):
        self.executor = executor or InlineExecutor()
        self.tracing = tracing
        self.sink = sink
        self.instance_id = instance_id
        self.emit_query_text = emit_query_text
        self.ann_checker = ann_checker

    def hand_off(self, record: LookupRecord) -> PendingEvent:
        pending = PendingEvent()
        parent = self.tracing.capture()  # the publish span joins the request's trace from the event thread
        self.executor.submit(lambda: self._finish(record, pending, parent))
        return pending

    def backlog(self) -> int:
        backlog = getattr(self.executor, "backlog", None)
        return 0 if backlog is None else backlog()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event handed to the executor so far has been emitted."""
        flush = getattr(self.executor, "flush", None)
        return True if flush is None else flush(timeout_s)

    def _finish(self, record: LookupRecord, pending: PendingEvent, parent=None) -> None:
        """Run the sampled ANN check (if any), build the event, emit it (executor side)."""
        outcome = SearchOutcome(best=None)
        if record.check is not None:
            partition, scope, raw, mark = record.check
            try:
                outcome = partition.ann_check(record.req.vec, scope, raw, mark)
            except Exception:  # a failed check must not cost the event; it stays unchecked
                log.exception("ANN check failed", extra={"request_id": record.req.request_id})
        elif record.check_future is not None:
            # Events leave in order, so this wait holds the ones behind it: past half the
            # backlog at which sampling stops, the batch runs now rather than at its deadline.
            outcome = self.ann_checker.wait(
                record.check_future, hurry=lambda: self.backlog() >= MAX_CHECK_BACKLOG // 2) or outcome
        event = self.event(record, outcome)
        pending.set(event)
        if self.sink is not None:
            with self.tracing.span("scache.publish", {"scache.request_id": event.request_id}, parent=parent):
                self.sink(event)

    def event(self, record: LookupRecord, outcome: SearchOutcome) -> CacheEvent:
        req = record.req
        entry = dict(record.entry)
        matched_query = entry.pop("matched_query_text", None)
        return CacheEvent(
            request_id=req.request_id, ts_ms=record.ts_ms, instance_id=self.instance_id,
            namespace=record.namespace, experiment_id=req.experiment.experiment_id,
            arm=req.arm_name, unit_id=record.unit_id, assignment_prob=req.assignment_prob,
            partition_mode=req.experiment.partition_mode, config_version=req.experiment.version,
            variant=req.variant, guard=record.guard, decision=record.decision,
            hit=record.decision == "hit", feedback_requested=record.feedback_requested,
            feedback_prob=record.feedback_prob, threshold=record.threshold,
            threshold_source=record.threshold_source, similarity=record.similarity,
            similarity_mode=record.similarity_mode, score=record.score,
            score_margin=record.score_margin, judge_version=record.judge_version,
            judge_probability=record.judge_probability, judge_ms=record.judge_ms,
            intent_cluster=req.cluster, embedding_l2_norm=req.l2_norm, **entry, **record.ttl_fields,
            index_kind=record.index_kind, tier=record.tier, ann_checked=outcome.ann_checked,
            ann_agree=outcome.ann_agree, ann_recall_at_k=outcome.ann_recall_at_k,
            embed_ms=req.embed_ms, embed_cached=req.embed_cached, embed_saved_ms=req.embed_saved_ms,
            search_ms=record.search_ms, latency_ms=record.latency_ms,
            query_chars=len(record.query),
            query_text=record.query if self.emit_query_text else None,
            matched_query_text=matched_query if self.emit_query_text else None,
        )
