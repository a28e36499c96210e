"""FAISS vector indexes behind one small class, with a reference copy for re-scoring
and ANN checks.

Vectors are L2-normalised, so inner product is cosine similarity. Every index keeps a
reference over the same live vectors (cache_core.store.reference): float32 for the float
kinds, fp16 for the int4 / PQ / graph-over-SQ / hashed kinds, and none beyond the
structure's own codes for the fp16 and int8 scalar quantisers (flat or IVF), which is
what lets an ``ivf_sq_int8`` store hold 10^6 entries in under 600 B each, all in
(``bench/index_kinds.py --all-in``). The reference is the search structure for ``flat``,
the pre-training fallback (in float32) for the kinds that train, the source for rebuilds,
what the candidates of the approximate kinds are re-scored from, and what ``exact_search``
and the ANN check's stepped scan read. The kinds' structures: ``cache_core.store.kinds``.

Deletion: kinds whose FAISS structure has ``remove_ids`` use it; the graph and hash
kinds (``hnsw*``, ``semhash``) do not, so removed ids become tombstones filtered at
search time, and the structure is rebuilt from the reference once tombstones exceed
``rebuild_fraction`` of its size.
Not thread-safe: the owning cache partition holds a lock around every call.
"""
from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from cache_core.store import kinds as index_kinds
from cache_core.store.id_names import InternalNames
from cache_core.store.reference import CodesReference, FlatReference
from cache_core.experiments import ArmConfig, IndexKind

# FAISS warns below ~39 training points per list; train only with that many.
IVF_POINTS_PER_LIST = index_kinds.POINTS_PER_CENTROID


def set_search_threads(threads: int = 1) -> None:
    """FAISS OpenMP threads and numpy's BLAS threads (process-wide). One query at a
    time gains nothing from more threads, and on a small machine shared with torch
    their spinning costs tail latency (measured on 2 cores, 10^4 flat: p95 20 ms with
    2, 1.2 ms with 1). The exact scans of ANN checks are numpy products, and two BLAS
    threads spin: bench/ann_check_cost.py (10^5 x 384, checks at rate 0.1, 4 clients)
    measured 94 process CPU seconds per 1000 single checks with two against 27 with one,
    and lookup p50 22 ms against 15."""
    faiss.omp_set_num_threads(threads)
    try:  # present through the scientific stack; without it BLAS keeps its default
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=threads, user_api="blas")


@dataclass(frozen=True)
class IndexSpec:
    """What determines an index's structure; a change means a rebuild."""

    kind: IndexKind = "flat"
    hnsw_m: int = 32
    hnsw_ef_search: int = 64
    ivf_nlist: int = 64
    ivf_nprobe: int = 8
    pq_m: int = 48
    pq_nbits: int = 8
    semhash_tables: int = 4
    semhash_radius: int = 4
    semhash_seed: int = 0
    ann_candidates: int = 16

    @classmethod
    def for_arm(cls, arm: ArmConfig) -> "IndexSpec":
        return cls(kind=arm.index_kind, hnsw_m=arm.hnsw_m, hnsw_ef_search=arm.hnsw_ef_search,
                   ivf_nlist=arm.ivf_nlist, ivf_nprobe=arm.ivf_nprobe, pq_m=arm.pq_m,
                   pq_nbits=arm.pq_nbits, semhash_tables=arm.semhash_tables,
                   semhash_radius=arm.semhash_radius, semhash_seed=arm.semhash_seed,
                   ann_candidates=arm.ann_candidates)


@dataclass(frozen=True)
class IndexMark:
    """Where a search left an index: the index and the internal id its next add takes.
    An ANN check runs after the answer has left, when later stores (typically the reply
    to this very miss) and removals have changed the index; it compares the search with
    the entries that were there at the mark and still are."""

    index: "VectorIndex"
    next_id: int


def _as_matrix(vec: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(vec, dtype=np.float32).reshape(-1, vec.shape[-1]))


class VectorIndex:
    """Maps string entry ids to vectors; ``search`` (ANN) and ``exact_search`` (by the reference)."""

    def __init__(self, dim: int, spec: IndexSpec = IndexSpec(), rebuild_fraction: float = 0.2):
        self.dim = dim
        self.spec = spec
        self.rebuild_fraction = rebuild_fraction
        self._traits = index_kinds.traits(spec)
        self._ann = None  # None: the reference answers (flat, or not trained yet)
        self._reference = FlatReference(dim, "fp32")
        self._tombstones: set[int] = set()
        self._next_id = 0
        self._id_of: dict[str, int] = {}
        self._entry_of = InternalNames()  # a list, not a dict: internal ids only grow
        self.rebuilds = 0
        if self._traits.train_size == 0:
            self._ann = index_kinds.build(spec, dim)
            self._reference = self._reference_for(self._ann)

    # -- public -----------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def trained(self) -> bool:
        """For the kinds that train: whether their structure is in use (else flat fallback)."""
        return self._ann is not None

    @property
    def reference_precision(self) -> str:
        """What candidates are re-scored from and exact scans read: fp32, fp16 or codes."""
        return self._reference.precision

    def ann_bytes_per_entry(self) -> float:
        """The ANN structure's size per entry (0 while the reference answers alone)."""
        return index_kinds.bytes_per_entry(self._ann)

    def reference_bytes_per_entry(self) -> float:
        """The reference copy's codes and ids per entry (0 when it is the structure's codes)."""
        return self._reference.nbytes() / len(self) if len(self) else 0.0

    def __len__(self) -> int:
        return len(self._id_of)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._id_of

    def mark(self) -> IndexMark:
        """Internal ids only grow (a replaced vector gets a new one): every id below the
        mark's was added before it."""
        return IndexMark(self, self._next_id)

    def internal_id(self, entry_id: str) -> int | None:
        return self._id_of.get(entry_id)

    def add(self, entry_id: str, vec: np.ndarray) -> None:
        """Add (or replace) one vector."""
        if entry_id in self._id_of:
            self.remove(entry_id)
        internal = self._next_id
        self._next_id += 1
        self._id_of[entry_id] = internal
        self._entry_of.add(internal, entry_id)
        self._store(_as_matrix(vec), np.array([internal], dtype=np.int64))

    def add_many(self, entry_ids: list[str], vecs: np.ndarray) -> None:
        """Add new vectors in one FAISS call (an HNSW graph builds in parallel this way)."""
        if any(e in self._id_of for e in entry_ids) or len(set(entry_ids)) != len(entry_ids):
            raise ValueError("add_many takes new, distinct entry ids; use add to replace")
        ids = np.arange(self._next_id, self._next_id + len(entry_ids), dtype=np.int64)
        self._next_id += len(entry_ids)
        for entry_id, internal in zip(entry_ids, ids.tolist()):
            self._id_of[entry_id] = internal
            self._entry_of.add(internal, entry_id)
        self._store(np.ascontiguousarray(np.asarray(vecs, dtype=np.float32)), ids)

    def remove(self, entry_id: str) -> bool:
        """Remove one vector; False if it was not there."""
        internal = self._id_of.pop(entry_id, None)
        if internal is None:
            return False
        self._entry_of.pop(internal)
        ids = np.array([internal], dtype=np.int64)
        if self._reference.owns_rows:
            self._reference.remove(ids)
        if self._ann is None:
            return True
        if self._traits.removes:
            self._ann.remove_ids(ids)
            if not self._reference.owns_rows:
                self._reference.changed()
        else:
            self._tombstones.add(internal)
            if len(self._tombstones) > self.rebuild_fraction * max(len(self), 1):
                self._rebuild()
        return True

    def search(self, vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Top-k (entry_id, cosine) from the ANN structure (the reference's for flat/untrained)."""
        if self._ann is None:
            return self.exact_search(vec, k)
        # Ask for extra candidates so tombstoned ids do not shrink the answer.
        if not self._traits.rescore or not self._reference.owns_rows:
            return self._run(self._ann, vec, k, extra=len(self._tombstones))
        wanted = max(k, self.spec.ann_candidates)
        return self._rescored(vec, self._run(self._ann, vec, wanted, extra=len(self._tombstones)), k)

    def exact_search(self, vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Brute-force top-k over the same live vectors, by the reference: the ground truth
        for ANN checks."""
        return self._run(self._reference, vec, k, extra=0)

    def exact_rows(self) -> int:
        """Rows of the reference (the range ``exact_block_many`` scans)."""
        return self._reference.rows()

    def exact_block_many(self, mat: np.ndarray, start: int, stop: int, k: int,
                         before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of a batch of queries over rows [start, stop) of the reference, so a
        caller can split a long brute-force search into short steps and release its lock in
        between (rows shift on removal: the caller must restart if the index changed between
        steps). Per query (row of ``mat``) the scores and internal ids of its top-k among
        rows [start, stop), in no particular order, shape (queries, up to k); an id of -1
        (score -inf) is a slot nothing filled. Internal ids stay internal so the caller can
        merge blocks cheaply; ``labels`` names them at the end. With ``before`` (one
        internal id per query), rows added at or after it score -inf for that query."""
        return self._reference.block_many(np.ascontiguousarray(mat, dtype=np.float32), start, stop, k, before)

    def labels(self, internal_ids) -> list[str | None]:
        """Entry ids of internal ids (None for one that is no longer live)."""
        return [self._entry_of.get(int(i)) for i in internal_ids]

    @property
    def compact_entries(self) -> bool:
        """Whether the entries of a store of this kind keep no float32 vector of their own:
        the compressed and hashed kinds, whose reference is fp16 or their codes, give one
        back (``vectors``: decoded, so within fp16 / int8 precision of what was added) to
        snapshots, demotions and re-layouts. The float kinds keep theirs on the entry."""
        return index_kinds.reference_precision(self.spec) != "fp32"

    def vector(self, entry_id: str) -> np.ndarray:
        """The entry's vector as the reference holds it (fp16 / codes: decoded)."""
        return self.vectors([entry_id])[0]

    def vectors(self, entry_ids: list[str]) -> np.ndarray:
        """``vector`` of many entries, (len, dim) float32 in their order (KeyError: not held)."""
        internal = np.array([self._id_of[e] for e in entry_ids], dtype=np.int64)
        if len(internal) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._reference.vectors(internal), dtype=np.float32)

    def entry_ids(self) -> list[str]:
        return list(self._id_of)

    def rescore(self, vec: np.ndarray, found: list[tuple[str, float]], k: int) -> list[tuple[str, float]]:
        """``found``'s cosines from the reference, best first, the top ``k`` (live ids only)."""
        return self._rescored(vec, found, k)

    # -- internals --------------------------------------------------------------------

    def _store(self, mat: np.ndarray, ids: np.ndarray) -> None:
        self._reference.add(mat, ids)  # codes: the structure's codes are the reference, added there
        if self._ann is not None:
            if self._reference.owns_rows:
                self._ann.add_with_ids(mat, ids)
        elif self._traits.train_size and len(self) >= self._traits.train_size:
            self._rebuild()

    def _reference_for(self, ann) -> FlatReference | CodesReference:
        """The reference to keep beside a (new) structure ``ann``, filled from the current one."""
        precision = index_kinds.reference_precision(self.spec) if ann is not None else "fp32"
        if precision == "codes":
            return CodesReference(ann, self.dim)
        if precision == self._reference.precision:
            return self._reference
        vecs, ids = self._reference.all()
        reference = FlatReference(self.dim, precision)
        if len(ids):
            reference.add(vecs, ids)
        return reference

    def _run(self, index, vec: np.ndarray, k: int, extra: int) -> list[tuple[str, float]]:
        if len(self) == 0 or k <= 0:
            return []
        want = min(k + extra, index.ntotal)
        scores, ids = index.search(_as_matrix(vec), want)
        out = []
        for score, internal in zip(scores[0], ids[0]):
            entry_id = self._entry_of.get(int(internal))
            if internal >= 0 and entry_id is not None:
                out.append((entry_id, float(score)))
                if len(out) == k:
                    break
        return out

    def _rescored(self, vec: np.ndarray, found: list[tuple[str, float]], k: int) -> list[tuple[str, float]]:
        """The candidates' cosines from the reference, best first, the top ``k``."""
        if not found:
            return []
        internal = np.array([self._id_of[e] for e, _ in found], dtype=np.int64)
        scores = self._reference.vectors(internal) @ _as_matrix(vec)[0]
        order = np.argsort(-scores, kind="stable")[:k]
        return [(found[i][0], float(scores[i])) for i in order]

    def _rebuild(self) -> None:
        """A new structure from the live vectors (trained on them if the kind trains);
        below the kind's training size the reference answers (in float32) until it is
        reached. The reference follows: converted, or the new structure's own codes."""
        vecs, ids = self._reference.all()
        self._tombstones.clear()
        self.rebuilds += 1
        if self._traits.train_size and len(ids) < self._traits.train_size:
            self._ann = None
        else:
            self._ann = index_kinds.build(self.spec, self.dim, vecs, ids)
        del vecs, ids
        self._reference = self._reference_for(self._ann)
