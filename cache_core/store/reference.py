"""What a ``VectorIndex`` re-scores candidates from and what the ANN check's exact scan
reads: its reference copy of the vectors, at the precision its kind needs.

* ``fp32`` (``flat``, ``ivf``, ``hnsw``, and every kind before its structure is trained):
  an ``IndexIDMap2(IndexFlatIP)``, 4 B per dimension. For ``flat`` it is the index itself;
  the float kinds keep it because their structure holds floats anyway.
* ``fp16`` (the kinds whose own scores are too coarse to serve: int4 codes, PQ, graphs over
  SQ codes, semantic hashes): an ``IndexIDMap2(IndexScalarQuantizer(fp16))``, 2 B per
  dimension. Candidates' cosines come from it: within ~1e-3 of float32 on unit vectors
  (fp16 keeps 11 significant bits per component).
* ``codes`` (``sq_fp16`` / ``sq_int8`` / ``ivf_sq_fp16`` / ``ivf_sq_int8``): no copy at
  all. The structure's own codes are the reference: its scores are already what a re-score
  from them would give, and the exact scan reads them (decoded for the flat scalar
  quantisers, an exhaustive ``search_preassigned`` over the inverted lists for IVF). The ANN
  check then measures what probing loses, not what int8 quantisation loses against float32
  (``bench/index_kinds.py`` measures that offline).

Every reference gives vectors back (``vectors``: decoded for fp16 and codes), which is how a
store of a compressed kind is the only holder of its entries' vectors
(``VectorIndex.compact_entries``): fp16 and fp32 through the id map's reverse table, a flat
quantiser's codes by a binary search of its (sorted) ids, and IVF codes in the list each id
was added to, which ``CodesReference`` remembers (2 B per id).

Which kind keeps which: ``cache_core.store.kinds.reference_precision``. Until a kind that
trains is trained, its reference is ``fp32`` and answers every search; at training it is
converted (and the float copy freed).
"""
from __future__ import annotations

import faiss
import numpy as np


def top_k_block(rows: np.ndarray, row_ids: np.ndarray, mat: np.ndarray, k: int,
                before: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per query (row of ``mat``), the top-k (scores, ids) among ``rows``, in no particular
    order, shape (queries, min(k, rows)); with ``before``, rows whose id is at or after a
    query's bound score -inf for it."""
    # One GEMM instead of a GEMV per query. Rows x queries, not the transpose: OpenBLAS
    # then streams the block once (measured, 10^5 x 384 in 2048-row blocks, 1 thread:
    # 8 queries 31 ms against 49 ms, 64 queries 67 against 75).
    queries = len(mat)
    scores = rows @ mat.T  # (rows, queries)
    if before is not None and len(row_ids) and row_ids.max() >= before.min():  # most blocks: nothing newer
        scores[row_ids[:, None] >= before[None, :]] = -np.inf
    if scores.shape[0] > k:
        top = np.argpartition(scores, -k, axis=0)[-k:]  # (k, queries)
        scores = scores[top, np.arange(queries)]
    else:
        top = np.broadcast_to(np.arange(scores.shape[0])[:, None], scores.shape)
    return scores.T, row_ids[top].T.astype(np.int64)


def _empty(queries: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((queries, 0), dtype=np.float32), np.zeros((queries, 0), dtype=np.int64)


class FlatReference:
    """Rows of float32 or fp16 under their internal ids; adds and removals go to it."""

    owns_rows = True

    def __init__(self, dim: int, precision: str = "fp32"):
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"a flat reference is fp32 or fp16, got {precision!r}")
        self.dim = dim
        self.precision = precision
        inner = faiss.IndexFlatIP(dim) if precision == "fp32" else \
            faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        self.index = faiss.IndexIDMap2(inner)

    @property
    def ntotal(self) -> int:
        return self.index.ntotal

    def add(self, mat: np.ndarray, ids: np.ndarray) -> None:
        self.index.add_with_ids(mat, ids)

    def remove(self, ids: np.ndarray) -> None:
        self.index.remove_ids(ids)

    def search(self, mat: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(mat, k)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        return self.index.reconstruct_batch(np.asarray(internal_ids, dtype=np.int64))

    def rows(self) -> int:
        return self.index.ntotal

    def _rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) as float32 (fp32: without copying) and their ids."""
        inner = faiss.downcast_index(self.index.index)
        total = inner.ntotal
        ids = faiss.rev_swig_ptr(self.index.id_map.data(), total)[start:stop]
        if self.precision == "fp32":
            rows = faiss.rev_swig_ptr(inner.get_xb(), total * self.dim).reshape(total, self.dim)
            return rows[start:stop], ids
        codes = faiss.rev_swig_ptr(inner.codes.data(), total * inner.code_size).reshape(total, -1)
        return inner.sa_decode(codes[start:stop]), ids

    def block_many(self, mat: np.ndarray, start: int, stop: int, k: int,
                   before: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        start, stop = max(0, start), min(stop, self.index.ntotal)
        if stop <= start or k <= 0:
            return _empty(len(mat))
        rows, ids = self._rows(start, stop)
        return top_k_block(rows, ids, mat, k, before)

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        if self.index.ntotal == 0:
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.int64)
        rows, ids = self._rows(0, self.index.ntotal)
        return np.array(rows, dtype=np.float32), np.array(ids, dtype=np.int64)

    def nbytes(self) -> int:
        """Codes and ids (the id map's reverse table is extra, ~40 B per entry)."""
        inner = faiss.downcast_index(self.index.index)
        return self.index.ntotal * (inner.code_size + 8)


class CodesReference:
    """The ANN structure's own scalar-quantiser codes (``IndexIDMap(IndexScalarQuantizer)``
    or ``IndexIVFScalarQuantizer``): adds and removals go to the structure, not here."""

    owns_rows = False
    precision = "codes"

    def __init__(self, structure, dim: int):
        self.structure = structure
        self.dim = dim
        ivf = faiss.try_extract_index_ivf(structure)
        self._ivf = faiss.downcast_index(ivf) if ivf is not None else None
        self._offsets: np.ndarray | None = None  # IVF: where each list starts in row order
        self._centroids: np.ndarray | None = None
        # IVF: the inverted list of each internal id (ids only grow; a removed id's slot goes
        # stale), so one entry's codes are found in its list, not by scanning all of them:
        # 2 B per id ever added (4 B past 65,535 lists).
        self._list_of = np.zeros(0, dtype=np.uint16 if self._ivf is None or self._ivf.nlist <= 65535
                                 else np.int32)
        if self._ivf is not None:
            for lst in range(self._ivf.nlist):
                size = self._ivf.invlists.list_size(lst)
                if size:
                    self._note_lists(faiss.rev_swig_ptr(self._ivf.invlists.get_ids(lst), size), lst)

    @property
    def ntotal(self) -> int:
        return self.structure.ntotal

    def changed(self) -> None:
        """The structure gained or lost rows: list offsets are stale."""
        self._offsets = None

    def add(self, mat: np.ndarray, ids: np.ndarray) -> None:
        """Add rows to the structure (the IVF lists they go to remembered)."""
        if self._ivf is None:
            self.structure.add_with_ids(mat, ids)
        else:  # assign once, and add to the lists that assignment names
            assign = self._ivf.quantizer.assign(mat, 1).reshape(-1).astype(np.int64)
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            self._ivf.add_core(len(mat), faiss.swig_ptr(mat), faiss.swig_ptr(ids), faiss.swig_ptr(assign))
            self._note_lists(ids, assign)
        self.changed()

    def search(self, mat: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._ivf is None:  # a flat scalar quantiser scans everything already
            return self.structure.search(mat, k)
        return self.structure.search(mat, k, params=faiss.SearchParametersIVF(nprobe=self._ivf.nlist))

    def rows(self) -> int:
        return self.structure.ntotal

    def block_many(self, mat: np.ndarray, start: int, stop: int, k: int,
                   before: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        start, stop = max(0, start), min(stop, self.structure.ntotal)
        if stop <= start or k <= 0:
            return _empty(len(mat))
        if self._ivf is None:
            rows, ids = self._flat_rows(start, stop)
            return top_k_block(rows, ids, mat, k, before)
        return self._ivf_block(mat, start, stop, k, before)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        """The decoded codes of live ``internal_ids``, in their order: for a flat quantiser
        by a binary search of its id map (ids are added in increasing order and removal
        keeps the order), for IVF in each id's own list. KeyError for an id not held."""
        internal_ids = np.asarray(internal_ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(internal_ids), self.dim), dtype=np.float32)
        if len(internal_ids) == 0:
            return out
        if self._ivf is None:
            inner = faiss.downcast_index(self.structure.index)
            total = inner.ntotal
            row_ids = faiss.rev_swig_ptr(self.structure.id_map.data(), total)
            rows = np.searchsorted(row_ids, internal_ids)
            rows = np.minimum(rows, max(total - 1, 0))
            if total == 0 or not np.array_equal(row_ids[rows], internal_ids):
                raise KeyError(f"internal ids not held: {internal_ids[row_ids[rows] != internal_ids][:5]}")
            codes = faiss.rev_swig_ptr(inner.codes.data(), total * inner.code_size).reshape(total, -1)
            return inner.sa_decode(np.ascontiguousarray(codes[rows]))
        known = internal_ids < len(self._list_of)
        if not known.all():
            raise KeyError(f"internal ids not held: {internal_ids[~known][:5]}")
        lists = self._list_of[internal_ids].astype(np.int64)
        for lst in np.unique(lists):
            wanted = np.flatnonzero(lists == lst)
            found = self._ivf_rows(int(lst), internal_ids[wanted])
            out[wanted] = found
        return out

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        if self._ivf is None:
            rows, ids = self._flat_rows(0, self.structure.ntotal)
            return np.array(rows, dtype=np.float32), np.array(ids, dtype=np.int64)
        parts = [self._ivf_list(lst) for lst in range(self._ivf.nlist)]
        rows = [r for r, _ in parts if len(r)]
        ids = [i for _, i in parts if len(i)]
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.int64)
        return np.vstack(rows), np.concatenate(ids).astype(np.int64)

    def nbytes(self) -> int:
        return 0  # counted in the structure

    # -- internals --------------------------------------------------------------------

    def _note_lists(self, ids: np.ndarray, lists) -> None:
        top = int(ids.max()) + 1 if len(ids) else 0
        if top > len(self._list_of):  # grown geometrically: adds come one at a time
            grown = np.zeros(max(top, 2 * len(self._list_of)), dtype=self._list_of.dtype)
            grown[:len(self._list_of)] = self._list_of
            self._list_of = grown
        self._list_of[ids] = lists

    def _ivf_rows(self, lst: int, internal_ids: np.ndarray) -> np.ndarray:
        """The decoded rows of ``internal_ids``, all in list ``lst``."""
        ivf, invlists = self._ivf, self._ivf.invlists
        size = invlists.list_size(lst)
        if size == 0:
            raise KeyError(f"internal ids not in list {lst}: {internal_ids[:5]}")
        ids = faiss.rev_swig_ptr(invlists.get_ids(lst), size)
        if len(internal_ids) <= 4:  # one pass each (a demotion, an expiry)
            at = np.array([int(np.argmax(ids == i)) for i in internal_ids], dtype=np.int64)
        else:  # lists are in add order, not id order once rebuilt: sort once
            order = np.argsort(ids, kind="stable")
            at = order[np.minimum(np.searchsorted(ids, internal_ids, sorter=order), size - 1)]
        if not np.array_equal(ids[at], internal_ids):
            raise KeyError(f"internal ids not in list {lst}: {internal_ids[:5]}")
        codes = faiss.rev_swig_ptr(invlists.get_codes(lst), size * ivf.code_size).reshape(size, -1)
        rows = ivf.sq.decode(np.ascontiguousarray(codes[at]))
        if ivf.by_residual:
            rows += ivf.quantizer.reconstruct(lst)
        return rows

    def _flat_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        inner = faiss.downcast_index(self.structure.index)
        total = inner.ntotal
        ids = faiss.rev_swig_ptr(self.structure.id_map.data(), total)[start:stop]
        codes = faiss.rev_swig_ptr(inner.codes.data(), total * inner.code_size).reshape(total, -1)
        return inner.sa_decode(codes[start:stop]), ids

    def _ivf_list(self, lst: int) -> tuple[np.ndarray, np.ndarray]:
        ivf, invlists = self._ivf, self._ivf.invlists
        size = invlists.list_size(lst)
        if size == 0:
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.int64)
        codes = faiss.rev_swig_ptr(invlists.get_codes(lst), size * ivf.code_size).reshape(size, -1)
        rows = ivf.sq.decode(codes)
        if ivf.by_residual:
            rows += ivf.quantizer.reconstruct(lst)
        return rows, faiss.rev_swig_ptr(invlists.get_ids(lst), size).copy()

    def _ivf_block(self, mat: np.ndarray, start: int, stop: int, k: int,
                   before: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) in list order, by whole lists: the lists that start there."""
        ivf = self._ivf
        if self._offsets is None:
            sizes = np.array([ivf.invlists.list_size(lst) for lst in range(ivf.nlist)], dtype=np.int64)
            self._offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            self._centroids = ivf.quantizer.reconstruct_n(0, ivf.nlist)
        lists = np.flatnonzero((self._offsets >= start) & (self._offsets < stop))
        queries = len(mat)
        if len(lists) == 0:
            return _empty(queries)
        assign = np.ascontiguousarray(np.broadcast_to(lists, (queries, len(lists))), dtype=np.int64)
        coarse = np.ascontiguousarray(mat @ self._centroids[lists].T, dtype=np.float32)
        scores = np.empty((queries, k), dtype=np.float32)
        ids = np.empty((queries, k), dtype=np.int64)
        bounds = [None] * queries if before is None else [int(b) for b in before]
        for q, bound in enumerate(bounds):  # one call per query: each has its own bound
            params = faiss.SearchParametersIVF(nprobe=len(lists))
            selector = None
            if bound is not None and bound < np.iinfo(np.int64).max:
                selector = faiss.IDSelectorRange(0, bound)
                params.sel = selector
            ivf.search_preassigned_c(1, faiss.swig_ptr(mat[q]), k, faiss.swig_ptr(assign[q]),
                                     faiss.swig_ptr(coarse[q]), faiss.swig_ptr(scores[q]),
                                     faiss.swig_ptr(ids[q]), False, params)
            del selector
        missing = ids < 0
        scores[missing] = -np.inf
        return scores, ids
