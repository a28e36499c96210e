"""The cache's record types: what is stored (``CacheEntry``), what a lookup or a store
answers (``LookupResult``, ``StoreResult``), what a search finds (``Candidate``,
``SearchOutcome``), what a caller asks to store or purge (``StoreItem``, ``EntryMatch``),
and the error for input the cache refuses (``InvalidRequest``).

Plain dataclasses, so the request path builds no pydantic model; the versioned event
schema that leaves the process is ``cache_core.events``.
"""
from __future__ import annotations

import struct
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cache_core.ids import new_id
from cache_core.publish.event_worker import PendingEvent
from cache_core.events import CacheEvent
from cache_core.experiments import ExperimentConfig, TtlPolicy, Variant

if TYPE_CHECKING:
    from cache_core.store.faiss import IndexMark

ENTRY_OVERHEAD_BYTES = 256


class InvalidRequest(ValueError):
    """Input the cache refuses (the service answers 4xx with this message)."""


NO_UNITS: frozenset[str] = frozenset()


@dataclass(slots=True)
class CacheEntry:
    """One cached question/answer pair and its lifetime bookkeeping.

    Slotted, with no per-entry empty set: a store holds up to millions of these, and a
    ``__dict__`` plus an empty ``set()`` each cost 272 B of the 488 B an entry's record took
    (tracemalloc, 10^5 entries; ``bench/index_kinds.py --cache`` measures the whole cache).
    ``query`` and ``answer`` are kept as one UTF-8 ``bytes`` (``pack_texts``) and decoded
    on read: one object header instead of two, one byte per character whatever the script
    (a ``str`` with one non-Latin-1 character takes 2 or 4 B for every character)."""

    entry_id: str
    query: InitVar[str]
    embedding: np.ndarray | None
    """The L2-normalised float32 query vector, or None while a store of a compressed or hashed
    kind holds the entry: that store keeps the only copy (fp16 or its codes) and gives it back,
    decoded, to whatever needs it (``Partition.vector_of``; a removed or demoted entry gets it
    back). Float kinds (flat, ivf, hnsw, milvus) keep it here."""
    answer: InitVar[str]
    created_at: float
    ttl_s: float
    ttl_policy: TtlPolicy
    max_age_s: float
    namespace: str
    intent_cluster: int
    scope: str | None = None
    provenance_source: str = ""
    provenance_version: str = ""
    last_hit_at: float | None = None
    hit_count: int = 0
    grace_s: float = 0.0
    """Extra lifetime for near-duplicate admissions (eviction delayed)."""
    protected: bool = False
    """LRU passes over it while alive (near-duplicate tier)."""
    approx_bytes: int = 0
    wrong_units: frozenset[str] = NO_UNITS
    """Units whose hits on it got a "wrong" verdict, on any replica (votes travel the entries topic);
    persisted in the snapshot and the log (cache_core.state.feedback). Immutable, shared while
    empty: a vote replaces it (``Partition.vote``)."""

    ttl_context: object | None = None
    """adaptive: the ``cache_core.adaptive_ttl.TtlContext`` its ttl_s was predicted from (not persisted)."""
    texts: bytes = field(init=False, repr=False, default=b"")
    """``query`` and ``answer`` packed (``pack_texts``); read them through the properties."""

    def __post_init__(self, query: str, answer: str) -> None:
        self.texts = pack_texts(query, answer)

    def expires_at(self) -> float:
        """When this entry stops being served, by its ttl policy (cache_core.lifetime)."""
        lifetime = self.ttl_s + self.grace_s
        if self.ttl_policy in ("sliding", "adaptive"):
            renewed = (self.last_hit_at or self.created_at) + lifetime
            return min(renewed, self.created_at + self.max_age_s)
        return self.created_at + lifetime

    def alive(self, now: float) -> bool:
        return now < self.expires_at()


_QUERY_LEN = struct.Struct("<I")


def pack_texts(query: str, answer: str) -> bytes:
    """One ``bytes`` for both texts: the query's UTF-8 length (4 B), its UTF-8, the answer's."""
    head = query.encode()
    return _QUERY_LEN.pack(len(head)) + head + answer.encode()


def _query(entry: CacheEntry) -> str:
    texts = entry.texts
    return texts[4:4 + _QUERY_LEN.unpack_from(texts)[0]].decode()


def _answer(entry: CacheEntry) -> str:
    texts = entry.texts
    return texts[4 + _QUERY_LEN.unpack_from(texts)[0]:].decode()


# Set after the class is made: in its body the names are the constructor's InitVars (a
# property there would be taken for their default value).
CacheEntry.query = property(_query, doc="The question as stored (decoded from ``texts``).")  # type: ignore[assignment]
CacheEntry.answer = property(_answer, doc="The answer as stored (decoded from ``texts``).")  # type: ignore[assignment]


@dataclass
class LookupResult:
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
    pending: PendingEvent
    """The request's event, finished by the cache's event executor (see ``event``)."""
    provenance: dict[str, str] | None = None
    variant: str = "base"
    guard: str | None = None
    """The lexical guard that turned a would-be hit into this miss."""
    entry_age_s: float | None = None
    latency_ms: float = 0.0
    embed_ms: float = 0.0
    search_ms: float = 0.0
    score: float | None = None
    """Multi arms: the best-ranked candidate's mixed score (CacheEvent.score)."""
    score_margin: float | None = None
    """Multi arms: its lead over the best candidate with another answer (CacheEvent.score_margin)."""
    judge_version: str | None = None
    """The judge that decided (None: no judge on this arm)."""
    judge_probability: float | None = None
    """Its probability for the most probable candidate (CacheEvent.judge_probability)."""
    threshold_source: str | None = None
    """Error-bounded arms: which level learnt ``threshold`` (CacheEvent.threshold_source)."""
    feedback_requested: bool = False
    """Ask the user whether this hit was right (CacheEvent.feedback_requested)."""
    nearest_answer: str | None = None
    """On a miss: the answer of the nearest candidate (the one ``similarity`` is about), for a
    shadow check of a near-miss (``cache_core.shadow``); None on a hit (``answer`` is it)."""

    @property
    def event(self) -> CacheEvent:
        """The complete event (waits if a background executor has not finished it yet)."""
        return self.pending.result()


@dataclass(frozen=True)
class EntryMatch:
    """Which entries a purge removes: those of a provenance source (and, if given, version),
    or those stored for one question (same text as stored), or both conditions at once."""

    provenance_source: str | None = None
    provenance_version: str | None = None
    query: str | None = None

    def __post_init__(self):
        if self.provenance_version is not None and not self.provenance_source:
            raise InvalidRequest("provenance_version needs provenance_source")
        if not self.provenance_source and not self.query:
            raise InvalidRequest("a purge needs provenance_source or query (DELETE the namespace to clear it all)")

    def matches(self, entry: CacheEntry) -> bool:
        if self.provenance_source and entry.provenance_source != self.provenance_source:
            return False
        if self.provenance_version is not None and entry.provenance_version != self.provenance_version:
            return False
        return not self.query or text_key(entry.query) == text_key(self.query)


@dataclass(frozen=True)
class StoreItem:
    """One answer to store (``SemanticCache.store_many``)."""

    query: str
    answer: str
    unit_id: str
    experiment_id: str | None = None
    namespace: str = "default"
    scope: str | None = None
    ttl_s: float | None = None
    provenance_source: str = ""
    provenance_version: str = ""


@dataclass
class StoreResult:
    stored: bool
    reason: str
    """admitted | near_duplicate | updated | holdout | novel_under_pressure | too_large"""
    experiment_id: str
    arm: str
    config_version: int
    entry_id: str | None = None
    similarity: float | None = None
    """Similarity to the nearest live entry (the admission tier's input)."""
    intent_cluster: int = -1


def text_key(query: str) -> str:
    """The form two query texts are compared in (whitespace runs and case ignored)."""
    return " ".join(query.split()).casefold()


def entry_bytes(query: str, answer: str, embedding: np.ndarray) -> int:
    """What an entry is charged against its store's capacity_bytes."""
    # Embedding counted twice: a float kind's entry keeps one and its index another. The compressed kinds
    # hold far less (no copy on the entry, fp16 or only their codes in the index, cache_core.store.reference)
    # but are charged the same, so that a capacity_bytes holds as many entries on every arm of an experiment.
    return len(query.encode()) + len(answer.encode()) + 2 * embedding.nbytes + ENTRY_OVERHEAD_BYTES


@dataclass
class Candidate:
    entry: CacheEntry
    similarity: float
    tier: str = "memory"
    """Where the entry was found: "memory", or "disk" (cache_core.store.disk_tier; promoted on a hit)."""


@dataclass
class SearchOutcome:
    best: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    """Every live candidate found, best first (``best`` is the first)."""
    ann_checked: bool = False
    ann_agree: bool | None = None
    ann_recall_at_k: float | None = None
    raw: list[tuple[str, float]] = field(default_factory=list)
    """What the ANN structure returned (before dropping expired entries)."""
    mark: IndexMark | None = None
    """The index as the search left it: what a later ANN check compares with."""
    expired: list[Candidate] = field(default_factory=list)
    """Candidates the search met expired (and removed): an adaptive TTL learns from them."""


@dataclass
class Request:
    """What every decision needs: the experiment snapshot, the unit's arm, the embedding."""

    experiment: ExperimentConfig
    arm_name: str
    assignment_prob: float
    vec: np.ndarray
    l2_norm: float
    cluster: int
    embed_ms: float
    started: float
    """perf_counter() when the request arrived."""
    variant: Variant = "base"
    request_id: str = field(default_factory=new_id)
    embed_cached: bool = False
    """The embedding came from the embedding cache (the encoder did not run)."""
    embed_saved_ms: float = 0.0
