"""Partition: one store of the cache — its entries in LRU order, one vector index per
conversation scope (cache_core.store.faiss), the reference's stepped scans for ANN
checks, and its capacity (entries and bytes) with LRU eviction.

Vectors: an entry of a float kind keeps its float32 embedding; one of a compressed or hashed
kind (``VectorStore.compact_entries``) drops it once indexed, and ``vector_of`` / ``vectors_of``
read it back from the index (snapshots, re-layouts; ``remove(with_vector=True)`` for a
demotion to disk or an expiry's ghost).

Which partition a request reads and writes (per arm, or shared by an experiment's arms)
is cache_core.store.stores'; admission tiers are cache_core.admission's.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from itertools import islice

import numpy as np

from cache_core.store.base import VectorStore
from cache_core.store.disk_tier import DiskTier, file_for
from cache_core.store.factory import Backends, discard, new_index
from cache_core.store.faiss import IndexMark, IndexSpec
from cache_core.records import CacheEntry, Candidate, SearchOutcome, text_key

SEARCH_K = 5
# How far from the LRU end eviction looks for an unprotected / expired victim.
EVICTION_SCAN = 64
# The background ANN check scans the reference in steps of EXACT_BLOCK_ROWS rows,
# releasing the partition lock in between (about 0.2 ms per step with 384 dimensions).
# A batch of checks multiplies at most EXACT_BLOCK_CELLS query x row pairs per step
# (16 queries: 2048 rows, 64: 512), so its lock hold stays about 1 ms (10^5 x 384, one
# thread: a full pass costs ~25 ms for 1 query, ~45 ms for 8, ~150 ms for 64), and a
# step never goes under EXACT_BLOCK_MIN_ROWS rows.
EXACT_BLOCK_ROWS = 2048
EXACT_BLOCK_CELLS = EXACT_BLOCK_ROWS * 16
EXACT_BLOCK_MIN_ROWS = 256


def _ranked(index: VectorStore, scores: list[np.ndarray], ids: list[np.ndarray],
            k: int) -> list[list[tuple[str, float]]]:
    """Per query, (entry_id, score) best first from the blocks' top-k of a batched scan;
    like ``exact_block_many``, an id that is no longer live is left out."""
    if not scores:
        return []
    scores_all, ids_all = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    out = []
    for row_scores, row_ids in zip(scores_all, ids_all):
        order = np.argsort(-row_scores, kind="stable")[:k]
        names = index.labels(row_ids[order])
        out.append([(name, float(row_scores[i])) for name, i in zip(names, order)
                    if name is not None and np.isfinite(row_scores[i])])  # -inf: masked out
    return out


def ann_agreement(raw: list[tuple[str, float]], exact: list[tuple[str, float]]) -> SearchOutcome:
    """ANN top-k vs exact top-k: top-1 agreement and recall@k (empty exact: not checked)."""
    if not exact:
        return SearchOutcome(best=None)
    # Equal scores may come back in either order: a tie counts as agreement.
    agree = bool(raw) and (raw[0][0] == exact[0][0] or abs(raw[0][1] - exact[0][1]) < 1e-6)
    recall = len({e for e, _ in raw} & {e for e, _ in exact}) / len(exact)
    return SearchOutcome(best=None, ann_checked=True, ann_agree=agree, ann_recall_at_k=recall)


def _compare_since(index: VectorStore | None, raw: list[tuple[str, float]],
                   exact: list[tuple[str, float]], mark: IndexMark | None) -> SearchOutcome:
    """``ann_agreement`` on the entries present both at the lookup (``mark``) and now.
    Each raw entry gone since takes one slot off the exact list too, so that the next
    exact entry does not count as one the index missed."""
    if mark is None:
        return ann_agreement(raw, exact)
    if index is not mark.index:  # the arm changed index structure: nothing to compare with
        return SearchOutcome(best=None)

    def present(entry_id: str) -> bool:
        internal = index.internal_id(entry_id)
        return internal is not None and internal < mark.next_id

    kept_raw = [r for r in raw if present(r[0])]
    if raw and not kept_raw:  # all the lookup saw has gone since: nothing left to judge it by
        return SearchOutcome(best=None)
    kept_exact = [e for e in exact if present(e[0])]
    slots = max(len(kept_exact) - (len(raw) - len(kept_raw)), 1)
    return ann_agreement(kept_raw, kept_exact[:slots])


# A slot keeps 60 bits of the hash: an int under 2^60 is a 32 B object, one of 64 bits 48 B
# (CPython's 30-bit digits in 16-byte size classes), and ``by_text`` holds one per entry.
# Collisions stay ~2^-60 per pair (a miss of "the same question", never a wrong entry).
_TEXT_SLOT_MASK = (1 << 60) - 1


def _text_slot(scope: str | None, key: str) -> int:
    """``by_text``'s key for a scope and a ``text_key``: a hash (this process's), checked on use."""
    return hash((scope or "", key)) & _TEXT_SLOT_MASK


def default_disk_dir():
    """Where a disk tier lives when no directory was configured (a cache built without
    ``Backends``, as tests build one): a directory of this process, gone with it."""
    global _DEFAULT_DISK_DIR
    if _DEFAULT_DISK_DIR is None:
        import tempfile

        _DEFAULT_DISK_DIR = tempfile.mkdtemp(prefix="scache-disk-tier-")
    return _DEFAULT_DISK_DIR


_DEFAULT_DISK_DIR = None


class Partition:
    """One store: its entries in LRU order, one vector index per conversation scope,
    and its capacity. All methods take the partition lock."""

    def __init__(self, key: tuple[str, str, str], dim: int, spec: IndexSpec,
                 capacity_entries: int, capacity_bytes: int, backends: Backends | None = None):
        self.key = key
        self.backends = backends
        """Where out-of-process index kinds (``milvus``) keep their vectors."""
        self.dim = dim
        self.spec = spec
        self.capacity_entries = capacity_entries
        self.capacity_bytes = capacity_bytes
        self.lock = threading.RLock()
        self.entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self.indexes: dict[str, VectorStore] = {}
        self.by_text: dict[int, str] = {}
        """Entry id by ``_text_slot`` of (scope, text): an int key, not the (scope, casefolded text)
        tuple it hashes, saves ~150 B per entry (the entry holds the text; a hit is checked)."""
        self.bytes = 0
        self.evictions = 0
        self.expirations = 0
        self.journal = None
        """Persistence hook (cache_core.state.persistence.Journal): told of every insert and removal."""
        self.mutations = 0
        """Bumped by every insert, removal and rebuild (a stepped exact scan restarts on change)."""
        self.applied = None
        """The experiment snapshot the layout was last aligned to (skip re-aligning it)."""
        self.retired = False
        """Taken out of the cache's map (a clear, or idle and empty): inserts go to its successor."""
        self.disk: DiskTier | None = None
        """Cold entries on local disk, past the memory capacity (an arm's ``disk_entries``)."""
        self.lookup_waiting_since = 0.0
        """perf_counter() when a lookup last started waiting for the lock (0: none): a
        hint that makes the background exact scan step aside (Python locks are unfair)."""

    def __len__(self) -> int:
        return len(self.entries)

    # -- configuration ----------------------------------------------------------------

    def reconfigure(self, spec: IndexSpec, capacity_entries: int, capacity_bytes: int,
                    disk_entries: int = 0) -> None:
        """Follow the arm config in force: rebuild indexes if their structure changed; open,
        resize or drop the disk tier."""
        self.capacity_entries, self.capacity_bytes = capacity_entries, capacity_bytes
        self._configure_disk(disk_entries)
        if spec == self.spec:
            return
        moved_off_shared = self.spec.kind == "milvus" and spec.kind != "milvus"
        old = list(self.entries.values())
        vecs = self.vectors_of(old)  # before the old indexes go: a compact entry's vector is theirs
        self.spec = spec
        self.mutations += 1
        if moved_off_shared:  # milvus to milvus re-upserts the same rows instead
            for index in self.indexes.values():
                discard(index)
        self.indexes = {}
        for entry, vec in zip(old, vecs):
            index = self._index_for(entry.scope)
            index.add(entry.entry_id, vec)
            entry.embedding = None if index.compact_entries else vec

    def _configure_disk(self, disk_entries: int) -> None:
        if disk_entries <= 0:
            if self.disk is not None:  # the arm gave its disk tier up: its entries go
                self.drop_disk()
            return
        if self.disk is None:
            directory = self.backends.disk_dir if self.backends is not None else None
            self.disk = DiskTier(file_for(directory or default_disk_dir(), self.key), self.dim, disk_entries)
        self.disk.capacity = disk_entries

    def drop_disk(self) -> None:
        """Empty and close the disk tier (a clear, or the arm gave it up)."""
        if self.disk is not None:
            self.disk.clear()
            self.disk.close()
            self.disk = None

    def cold(self) -> int:
        """Entries in the disk tier."""
        return len(self.disk) if self.disk is not None else 0

    def holds(self, entry_id: str) -> bool:
        """In memory or on disk."""
        return entry_id in self.entries or (self.disk is not None and entry_id in self.disk)

    def vector_of(self, entry: CacheEntry) -> np.ndarray:
        """``entry``'s vector: its own (float kinds, or an entry not held in memory), else the
        one its store keeps (compressed kinds: decoded from fp16 or the codes)."""
        if entry.embedding is not None:
            return entry.embedding
        return self.indexes[entry.scope or ""].vector(entry.entry_id)

    def vectors_of(self, entries: list[CacheEntry]) -> list[np.ndarray]:
        """``vector_of`` for many memory entries, read from each scope's index in one call."""
        out: list[np.ndarray | None] = [e.embedding for e in entries]
        missing: dict[str, list[int]] = {}
        for n, entry in enumerate(entries):
            if entry.embedding is None:
                missing.setdefault(entry.scope or "", []).append(n)
        for scope, positions in missing.items():
            rows = self.indexes[scope].vectors([entries[n].entry_id for n in positions])
            for n, row in zip(positions, rows):
                out[n] = row
        return out  # type: ignore[return-value]

    def _index_for(self, scope: str | None) -> VectorStore:
        key = scope or ""
        if key not in self.indexes:
            self.indexes[key] = new_index(self.dim, self.spec, self.backends, self.key, scope)
        return self.indexes[key]

    # -- search -----------------------------------------------------------------------

    def search(self, vec: np.ndarray, scope: str | None, now: float,
               k: int = SEARCH_K) -> SearchOutcome:
        """Live candidates, best first. The ANN check is separate (``ann_check``), so it
        can run after the answer has left."""
        index = self.indexes.get(scope or "")
        outcome = SearchOutcome(best=None)
        if index is not None and len(index):
            outcome.raw = index.search(vec, k)
            outcome.candidates = self._alive(index, vec, outcome.raw, now, k, outcome.expired)
            outcome.mark = index.mark()
        if self.disk is not None and len(self.disk):
            outcome.candidates = self._with_cold(vec, scope, now, k, outcome.candidates)
        outcome.best = outcome.candidates[0] if outcome.candidates else None
        return outcome

    def _with_cold(self, vec: np.ndarray, scope: str | None, now: float, k: int,
                   hot: list[Candidate]) -> list[Candidate]:
        """``hot`` merged with the disk tier's candidates that make the top ``k`` (decoded from
        the file only those)."""
        merged = list(hot)
        floor = hot[k - 1].similarity if len(hot) >= k else -np.inf
        for entry, sim in self.disk.candidates(vec, scope, k, floor):
            if not entry.alive(now):
                self.disk.remove(entry.entry_id)
                self.disk.expirations += 1
                continue
            merged.append(Candidate(entry, sim, tier="disk"))
        merged.sort(key=lambda c: -c.similarity)
        return merged[:k]

    def ann_check(self, vec: np.ndarray, scope: str | None, raw: list[tuple[str, float]],
                  mark: IndexMark | None = None, k: int = SEARCH_K, restarts: int = 2) -> SearchOutcome:
        """Compare the ANN answer ``raw`` with an exact search over the scope's vectors
        (``ann_check_many`` for a batch of one)."""
        return self.ann_check_many(np.asarray(vec, dtype=np.float32).reshape(1, -1), scope, [raw],
                                   [mark], k=k, restarts=restarts)[0]

    def ann_check_many(self, vecs: np.ndarray, scope: str | None,
                       raws: list[list[tuple[str, float]]], marks: list[IndexMark | None] | None = None,
                       k: int = SEARCH_K, block_cells: int = EXACT_BLOCK_CELLS,
                       restarts: int = 2) -> list[SearchOutcome]:
        """``ann_check`` for a batch of queries on one scope: one stepped exact scan whose
        steps are matrix products, so the vectors are read once for the whole batch.
        Same rules as the single check (lock per block, restart on change, after
        ``restarts`` one piece under the lock); results in the order of ``vecs``.

        With ``marks`` (each lookup's ``SearchOutcome.mark``), a query is judged on the
        entries that were in the index at its lookup and still are: a later store is left
        out of the exact search (else the reply stored for a miss, identical to the query,
        would be the exact top-1 of nearly every sampled miss), a removed entry out of both
        lists, and a lookup whose index has since been replaced is not checked."""
        marks = list(marks) if marks is not None else [None] * len(raws)
        before = None
        if any(m is not None for m in marks):
            unbounded = np.iinfo(np.int64).max
            before = np.array([unbounded if m is None else m.next_id for m in marks], dtype=np.int64)
        mat = np.ascontiguousarray(np.asarray(vecs, dtype=np.float32).reshape(len(raws), -1))
        # A step multiplies queries x rows; bounding that product keeps the lock hold
        # (and a lookup's wait) about as short as a single-query step's.
        block_rows = max(EXACT_BLOCK_MIN_ROWS, min(EXACT_BLOCK_ROWS, block_cells // max(len(mat), 1)))
        exact = None
        for _attempt in range(restarts + 1):
            exact = self._exact_many_in_steps(mat, scope, k, block_rows, before=before)
            if exact is not None:
                break
        with self.lock:  # reentrant: no change can land, so this pass completes
            if exact is None:
                exact = self._exact_many_in_steps(mat, scope, k, block_rows, step_aside=False, before=before)
            index = self.indexes.get(scope or "")
            return [_compare_since(index, raw, found, mark) for raw, found, mark in zip(raws, exact, marks)]

    def _exact_many_in_steps(self, mat: np.ndarray, scope: str | None, k: int, block_rows: int,
                             step_aside: bool = True, before: np.ndarray | None = None,
                             ) -> list[list[tuple[str, float]]] | None:
        """Each query's exact top-k in blocks; None if the partition changed between blocks.
        ``before``: per query, leave out the rows added at or after that internal id."""
        with self.lock:
            index, mark = self.indexes.get(scope or ""), self.mutations
        queries = len(mat)
        scores, ids = [], []  # each block's top-k per query; merged once at the end
        start = 0
        while index is not None:
            with self.lock:
                if self.mutations != mark or self.indexes.get(scope or "") is not index:
                    return None
                if start >= index.exact_rows():
                    return _ranked(index, scores, ids, k)  # named while unchanged
                block_scores, block_ids = index.exact_block_many(mat, start, start + block_rows, k,
                                                                 before=before)
            scores.append(block_scores)
            ids.append(block_ids)
            start += block_rows
            if step_aside:
                self._let_lookups_in()
        return [[] for _ in range(queries)]

    def _let_lookups_in(self, max_wait_s: float = 0.005) -> None:
        """Python locks are not fair: without stepping aside, the scan would take the lock
        again before a waiting lookup wakes up. The hint goes stale after ``max_wait_s``."""
        time.sleep(0)
        while True:
            since = self.lookup_waiting_since
            if not since or time.perf_counter() - since > max_wait_s:
                return
            time.sleep(0.0001)

    def _alive(self, index: VectorStore, vec: np.ndarray, raw: list[tuple[str, float]],
               now: float, k: int, met_expired: list[Candidate] | None = None) -> list[Candidate]:
        for _attempt in range(3):
            expired, live = False, []
            for entry_id, sim in raw:
                entry = self.entries.get(entry_id)
                if entry is None:
                    continue
                if entry.alive(now):
                    live.append(Candidate(entry, sim))
                    continue
                self.remove(entry_id)
                self.expirations += 1
                expired = True
                if met_expired is not None:  # an adaptive TTL learns from them
                    met_expired.append(Candidate(entry, sim))
            if live or not expired or len(index) == 0:
                return live
            raw = index.search(vec, k)  # the expired ones are gone; look again
        return []

    def drop_expired_cold(self, now: float) -> int:
        """Expired rows of the disk tier (the sweeper)."""
        return self.disk.drop_expired(now) if self.disk is not None else 0

    def nearest_alive(self, vec: np.ndarray, scope: str | None, now: float) -> Candidate | None:
        return self.search(vec, scope, now).best

    # -- hits, inserts, removal ---------------------------------------------------------

    def touch(self, entry: CacheEntry, now: float) -> None:
        """A hit on ``entry``: counted, and moved to the LRU's hot end; an entry served from
        the disk tier is promoted into memory first (which may demote another)."""
        if entry.entry_id not in self.entries and self.disk is not None and self.disk.remove(entry.entry_id):
            self.disk.promotions += 1
            self.evict_for(entry.approx_bytes, now)
            self.insert(entry)
        entry.last_hit_at = now
        entry.hit_count += 1
        self.entries.move_to_end(entry.entry_id)

    def existing_same_text(self, scope: str | None, query: str) -> CacheEntry | None:
        key = text_key(query)
        entry = self.entries.get(self.by_text.get(_text_slot(scope, key), ""))
        if entry is None or (entry.scope or "") != (scope or "") or text_key(entry.query) != key:
            return None  # none, or a hash collision (the later text took the slot)
        return entry

    def insert(self, entry: CacheEntry) -> None:
        if self.holds(entry.entry_id):  # a replayed log record: replace, do not double count
            self.remove(entry.entry_id)
        self.mutations += 1
        self.entries[entry.entry_id] = entry
        self.by_text[_text_slot(entry.scope, text_key(entry.query))] = entry.entry_id
        self.bytes += entry.approx_bytes
        index = self._index_for(entry.scope)
        index.add(entry.entry_id, entry.embedding)
        if self.journal is not None:
            self.journal.record_put(self.key, entry)
        if index.compact_entries:  # the store keeps the vector (fp16 or codes): the entry drops its float32 one
            entry.embedding = None

    def remove(self, entry_id: str, with_vector: bool = False) -> CacheEntry | None:
        """Take the entry out (memory or disk); None if it is in neither. ``with_vector``: a
        compact entry gets its vector back from the store first (a demotion, an expiry's ghost)."""
        entry = self.entries.get(entry_id)
        if entry is not None and with_vector and entry.embedding is None:
            entry.embedding = self.vector_of(entry)
        entry = self.entries.pop(entry_id, None)
        if entry is None:
            if self.disk is not None and entry_id in self.disk:  # invalidated or purged while cold
                entry = self.disk.load(entry_id)
                self.disk.remove(entry_id)
                self.mutations += 1
            return entry
        self.mutations += 1
        if self.journal is not None:
            self.journal.record_remove(self.key, entry_id)
        self.bytes -= entry.approx_bytes
        by_text = _text_slot(entry.scope, text_key(entry.query))
        if self.by_text.get(by_text) == entry_id:
            del self.by_text[by_text]
        scope_key = entry.scope or ""
        index = self.indexes.get(scope_key)
        if index is not None:
            index.remove(entry_id)
            if len(index) == 0 and scope_key:
                del self.indexes[scope_key]  # conversations end; do not keep their indexes
        return entry

    def vote(self, entry_id: str, unit_id: str) -> tuple[CacheEntry | None, bool]:
        """Count ``unit_id``'s "wrong" against the entry: (the entry or None, whether the unit is new).
        Idempotent (a set); a new vote is logged."""
        entry = self.entries.get(entry_id)
        if entry is None or unit_id in entry.wrong_units:
            return entry, False
        entry.wrong_units = entry.wrong_units | {unit_id}
        if self.journal is not None:
            self.journal.record_vote(self.key, entry_id, unit_id)
        return entry, True

    def has_room(self, extra_bytes: int) -> bool:
        return (len(self.entries) < self.capacity_entries
                and self.bytes + extra_bytes <= self.capacity_bytes)

    def drop_expired_lru(self, now: float) -> int:
        """The eviction a novel query triggers: expired entries near the LRU end."""
        # islice, not list(values())[:n]: that copied every entry's pointer (8 MB and ~5 ms at 10^6) per call
        victims = [e.entry_id for e in islice(self.entries.values(), EVICTION_SCAN) if not e.alive(now)]
        for entry_id in victims:
            self.remove(entry_id)
        self.expirations += len(victims)
        return len(victims)

    def evict_for(self, extra_bytes: int, now: float) -> None:
        """LRU eviction until ``extra_bytes`` more fit; protected live entries go last. With a
        disk tier a live victim is demoted to it (its removal from memory is logged, so the
        write-ahead log and the tier's file never both restore it)."""
        while self.entries and not self.has_room(extra_bytes):
            victim = self.remove(self._lru_victim(now), with_vector=self.disk is not None)
            if self.disk is not None and victim is not None and victim.alive(now):
                self.disk.put(victim)
            else:
                self.evictions += 1

    def _lru_victim(self, now: float) -> str:
        for scanned, entry in enumerate(self.entries.values()):
            if scanned >= EVICTION_SCAN:
                break
            if not (entry.protected and entry.alive(now)):
                return entry.entry_id
        return next(iter(self.entries))
