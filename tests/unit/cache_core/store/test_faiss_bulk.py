"""VectorIndex.add_many: one FAISS call, same answers as adding one by one."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.embedding.embedder import normalise
from cache_core.store.faiss import IndexSpec, VectorIndex


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_add_many_matches_add(kind):
    rng = np.random.default_rng(3)
    vecs = normalise(rng.standard_normal((3000, 16)).astype(np.float32))[0]
    ids = [f"e{i}" for i in range(len(vecs))]
    spec = IndexSpec(kind, ivf_nlist=8, ivf_nprobe=8)
    bulk, single = VectorIndex(16, spec), VectorIndex(16, spec)
    bulk.add_many(ids, vecs)
    for entry_id, vec in zip(ids, vecs):
        single.add(entry_id, vec)
    assert len(bulk) == len(single) == 3000
    for query in vecs[:20]:
        assert bulk.exact_search(query, 3) == single.exact_search(query, 3)
        assert bulk.search(query, 1)[0][0] == bulk.exact_search(query, 1)[0][0]
    assert bulk.remove("e5") and "e5" not in bulk


def test_add_many_refuses_existing_ids():
    index = VectorIndex(4)
    index.add("a", np.array([1, 0, 0, 0], dtype=np.float32))
    with pytest.raises(ValueError, match="new, distinct"):
        index.add_many(["a"], np.eye(4, dtype=np.float32)[:1])
