"""The ANN structures behind ``VectorIndex``: one factory per index kind, plus the
semantic-hash index (FAISS has the hash tables, not the fingerprints).

Kinds and what they keep per entry (384-d MiniLM, FAISS structure only; the reference
copy ``VectorIndex`` re-scores from and the ANN check scans is extra, at the precision
``reference_precision`` gives: float32 1536 B, fp16 768 B, or none):

* ``flat`` / ``ivf`` / ``hnsw``: float32 (1536 B, plus IVF ids or HNSW links).
* ``sq_fp16`` / ``sq_int8`` / ``sq_int4``: ``IndexScalarQuantizer`` codes, scanned in
  full (768 / 384 / 192 B). int8 and int4 learn a per-dimension range, so they train.
* ``hnsw_sq_fp16`` / ``hnsw_sq_int8`` / ``hnsw_sq_int4``: ``IndexHNSWSQ``, the same codes
  in an HNSW graph (plus ~2 x ``hnsw_m`` x 4 B of links at level 0).
* ``ivf_sq_fp16`` / ``ivf_sq_int8`` / ``ivf_sq_int4``: ``IndexIVFScalarQuantizer``, the
  same codes in ``ivf_nlist`` inverted lists (plus an 8-byte id each): no graph to build,
  so the kind that reaches 10^6 entries in minutes here.
* ``ivf_pq``: ``IndexIVFPQ``, ``pq_m`` sub-quantizers of ``pq_nbits`` each (48 B at the
  defaults) plus an 8-byte id per entry in its inverted list.
* ``semhash``: a 64-bit sign-projection fingerprint per entry (``SemanticHashIndex``).

The quantised and hashed kinds return approximate scores. The int4, PQ, graph-over-SQ
and hashed kinds are asked for ``ann_candidates`` candidates, re-scored from an fp16 copy
(within ~1e-3 of the float32 cosine). The fp16 and int8 scalar quantisers (flat or IVF)
keep no copy: their codes are the reference, so the similarity that meets an arm's
threshold is the codes' cosine (int8: within ~1e-2 of float32 on unit vectors), and the
ANN check compares their probing with a scan of the same codes (cache_core.store.reference).
"""
from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

# FAISS warns below ~39 training points per centroid; train only with that many.
POINTS_PER_CENTROID = 39
# int8/int4 learn each dimension's range from the vectors seen at training: wait for a few.
SQ_TRAIN_SIZE = 256
HASH_BITS = 64

# int8 / int4 ranges are learnt from the training sample's min and max per dimension,
# widened by this fraction on each side: a later vector past the sample's range is clipped,
# and with no float32 copy to re-score from, clipping is what the served cosine would lose
# (measured on clustered unit vectors, 32-d / 384-d, trained on 256: max cosine error
# 0.041 / 0.0063 unwidened, 0.0056 / 0.0032 at 0.1).
SQ_RANGE_WIDENING = 0.1

SQ_TYPES = {
    "fp16": faiss.ScalarQuantizer.QT_fp16,
    "int8": faiss.ScalarQuantizer.QT_8bit,
    "int4": faiss.ScalarQuantizer.QT_4bit,
}


@dataclass(frozen=True)
class KindTraits:
    """How ``VectorIndex`` handles a kind's structure."""

    train_size: int
    """Vectors needed before the structure is built (0: built empty, at once); until then
    the reference answers, in float32."""
    removes: bool
    """Supports ``remove_ids``; otherwise removed ids are tombstones until a rebuild."""
    rescore: bool
    """Scores are approximate: re-score ``ann_candidates`` candidates exactly."""


def traits(spec) -> KindTraits:
    """``spec``: a ``cache_core.index.IndexSpec``."""
    kind = spec.kind
    if kind in ("flat",):
        return KindTraits(0, True, False)
    if kind == "ivf":
        return KindTraits(POINTS_PER_CENTROID * spec.ivf_nlist, True, False)
    if kind == "hnsw":
        return KindTraits(0, False, False)
    if kind.startswith("sq_"):
        return KindTraits(0 if kind == "sq_fp16" else SQ_TRAIN_SIZE, True, True)
    if kind.startswith("hnsw_sq_"):
        return KindTraits(0 if kind == "hnsw_sq_fp16" else SQ_TRAIN_SIZE, False, True)
    if kind.startswith("ivf_sq_"):
        return KindTraits(POINTS_PER_CENTROID * spec.ivf_nlist, True, True)
    if kind == "ivf_pq":
        size = POINTS_PER_CENTROID * max(spec.ivf_nlist, 2 ** spec.pq_nbits)
        return KindTraits(size, True, True)
    if kind == "semhash":
        return KindTraits(0, False, True)
    raise ValueError(f"unknown index kind {kind!r}")


def reference_precision(spec) -> str:
    """What ``VectorIndex`` keeps beside ``spec``'s trained structure to re-score candidates
    and to scan exactly (cache_core.store.reference): ``fp32`` for the float kinds, ``codes``
    (nothing more: the structure's own codes) for the fp16 / int8 scalar quantisers, flat or
    IVF, and ``fp16`` for the rest. Only kinds with ``remove_ids`` may use their codes: a
    tombstoned kind rebuilds from the reference, which must drop removed rows itself."""
    kind = spec.kind
    if kind in ("flat", "ivf", "hnsw"):
        return "fp32"
    if kind in ("sq_fp16", "sq_int8", "ivf_sq_fp16", "ivf_sq_int8"):
        return "codes"
    return "fp16"


def build(spec, dim: int, vecs: np.ndarray | None = None, ids: np.ndarray | None = None,
          train: np.ndarray | None = None):
    """A new ANN structure for ``spec`` (None for ``flat``: the reference answers),
    trained on ``train`` (default: ``vecs``) when the kind trains, holding ``vecs`` under
    ``ids`` if given. Everything it returns takes ``add_with_ids``, ``search`` and ``ntotal``."""
    kind = spec.kind
    metric = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return None
    if kind == "hnsw":
        inner = faiss.IndexHNSWFlat(dim, spec.hnsw_m, metric)
        inner.hnsw.efSearch = spec.hnsw_ef_search
        index = faiss.IndexIDMap(inner)
    elif kind == "ivf":
        quantizer = faiss.IndexFlatIP(dim)
        inner = faiss.IndexIVFFlat(quantizer, dim, spec.ivf_nlist, metric)
        inner.nprobe = spec.ivf_nprobe
        inner.own_fields = True
        quantizer.this.disown()  # the IVF index owns (and frees) its quantizer now
        index = inner
    elif kind.startswith("sq_"):
        index = faiss.IndexIDMap(faiss.IndexScalarQuantizer(dim, SQ_TYPES[kind[3:]], metric))
    elif kind.startswith("hnsw_sq_"):
        inner = faiss.IndexHNSWSQ(dim, SQ_TYPES[kind[8:]], spec.hnsw_m, metric)
        inner.hnsw.efSearch = spec.hnsw_ef_search
        index = faiss.IndexIDMap(inner)
    elif kind.startswith("ivf_sq_"):
        quantizer = faiss.IndexFlatIP(dim)
        inner = faiss.IndexIVFScalarQuantizer(quantizer, dim, spec.ivf_nlist, SQ_TYPES[kind[7:]], metric)
        inner.nprobe = spec.ivf_nprobe
        inner.own_fields = True
        quantizer.this.disown()
        index = inner
    elif kind == "ivf_pq":
        if dim % spec.pq_m:
            raise ValueError(f"pq_m must divide the embedding dimension {dim}, got {spec.pq_m}")
        quantizer = faiss.IndexFlatIP(dim)
        inner = faiss.IndexIVFPQ(quantizer, dim, spec.ivf_nlist, spec.pq_m, spec.pq_nbits, metric)
        inner.nprobe = spec.ivf_nprobe
        inner.own_fields = True
        quantizer.this.disown()
        index = inner
    elif kind == "semhash":
        index = SemanticHashIndex(dim, tables=spec.semhash_tables, radius=spec.semhash_radius,
                                  seed=spec.semhash_seed)
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    _widen_ranges(index)
    if vecs is not None and len(vecs):
        if not index.is_trained:
            index.train(vecs if train is None else train)
        index.add_with_ids(vecs, ids)
        compact_lists(index)
    return index


def compact_lists(index) -> None:
    """Copy an IVF index's inverted lists into lists of exactly their size. FAISS adds in
    blocks of 65,536 vectors, each growing every list's vectors geometrically: after a bulk
    build of 10^6 int8 codes, the spare capacity was ~70 B per entry of resident memory
    (``bench/index_kinds.py --all-in``). Lists grown by later single adds keep their slack."""
    ivf = faiss.try_extract_index_ivf(index) if isinstance(index, faiss.Index) else None
    if ivf is None:
        return
    old = ivf.invlists
    fresh = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    for lst in range(ivf.nlist):
        size = old.list_size(lst)
        if size:
            fresh.add_entries(lst, size, old.get_ids(lst), old.get_codes(lst))
    ivf.replace_invlists(fresh, True)
    fresh.this.disown()  # the index owns (and frees) it now


def _widen_ranges(index) -> None:
    """Set ``SQ_RANGE_WIDENING`` on a scalar quantiser inside ``index`` (before training)."""
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(inner, faiss.IndexHNSW):
        inner = faiss.downcast_index(inner.storage)
    sq = getattr(inner, "sq", None)
    if sq is not None:
        sq.rangestat = faiss.ScalarQuantizer.RS_minmax
        sq.rangestat_arg = SQ_RANGE_WIDENING


def bytes_per_entry(index) -> float:
    """Serialised size of an ANN structure over its entries (what it holds resident, give
    or take allocator slack; the hash tables of ``semhash`` are counted by their entries)."""
    if index is None or index.ntotal == 0:
        return 0.0
    if isinstance(index, SemanticHashIndex):
        return index.nbytes() / index.ntotal
    return faiss.serialize_index(index).nbytes / index.ntotal


class SemanticHashIndex:
    """64-bit fingerprints (the signs of a seeded random projection: two vectors at angle
    theta differ in each bit with probability theta/pi) in FAISS multi-index hash tables
    (``IndexBinaryMultiHash``): the 64 bits cut into ``tables`` keys of 64/tables bits,
    each a hash table. A search probes, in every table, the buckets within ``radius``
    bit flips of the query's key, ranks what it finds by the Hamming distance of the
    whole fingerprint and returns the nearest; ``VectorIndex`` re-scores those exactly.

    By the pigeonhole principle every entry within ``tables x (radius + 1) - 1`` bits of
    the query is probed (19 at 4 x 16-bit tables and radius 4: cosine ~0.8 is 13 bits on
    average). Scores returned here are the cosines the Hamming distances estimate,
    cos(pi h / 64). No removal in FAISS's hash tables: ``VectorIndex`` tombstones."""

    is_trained = True

    def __init__(self, dim: int, tables: int = 4, radius: int = 4, seed: int = 0):
        if HASH_BITS % tables:
            raise ValueError(f"semhash tables must divide {HASH_BITS}, got {tables}")
        self.dim = dim
        self.radius = radius
        rng = np.random.default_rng(seed)
        self.projection = rng.standard_normal((dim, HASH_BITS)).astype(np.float32)
        hashed = faiss.IndexBinaryMultiHash(HASH_BITS, tables, HASH_BITS // tables)
        hashed.nflip = radius
        self._hashed = hashed
        self._index = faiss.IndexBinaryIDMap(hashed)

    @property
    def ntotal(self) -> int:
        return self._index.ntotal

    def train(self, vecs: np.ndarray) -> None:
        """Nothing to learn: the projection is random (seeded)."""

    def fingerprints(self, vecs: np.ndarray) -> np.ndarray:
        """(n, 8) uint8: one bit per projection, set where the projection is positive."""
        signs = np.asarray(vecs, dtype=np.float32) @ self.projection > 0
        return np.packbits(signs, axis=1)

    def add_with_ids(self, vecs: np.ndarray, ids: np.ndarray) -> None:
        self._index.add_with_ids(self.fingerprints(vecs), np.asarray(ids, dtype=np.int64))

    def search(self, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the ``k`` nearest fingerprints among the probed buckets; a
        missing slot has id -1 (and a score of -inf)."""
        dist, ids = self._index.search(self.fingerprints(vecs), k)
        found = ids >= 0
        scores = np.where(found, np.cos(np.pi * np.minimum(dist, HASH_BITS) / HASH_BITS), -np.inf)
        return scores.astype(np.float32), ids

    def nbytes(self) -> int:
        """Fingerprint and id (8 + 8 B) plus, per table, an id in a bucket's list (8 B)."""
        return self.ntotal * (HASH_BITS // 8 + 8 + 8 * self._hashed.nhash)
