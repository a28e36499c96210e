"""Index kind ``milvus``: the vectors of a store in a Milvus collection, so that replicas
pointing at the same Milvus share them and an arm's vectors live outside the process.

Where. ``MilvusConfig.uri`` (``SCACHE_CACHE__MILVUS_URI``): a file path runs milvus-lite, the
Milvus engine embedded in this process from a local ``.db`` file (the single-machine default
and the tests; one process per file), or ``http://host:19530`` for a Milvus cluster, with
``token`` if it needs one. One collection per store (namespace, experiment, arm: every arm
and namespace its own, named by a digest of the key), with a ``scope`` field (a digest of the
conversation scope, "" for none) that a search filters on; metric inner product over the
cache's L2-normalised vectors, i.e. cosine.

What is shared, and what is not. Milvus holds only ``(entry id, scope, vector)``. The cache's
own entry metadata (query, answer, provenance, TTL, hits, votes) stays in each replica's
partition (``cache_core.store.partition``), as does a local exact twin of the vectors it
knows (a ``VectorIndex`` of kind flat), which is what the ANN-vs-exact check and the contract's
exact scans read. So:

* A search asks Milvus for more candidates than it needs, keeps those this replica has
  metadata for (an entry stored by another replica is served here once it arrived through
  the entries topic, ``cache_core.state.replication``, and was applied: until then it cannot
  be, as its answer is not here), and re-scores them exactly from the local twin, so a
  threshold always meets the true cosine. Ids unknown here only take candidate slots.
* Writes are idempotent upserts by entry id: every replica that applies an entry upserts the
  same row.
* A removal is fleet-wide: an entry evicted (each replica's LRU and capacity are its own),
  expired (each replica's sliding / adaptive TTL follows the hits it served) or invalidated on
  one replica is deleted from the collection, so the others stop finding it even though
  their metadata still holds it until their own eviction or expiry; a store on any replica
  upserts it again. Invalidations and clears reach every replica anyway; evictions and expiries
  are where replicas differ, and there the shared store follows whichever removed first.
  Replicas that must agree on capacity give the arm the same ``capacity_*`` everywhere.
* A clear deletes the ids this replica knew, not the collection: another replica may have
  stored newer entries in it since.

Failures. If a Milvus call fails, the local twin answers (exact search over what this
replica knows, as ``flat`` would) and the failure is counted (``failures``), so an
unreachable Milvus costs the shared view, not the lookup; for ``RETRY_AFTER_S`` after a
failure no call is tried (a dead server would otherwise cost every lookup a connect timeout).
Upserts and deletes that failed are kept and sent with the next call that goes through.

``pymilvus`` (and ``milvus-lite`` for file URIs) come with the ``milvus`` extra; they are
imported on the first use of the kind only.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache_core.store.faiss import IndexMark, IndexSpec, VectorIndex

log = logging.getLogger(__name__)

# Milvus returns candidates for the whole collection; ids this replica has no metadata for
# are dropped, so ask for this many more than wanted (and at least ``ann_candidates``).
EXTRA_CANDIDATES = 16
MAX_LIMIT = 16_384  # Milvus's topk ceiling
ID_MAX_LEN = 512
INDEX_TYPE_LITE = "FLAT"  # milvus-lite builds FLAT / IVF_FLAT; AUTOINDEX maps to FLAT there
RETRY_AFTER_S = 5.0
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class MilvusConfig:
    uri: str
    """A milvus-lite file path, or ``http(s)://host:port`` of a Milvus cluster."""
    token: str = ""
    index_type: str = "AUTOINDEX"
    """The collection's vector index on a cluster (milvus-lite always builds FLAT)."""
    consistency: str = "Session"
    """Search consistency level: Session reads this client's own writes; Strong also every
    other replica's (slower on a cluster); Bounded / Eventually cheaper still."""

    @property
    def is_lite(self) -> bool:
        return "://" not in self.uri


_clients: dict[tuple[str, str], object] = {}
_clients_lock = threading.Lock()
_collections: set[tuple[str, str]] = set()  # (uri, name) known to exist
_down_until: dict[str, float] = {}  # uri -> monotonic time before which no call is tried


def client(config: MilvusConfig):
    """One ``MilvusClient`` per (uri, token) in the process (milvus-lite: one embedded
    server per file)."""
    key = (config.uri, config.token)
    with _clients_lock:
        found = _clients.get(key)
        if found is None:
            from pymilvus import MilvusClient

            if config.is_lite:
                Path(config.uri).expanduser().parent.mkdir(parents=True, exist_ok=True)
            found = _clients[key] = MilvusClient(config.uri, token=config.token, timeout=CONNECT_TIMEOUT_S)
        return found


def collection_name(key: tuple[str, str, str]) -> str:
    """Milvus names are [A-Za-z_][A-Za-z0-9_]*: a digest of (namespace, experiment, arm)."""
    return "scache_" + hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:32]


def _scope_tag(scope: str | None) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:32] if scope else ""


def ensure_collection(config: MilvusConfig, name: str, dim: int) -> None:
    if (config.uri, name) in _collections:
        return
    from pymilvus import DataType, MilvusException

    milvus = client(config)
    if not milvus.has_collection(name):
        schema = milvus.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=ID_MAX_LEN)
        schema.add_field("scope", DataType.VARCHAR, max_length=64)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
        params = milvus.prepare_index_params()
        params.add_index(field_name="vec", metric_type="IP",
                         index_type=INDEX_TYPE_LITE if config.is_lite else config.index_type)
        try:
            milvus.create_collection(name, schema=schema, index_params=params,
                                     consistency_level=config.consistency)
        except MilvusException:  # another replica made it meanwhile
            if not milvus.has_collection(name):
                raise
    milvus.load_collection(name)  # one made by an earlier process starts released
    _collections.add((config.uri, name))


def drop_collection(config: MilvusConfig, key: tuple[str, str, str]) -> None:
    """Drop a store's collection (tests and benches; the cache itself never drops one)."""
    name = collection_name(key)
    milvus = client(config)
    if milvus.has_collection(name):
        milvus.drop_collection(name)
    _collections.discard((config.uri, name))


class MilvusIndex:
    """A store's vectors of one conversation scope in its Milvus collection, with a local
    exact twin (see the module docstring for what is shared). Meets ``VectorStore``."""

    def __init__(self, dim: int, spec: IndexSpec, config: MilvusConfig,
                 key: tuple[str, str, str], scope: str | None = None):
        self.dim = dim
        self.spec = spec
        self.config = config
        self.collection = collection_name(key)
        self._scope = _scope_tag(scope)
        self._filter = f'scope == "{self._scope}"'
        self._unsent: dict[str, np.ndarray] = {}  # upserts that failed, by entry id
        self._undeleted: set[str] = set()  # deletes that failed
        self._twin = VectorIndex(dim, IndexSpec(kind="flat"))
        self.failures = 0

    # -- the contract -------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return "milvus"

    def __len__(self) -> int:
        return len(self._twin)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._twin

    def add(self, entry_id: str, vec: np.ndarray) -> None:
        if len(entry_id) > ID_MAX_LEN:
            raise ValueError(f"entry id longer than {ID_MAX_LEN} characters")
        row = np.asarray(vec, dtype=np.float32).reshape(-1)
        self._twin.add(entry_id, row)
        self._undeleted.discard(entry_id)
        if self._call("upsert", self.collection, [self._row(entry_id, row)]) is None:
            self._unsent[entry_id] = row

    def add_many(self, entry_ids: list[str], vecs: np.ndarray) -> None:
        mat = np.asarray(vecs, dtype=np.float32)
        self._twin.add_many(entry_ids, mat)
        for start in range(0, len(entry_ids), 1000):
            rows = [self._row(e, v) for e, v in zip(entry_ids[start:start + 1000], mat[start:start + 1000])]
            if self._call("upsert", self.collection, rows) is None:
                self._unsent.update((row["id"], row["vec"]) for row in rows)

    def remove(self, entry_id: str) -> bool:
        if not self._twin.remove(entry_id):
            return False
        self._unsent.pop(entry_id, None)
        if self._call("delete", self.collection, ids=[entry_id]) is None:
            self._undeleted.add(entry_id)
        return True

    def discard(self) -> None:
        """The partition drops this index (a clear, or the arm left the kind): delete the
        vectors this replica knew from the collection."""
        ids = self._twin.entry_ids()
        self._unsent.clear()
        self._undeleted.update(ids)
        self._flush()
        self._twin = VectorIndex(self.dim, IndexSpec(kind="flat"))

    def search(self, vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Milvus's top candidates that this replica knows, re-scored exactly, best first."""
        if len(self) == 0 or k <= 0:
            return []
        limit = min(MAX_LIMIT, max(k, self.spec.ann_candidates) + EXTRA_CANDIDATES)
        query = np.asarray(vec, dtype=np.float32).reshape(-1)
        found = self._call("search", self.collection, [query], limit=limit, filter=self._filter,
                           output_fields=["id"], consistency_level=self.config.consistency)
        if found is None:  # Milvus failed: the local twin answers
            return self._twin.exact_search(query, k)
        known = [(hit["id"], float(hit["distance"])) for hit in found[0] if hit["id"] in self._twin]
        return self._twin.rescore(query, known, k)

    def flush(self) -> None:
        """Seal what was written into indexed segments (Milvus does it on its own past a size;
        benches call it after a bulk fill, as a warmed store would be)."""
        self._call("flush", self.collection)

    def exact_search(self, vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        return self._twin.exact_search(vec, k)

    def mark(self) -> IndexMark:
        return IndexMark(self, self._twin.mark().next_id)  # type: ignore[arg-type]

    def internal_id(self, entry_id: str) -> int | None:
        return self._twin.internal_id(entry_id)

    def exact_rows(self) -> int:
        return self._twin.exact_rows()

    def exact_block_many(self, mat: np.ndarray, start: int, stop: int, k: int,
                         before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._twin.exact_block_many(mat, start, stop, k, before=before)

    def labels(self, internal_ids) -> list[str | None]:
        return self._twin.labels(internal_ids)

    def vector(self, entry_id: str) -> np.ndarray:
        return self._twin.vector(entry_id)

    @property
    def compact_entries(self) -> bool:
        return False  # a float kind: entries keep their float32 vector

    def vectors(self, entry_ids: list[str]) -> np.ndarray:
        return self._twin.vectors(entry_ids)

    def ann_bytes_per_entry(self) -> float:
        return 0.0  # the vectors' resident cost is Milvus's, not this process's

    # -- internals --------------------------------------------------------------------

    def _row(self, entry_id: str, vec: np.ndarray) -> dict:
        return {"id": entry_id, "scope": self._scope, "vec": vec}

    def _flush(self) -> bool:
        """Send the upserts and deletes that failed before; False if Milvus still fails."""
        while self._undeleted:
            batch = list(self._undeleted)[:1000]
            if self._send("delete", self.collection, ids=batch) is None:
                return False
            self._undeleted.difference_update(batch)
        while self._unsent:
            batch = list(self._unsent.items())[:1000]
            if self._send("upsert", self.collection, [self._row(e, v) for e, v in batch]) is None:
                return False
            for entry_id, _ in batch:
                self._unsent.pop(entry_id, None)
        return True

    def _call(self, method: str, *args, **kwargs):
        """One Milvus call after what failed before; None if it failed (or Milvus is down)."""
        if (self._unsent or self._undeleted) and not self._flush():
            return None
        return self._send(method, *args, **kwargs)

    def _send(self, method: str, *args, **kwargs):
        if time.monotonic() < _down_until.get(self.config.uri, 0.0):
            self.failures += 1
            return None
        try:
            ensure_collection(self.config, self.collection, self.dim)
            return getattr(client(self.config), method)(*args, **kwargs)
        except Exception:  # noqa: BLE001 - any client or server error: counted, the twin answers
            self.failures += 1
            _down_until[self.config.uri] = time.monotonic() + RETRY_AFTER_S
            if self.failures == 1 or self.failures % 1000 == 0:
                log.exception("milvus %s on %s failed (%d failures)", method, self.collection, self.failures)
            return None
