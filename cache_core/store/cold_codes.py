"""The disk tier's in-memory search structure for one scope: compact codes under the
SQLite row ``seq`` of each cold entry (cache_core.store.disk_tier), nothing per entry in
Python.

* Small (fewer than ``POINTS_PER_CENTROID`` x ``MIN_NLIST`` = 2,496 entries): float16
  codes scanned in full (``sq_fp16``, 768 B + an 8-byte id each), exact to fp16.
* Larger: ``ivf_sq_int8``, the memory tier's compressed kind (cache_core.store.kinds):
  int8 codes in inverted lists (384 B + an 8-byte id at 384 dimensions), searched with
  ``NPROBE`` lists. The number of lists follows the size (a power of two up to
  ``4 sqrt(n)``, at least 39 training points each, at most ``MAX_NLIST``); when it would
  double, the owner rebuilds the structure from its file (trained on a sample, filled in
  chunks): five rebuilds up to 65,536 entries, none after. The codes only rank: the owner
  re-scores the best ``CANDIDATES`` from their stored float16 vectors, so a threshold
  meets (nearly) the true cosine.

Removal is lazy: a removed seq is remembered (8 B in an array) and stays in the structure
until those exceed ``COMPACT_FRACTION`` of the live ones, then all go in one
``remove_ids`` (FAISS scans every list for it: O(n) once per ~n/50 removals, not per
removal as a per-id ``remove_ids`` on an IVF without a direct map would be). A removed
seq that a search still returns has no row in the file, so the owner's look-up drops it.
Not thread-safe: the partition's lock is held around every call.
"""
from __future__ import annotations

from array import array

import faiss
import numpy as np

from cache_core.store import kinds
from cache_core.store.faiss import IndexSpec

POINTS_PER_CENTROID = kinds.POINTS_PER_CENTROID
MIN_NLIST = 64
MAX_NLIST = 1024
NPROBE = 8
CANDIDATES = 16
"""Candidates taken from the codes for the exact re-score (at least the search's k)."""
COMPACT_FRACTION = 0.02
COMPACT_MIN = 64


def nlist_for(entries: int) -> int:
    """Inverted lists for ``entries`` codes (0: too few, a flat fp16 scan)."""
    bound = min(MAX_NLIST, 4 * np.sqrt(max(entries, 1)), entries / POINTS_PER_CENTROID)
    if bound < MIN_NLIST:
        return 0
    return 1 << int(np.log2(bound))


def spec_for(nlist: int) -> IndexSpec:
    if nlist == 0:
        return IndexSpec("sq_fp16")
    return IndexSpec("ivf_sq_int8", ivf_nlist=nlist, ivf_nprobe=NPROBE)


class ColdCodes:
    """One scope's codes: ``add``, ``remove`` (lazy), ``search`` (seqs, approximate scores)."""

    def __init__(self, dim: int, nlist: int = 0):
        self.dim = dim
        self.nlist = nlist
        self.live = 0
        self._index = kinds.build(spec_for(nlist), dim)
        self._dead = array("q")

    @property
    def trained(self) -> bool:
        return bool(self._index.is_trained)

    def train(self, sample: np.ndarray) -> None:
        if not self._index.is_trained:
            self._index.train(np.ascontiguousarray(sample, dtype=np.float32))

    def add(self, seqs: np.ndarray, vecs: np.ndarray) -> None:
        self._index.add_with_ids(np.ascontiguousarray(vecs, dtype=np.float32).reshape(-1, self.dim),
                                 np.asarray(seqs, dtype=np.int64).reshape(-1))
        self.live += len(seqs)

    def finish_bulk(self) -> None:
        """After a rebuild's adds: IVF lists trimmed to their size (kinds.compact_lists)."""
        kinds.compact_lists(self._index)

    def outgrown(self) -> bool:
        """Whether the size calls for at least twice the lists (the owner rebuilds)."""
        wanted = nlist_for(self.live)
        return wanted > 0 and wanted >= 2 * max(self.nlist, MIN_NLIST // 2)

    def remove(self, seq: int) -> None:
        self._dead.append(seq)
        self.live -= 1
        if len(self._dead) > max(COMPACT_MIN, COMPACT_FRACTION * self.live):
            self.compact()

    def compact(self) -> None:
        """Take the removed seqs out of the structure, all in one pass."""
        if len(self._dead):
            dead = np.frombuffer(self._dead, dtype=np.int64)
            self._index.remove_ids(faiss.IDSelectorBatch(len(dead), faiss.swig_ptr(dead)))
            self._dead = array("q")

    def search(self, vec: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` (seqs, approximate cosines), best first; removed seqs may be among them
        (at most ``n`` more are asked for, as many as are pending removal)."""
        total = self._index.ntotal
        if total == 0 or n <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        want = min(n + min(len(self._dead), n), total)
        scores, seqs = self._index.search(np.asarray(vec, dtype=np.float32).reshape(1, -1), want)
        keep = seqs[0] >= 0
        return seqs[0][keep], scores[0][keep]

    def nbytes(self) -> int:
        """Resident estimate: codes and ids of every row the structure holds, centroids, the
        pending removals. IVF lists grown by single adds keep spare capacity on top (up to 2x
        a list's last growth; ~20% measured at 10^6 by bench.disk_tier), not counted."""
        total = self._index.ntotal
        if self.nlist == 0:
            per = 2 * self.dim + 8
        else:
            per = self.dim + 8
        return total * per + self.nlist * self.dim * 4 + 8 * len(self._dead)
