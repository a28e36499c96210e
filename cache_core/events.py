"""The one versioned schema of everything scache streams through Kafka.

Producer (cache_core.publish.publisher), Flink job (jobs/) and tests import these models;
the Flink source DDL and the ClickHouse raw-events columns are derived from them
(``flink_columns`` / ``clickhouse_columns``), and a unit test checks that the
ClickHouse migration agrees. Bump ``SCHEMA_VERSION`` on any incompatible change.
"""
from __future__ import annotations

import time
import types
from datetime import datetime
import typing
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator, model_validator

from cache_core.experiments import ExperimentConfig, SimilarityKind

SCHEMA_VERSION = 1

EventType = Literal["decision", "heartbeat"]
Decision = Literal["hit", "miss", "bypass", "none"]
Verdict = Literal["correct", "wrong"]
FeedbackSource = Literal["user", "shadow"]
"""Who gave a verdict: a user (``POST /v1/feedback``), or a shadow check (``cache_core.shadow``: the
upstream model asked again in the background and its answer compared with the cached one). The
warehouse keeps them apart: a shadow verdict is an estimate of the false-hit rate, not a user's word."""


def now_ms() -> int:
    return int(time.time() * 1000)


class CacheEvent(BaseModel):
    """One cache decision (or a watermark heartbeat), as produced to the events topic."""

    schema_version: int = SCHEMA_VERSION
    event_type: EventType = "decision"
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """Unique per request; feedback refers to it."""
    ts_ms: int = Field(default_factory=now_ms)
    """Event time: when the decision was made (epoch milliseconds, UTC)."""
    instance_id: str = ""
    """Which cache process decided."""
    namespace: str = "default"
    """Tenant; entries never cross namespaces."""
    experiment_id: str = ""
    arm: str = ""
    unit_id: str = ""
    """The randomisation unit (user, session, tenant) the arm was chosen for."""
    assignment_prob: float = 1.0
    """Probability of this arm for a random unit, for reweighting analyses."""
    partition_mode: str = "partitioned"
    config_version: int = 0
    variant: str = "base"
    """"canary" when the unit is in the arm's canary share (see ArmConfig.canary)."""
    decision: Decision = "none"
    bypass_reason: str | None = None
    """Why a "bypass" did not use the cache: the chat proxy's field policy ("tools", "n", "logprobs",
    "audio", "web_search", "no_text"; docs/proxy.md); null for a holdout arm's bypass and the others."""
    hit: bool = False
    feedback_requested: bool = False
    """The service asked the user for a verdict on this hit (a random draw at ``feedback_prob``;
    docs/solicited_feedback.md): such verdicts are a designed sample, weighed 1 / feedback_prob."""
    feedback_prob: float | None = None
    """The arm's ``feedback_sample_rate`` on every hit of an arm that samples (requested or not);
    null on misses and on arms that never ask."""
    threshold: float | None = None
    threshold_source: str | None = None
    """Arms with an error-bounded threshold policy (cache_core.decision.error_bound): which level
    learnt ``threshold`` ("entry", "cluster", "arm") or "static" (too few verdicts yet: the arm's
    configured one). Null on arms with a global threshold."""
    similarity: float | None = None
    """Top-1 similarity, logged on hits and misses alike (null if the index was empty)."""
    similarity_mode: SimilarityKind = "cosine"
    """How the arm ranks candidates (ArmConfig.similarity); "cosine" for bypasses and heartbeats."""
    score: float | None = None
    """"multi" arms: the mixed score (cache_core.decision.rerank) of the best-ranked candidate at
    or above the cosine threshold, logged on hits and misses alike, so another mixed-score
    threshold can be evaluated offline. Null on cosine arms and when no candidate passed
    the cosine threshold. If a guard vetoes that candidate and a later one is served, this
    stays the best-ranked one's score (whether it passes decides for all the others)."""
    score_margin: float | None = None
    """"multi" arms: ``score`` minus the best score of a candidate (past the cosine threshold)
    with a different answer, i.e. what MultiSimilarityConfig.answer_margin is compared with.
    Null when there is no such rival."""
    intent_cluster: int = -1
    embedding_l2_norm: float | None = None
    entry_id: str | None = None
    entry_age_s: float | None = None
    entry_ttl_s: float | None = None
    ttl_predicted_s: float | None = None
    """Adaptive-TTL arms (cache_core.lifetime): the lifetime the policy predicted on this
    decision, the served entry's renewed TTL on a hit, a new entry's on a miss (what the
    reply stored for it gets, in the same context). Null on other arms and bypasses."""
    ttl_rate_volatility: float | None = None
    """Adaptive-TTL input: coefficient of variation of the store's recent request rate."""
    ttl_hit_trend: float | None = None
    """Adaptive-TTL input: the store's recent hit rate minus its longer-run hit rate."""
    ttl_memory_pressure: float | None = None
    """Adaptive-TTL input: the store's fill, the fuller of entries and bytes against capacity."""
    ttl_entry_hits: int | None = None
    """Adaptive-TTL input: the served entry's hits including this one (0 on a miss)."""
    index_kind: str = ""
    tier: str | None = None
    """The store tier that served a hit: "memory", or "disk" (the arm's disk tier,
    cache_core.store.disk_tier: the entry was promoted); null on misses."""
    ann_checked: bool = False
    """Whether exact search was also run for this request to measure ANN precision."""
    ann_agree: bool | None = None
    ann_recall_at_k: float | None = None
    guard: str | None = None
    """Name of the lexical guard that turned a would-be hit into a miss ("judge" when the arm's
    judge found no candidate good enough, "judge_unavailable" when it could not be loaded)."""
    judge_version: str | None = None
    """The judge that decided (ArmConfig.judge.version); null on arms without one."""
    judge_probability: float | None = None
    """The judge's probability for its most probable candidate, served or not: another
    operating point can be evaluated offline from it, as a threshold from ``similarity``."""
    judge_ms: float | None = None
    """Time the judge added to the lookup."""
    embed_ms: float = 0.0
    embed_cached: bool = False
    """The query's embedding came from the embedding cache (exact text seen before): the
    encoder did not run."""
    embed_saved_ms: float = 0.0
    """On an embedding-cache hit, the encode time it saved (the recent mean per text); else 0."""
    search_ms: float = 0.0
    latency_ms: float = 0.0
    query_chars: int = 0
    query_text: str | None = None
    """Raw query, only when settings allow it to leave the process."""
    matched_query_text: str | None = None
    """The cached question of the entry served (or the nearest one), under the same setting:
    with ``query_text`` and a verdict it makes a labelled pair for ``judge_train --warehouse``."""

    def kafka_key(self) -> bytes:
        # Keyed by unit so one unit's events stay ordered within a partition.
        return (self.unit_id or self.request_id).encode()


class FeedbackEvent(BaseModel):
    """A verdict on a served answer, produced to the feedback topic."""

    schema_version: int = SCHEMA_VERSION
    request_id: str = Field(min_length=1, max_length=128)
    verdict: Verdict
    ts_ms: int = Field(default_factory=now_ms)
    source: FeedbackSource = "user"
    """"shadow" verdicts may also judge a miss (a near-miss: would the nearest candidate's answer,
    whose similarity the miss's event carries, have been right?); a user's only judge hits."""

    def kafka_key(self) -> bytes:
        return self.request_id.encode()


class ControlMessage(BaseModel):
    """A full experiment config. Published by ``cache_core.publish.control_topic.publish_control``
    under a key unique per message (``control_key``), so compaction keeps every change
    and the fold (``cache_core.registry.ControlFold``) decides which one is in force.
    Closed like the config it carries: an unknown field makes the record malformed."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["experiment"] = "experiment"
    experiment: ExperimentConfig
    actor: str = "unknown"
    reason: str = ""
    ts_ms: int = Field(default_factory=now_ms)


class PurgeMatch(BaseModel):
    """What a purge removes (``cache_core.records.EntryMatch``), on the entries topic."""

    provenance_source: str | None = None
    provenance_version: str | None = None
    query: str | None = None


class WrongVote(BaseModel):
    """A unit's "wrong" verdict on an entry (cache_core.state.feedback), on the entries topic, so every
    replica counts it toward the entry's removal."""

    unit_id: str = Field(min_length=1)
    arm: str = Field(min_length=1)
    """The arm that served the hit: its ``invalidate_after_wrong`` is the limit (a shared store
    serves several arms)."""


class JudgedLookup(BaseModel):
    """A verdict on the entry a lookup of an error-bounded arm served or found nearest
    (cache_core.decision.error_bound.Judged), on the entries topic, so every replica learns
    the same thresholds. The entry is the message's ``entry_id``, its experiment ``experiment_id``."""

    arm: str = Field(min_length=1)
    cluster: int
    """The entry's intent cluster."""
    similarity: float = Field(ge=-1.01, le=1.01, allow_inf_nan=False)
    wrong: bool
    check_prob: float = Field(1.0, gt=0.0, le=1.0)
    """The rate the lookup was checked at (its verdict weighs the inverse)."""
    audit: list[FiniteFloat] | None = Field(None, max_length=3)
    """The audit's reading by the replica that made the lookup: [margin, edge, depth], or [] for
    none (error_bound.Judged.audit); absent from a replica before it (the receiver measures)."""

    @field_validator("audit")
    @classmethod
    def _three_or_none(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and len(value) not in (0, 3):
            raise ValueError("audit is [margin, edge, depth] or []")
        return value


class ClusterModelPayload(BaseModel):
    """A retrained intent-cluster model (``cache_core.clusters.ClusterModel``) on the entries topic,
    or the model in use re-sent so the topic keeps it (a refresh, see cache_core.clusters)."""

    generation: int = Field(ge=0)
    """0 only in a refresh before any retrain."""
    trained_at_ms: int
    ids: list[int]
    counts: list[int]
    centroids: str
    """Row-major, one row per id: base64 of little-endian float32."""
    model_origin: str | None = None
    """The replica that trained the model when another one re-sends it ("" before any retrain);
    None: the sender (``origin``)."""
    opened_at_ms: dict[int, int] = {}
    """Open times of the clusters opened after ``trained_at_ms``."""
    merged_ids: dict[int, int] = {}
    """Loser -> survivor, as the sender knows them."""


CLUSTERS_KEY = b"~clusters"  # one key: every replica reads cluster changes in one order
ENTRY_MESSAGE_MAX_BYTES = 8 * 1024 * 1024
"""The entries topic's max.message.bytes and the producer's request size: a retrained model of
1,024 clusters x 384 floats is about 2 MB in base64."""


class EntryMessage(BaseModel):
    """One change to a cache replica's entries or intent clusters, produced to the entries
    topic for the other replicas to apply (``cache_core.state.replication``). Entry changes are
    keyed by namespace, so one namespace's changes stay in order; a clear removes what was
    created before it, on every replica. Cluster changes share one key.

    New changes are added without bumping ``SCHEMA_VERSION`` (they are additive): a replica
    that predates one fails to parse it, counts it ``malformed``, logs it and reads on (so a
    replica from before "vote" keeps counting only its own verdicts, as it always did)."""

    schema_version: int = SCHEMA_VERSION
    change: Literal["put", "clear", "purge", "drop", "vote", "judged", "cluster", "clusters"]
    """put: an entry stored; clear: a namespace cleared; purge: a namespace's entries of one
    provenance source (and version) or one question removed (``purge``); drop: an entry taken
    out of service by feedback (``entry_id``); vote: a unit's "wrong" verdict on an entry that stays
    in service for now (``entry_id``, ``vote``); judged: a verdict an error-bounded arm learns
    from (``entry_id``, ``judged``); cluster: an intent cluster opened (``cluster_id``, centroid in
    ``embedding``); clusters: a retrained model (``clusters``)."""
    origin: str = Field(min_length=1)
    """Instance id of the replica that made the change."""
    ts_ms: int = Field(default_factory=now_ms)
    """When the change was made; a clear removes entries created before it. For clusters, when the
    model was sent: replicas re-send it when the newest copy on the topic grows old."""
    namespace: str = ""
    experiment_id: str = ""
    arm_key: str = ""
    """The store an entry belongs to: its arm, or "*" when the experiment's arms share one."""
    model: str = ""
    """Encoder that made the vectors; a replica on another model skips the change."""
    entry: dict[str, Any] | None = None
    """put: the entry's fields as persisted (``cache_core.state.persistence.entry_meta``)."""
    embedding: str | None = None
    """put: the L2-normalised embedding; cluster: the centroid (base64 of little-endian float32)."""
    entry_id: str | None = None
    purge: PurgeMatch | None = None
    vote: WrongVote | None = None
    judged: JudgedLookup | None = None
    cluster_id: int | None = None
    clusters: ClusterModelPayload | None = None

    @model_validator(mode="after")
    def _carries_what_its_change_needs(self) -> "EntryMessage":
        complete, needs = {
            "put": (self.entry is not None and self.embedding and self.experiment_id and self.arm_key
                    and self.namespace, "namespace, experiment_id, arm_key, entry and embedding"),
            "clear": (self.namespace, "a namespace"),
            "purge": (self.namespace and self.purge is not None, "a namespace and purge"),
            "drop": (self.entry_id and self.experiment_id and self.arm_key and self.namespace,
                     "namespace, experiment_id, arm_key and entry_id"),
            "vote": (self.entry_id and self.experiment_id and self.arm_key and self.namespace
                     and self.vote is not None, "namespace, experiment_id, arm_key, entry_id and vote"),
            "judged": (self.entry_id and self.experiment_id and self.judged is not None,
                       "experiment_id, entry_id and judged"),
            "cluster": (self.cluster_id is not None and self.embedding, "cluster_id and embedding"),
            "clusters": (self.clusters is not None, "clusters"),
        }[self.change]
        if not complete:
            raise ValueError(f"a {self.change} needs {needs}")
        return self

    def kafka_key(self) -> bytes:
        return CLUSTERS_KEY if self.change in ("cluster", "clusters") else self.namespace.encode()


class WindowAggregate(BaseModel):
    """One row of the attribution job's output: an event-time window x dimensions.

    Written by jobs/attribution_job.py to ClickHouse (ReplacingMergeTree keyed by
    the dimensions, so a window re-sent after a restart replaces, never doubles).
    """

    window_start: datetime
    window_end: datetime
    experiment_id: str
    arm: str
    variant: str = "base"
    """"canary" or "base" (CacheEvent.variant), so a canary is separable from its arm."""
    namespace: str
    config_version: int
    intent_cluster: int
    index_kind: str
    lifetime_bucket: str
    """fresh / mid / late / expired / none (see udfs.buckets.lifetime_bucket)."""
    requests: int
    hits: int
    disk_hits: int = 0
    """Hits the disk tier served (CacheEvent.tier "disk"); the rest of ``hits`` came from
    memory (a hit logged before the tier was, migration 0010, counts as memory)."""
    decayed_hits: float
    """Sum over hits of udfs.decay.sim_decay(similarity, entry_age_s)."""
    similarity_sum: float
    similarity_count: int
    ann_checks: int
    ann_agreements: int
    guard_blocks: int
    latency_sum_ms: float
    latency_hist: list[int]
    """Counts per bucket of udfs.buckets.LATENCY_BOUNDS_MS (last bucket: above all)."""
    emitted_at_ms: int
    """Version for ReplacingMergeTree: the latest emission of a window wins."""


class FeedbackAggregate(BaseModel):
    """One row of ``feedback_agg``: labelled hits per feedback event-time window x the
    dimensions of the decision the feedback was joined to (by request_id).

    False-hit rate over a range = sum(wrong) / sum(correct + wrong). ReplacingMergeTree
    keyed by the dimensions with ``emitted_at_ms`` as version: the latest emission wins.
    """

    window_start: datetime
    window_end: datetime
    experiment_id: str
    arm: str
    variant: str
    namespace: str
    config_version: int
    intent_cluster: int
    source: str = "user"
    """Whose verdicts: "user" or "shadow" (FeedbackSource), counted apart."""
    correct: int
    wrong: int
    emitted_at_ms: int


class LateEventCount(BaseModel):
    """One row of ``late_events``: decisions that arrived later than the allowed lateness
    (their window had already been finalised), counted per window, experiment and arm."""

    window_start: datetime
    window_end: datetime
    experiment_id: str
    arm: str
    late_count: int
    emitted_at_ms: int


# -- derived column lists -------------------------------------------------------------

_FLINK_TYPES = {
    int: "BIGINT", float: "DOUBLE", str: "STRING", bool: "BOOLEAN",
    datetime: "TIMESTAMP_LTZ(3)", list: "ARRAY<BIGINT>",
}
_CLICKHOUSE_TYPES = {
    int: "Int64", float: "Float64", str: "String", bool: "Bool",
    datetime: "DateTime64(3, 'UTC')", list: "Array(Int64)",
}


def _base_type(annotation: object) -> tuple[type, bool]:
    """(python scalar type, nullable) for a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])[0], True
    if origin is Literal:
        return type(typing.get_args(annotation)[0]), False
    if origin is list:
        return list, False
    return typing.cast(type, annotation), False


def flink_columns(model: type[BaseModel] = CacheEvent) -> list[tuple[str, str]]:
    """(name, Flink SQL type) for each field, in schema order."""
    cols = []
    for name, info in model.model_fields.items():
        base, _ = _base_type(info.annotation)
        cols.append((name, _FLINK_TYPES[base]))
    return cols


def clickhouse_columns(model: type[BaseModel] = CacheEvent) -> list[tuple[str, str]]:
    """(name, ClickHouse type) for each field, in schema order."""
    cols = []
    for name, info in model.model_fields.items():
        base, nullable = _base_type(info.annotation)
        ch = _CLICKHOUSE_TYPES[base]
        cols.append((name, f"Nullable({ch})" if nullable else ch))
    return cols
