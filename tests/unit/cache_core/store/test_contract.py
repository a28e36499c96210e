"""Every vector index kind meets the contract partitions use (cache_core.store.base)."""
from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from cache_core.experiments import IndexKind
from cache_core.store.base import VectorStore
from cache_core.store.factory import new_index
from cache_core.store.faiss import IndexSpec
from tests.unit.cache_core.store.milvus_helpers import milvus_backends

CONTRACT = [name for name in vars(VectorStore) if not name.startswith("_") or name == "__len__"]


@pytest.mark.parametrize("kind", list(get_args(IndexKind)))
def test_index_kinds_meet_the_vector_store_contract(kind, tmp_path):
    backends = milvus_backends(tmp_path) if kind == "milvus" else None
    index = new_index(4, IndexSpec(kind=kind, pq_m=2), backends, key=("ns", "exp", kind))
    assert {"add", "remove", "search", "mark", "exact_block_many"} <= set(CONTRACT)
    assert all(callable(getattr(index, name, None)) or name in ("kind", "compact_entries")
               for name in CONTRACT)
    index.add("a", np.array([1, 0, 0, 0], dtype=np.float32))
    assert len(index) == 1 and index.kind == kind and index.search(np.array([1, 0, 0, 0], dtype=np.float32), 1)[0][0] == "a"
    assert index.remove("a") and not index.remove("a") and len(index) == 0
    assert index.search(np.array([1, 0, 0, 0], dtype=np.float32), 1) == []
