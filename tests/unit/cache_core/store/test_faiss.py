"""FAISS index kinds: ANN vs exact agreement, deletion and tombstones, IVF training."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.store.faiss import IVF_POINTS_PER_LIST, IndexSpec, VectorIndex


def clustered_vectors(n: int, dim: int = 32, centers: int = 20, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    middles = rng.standard_normal((centers, dim))
    vecs = middles[rng.integers(0, centers, n)] + 0.3 * rng.standard_normal((n, dim))
    return (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)


def filled(spec: IndexSpec, vecs: np.ndarray) -> VectorIndex:
    index = VectorIndex(vecs.shape[1], spec)
    for i, vec in enumerate(vecs):
        index.add(f"e{i}", vec)
    return index


SPECS = [IndexSpec("flat"), IndexSpec("hnsw", hnsw_m=16, hnsw_ef_search=64),
         IndexSpec("ivf", ivf_nlist=8, ivf_nprobe=4)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_ann_agrees_with_exact_search(spec):
    vecs = clustered_vectors(1000)
    index = filled(spec, vecs)
    queries = clustered_vectors(100, seed=1)
    agree, recall = 0, 0.0
    for query in queries:
        ann, exact = index.search(query, 5), index.exact_search(query, 5)
        agree += ann[0][0] == exact[0][0]
        recall += len({e for e, _ in ann} & {e for e, _ in exact}) / 5
    assert agree / len(queries) >= 0.9 and recall / len(queries) >= 0.85
    if spec.kind == "flat":
        assert agree == len(queries)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_scores_are_cosine_and_self_is_top1(spec):
    vecs = clustered_vectors(400)
    index = filled(spec, vecs)
    entry, score = index.search(vecs[7], 1)[0]
    assert entry == "e7" and score == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_removed_ids_never_come_back(spec):
    vecs = clustered_vectors(400)
    index = filled(spec, vecs)
    for i in range(0, 400, 2):
        assert index.remove(f"e{i}")
    assert not index.remove("e0") and len(index) == 200
    for i in range(0, 40, 2):
        found = [e for e, _ in index.search(vecs[i], 5)] + [e for e, _ in index.exact_search(vecs[i], 5)]
        assert all(int(e[1:]) % 2 == 1 for e in found) and len(found) == 10


def test_hnsw_rebuilds_once_tombstones_exceed_fraction():
    vecs = clustered_vectors(100)
    index = VectorIndex(vecs.shape[1], IndexSpec("hnsw"), rebuild_fraction=0.2)
    for i, vec in enumerate(vecs):
        index.add(f"e{i}", vec)
    for i in range(16):
        index.remove(f"e{i}")
    assert index.rebuilds == 0 and len(index._tombstones) == 16
    index.remove("e16")  # 17 tombstones > 0.2 * 83 live
    assert index.rebuilds == 1 and not index._tombstones
    assert index.search(vecs[50], 1)[0][0] == "e50"


def test_ivf_is_flat_until_enough_vectors_then_trains():
    spec = IndexSpec("ivf", ivf_nlist=4, ivf_nprobe=4)
    vecs = clustered_vectors(IVF_POINTS_PER_LIST * 4 + 10)
    index = VectorIndex(vecs.shape[1], spec)
    for i in range(IVF_POINTS_PER_LIST * 4 - 1):
        index.add(f"e{i}", vecs[i])
    assert not index.trained
    index.add("last", vecs[-1])
    assert index.trained
    assert index.search(vecs[3], 1)[0][0] == "e3"  # nprobe == nlist: exact


def test_readding_an_id_replaces_its_vector():
    vecs = clustered_vectors(10)
    index = filled(IndexSpec("flat"), vecs)
    index.add("e0", vecs[5])
    assert len(index) == 10
    assert index.vector("e0") == pytest.approx(vecs[5])


def test_empty_index_searches_return_nothing():
    index = VectorIndex(8, IndexSpec("hnsw"))
    assert index.search(np.ones(8, dtype=np.float32), 3) == []
    assert index.exact_search(np.ones(8, dtype=np.float32), 3) == []
