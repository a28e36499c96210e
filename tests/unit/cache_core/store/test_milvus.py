"""Index kind ``milvus`` (cache_core.store.milvus) on milvus-lite: an arm serves from it,
replicas on one Milvus share the vectors (each serving only what its own metadata knows),
removals and clears delete from the collection, the ANN check compares it with exact
search, and a failing Milvus falls back to the local twin."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from cache_core.store import milvus as milvus_store
from cache_core.store.factory import new_index
from cache_core.store.faiss import IndexSpec
from tests.unit.cache_core.helpers import (ManualClock, RecordingSink, TableEmbedder, at_cosine,
                                           experiment, unit_vec)
from tests.unit.cache_core.store.milvus_helpers import milvus_backends

E0 = unit_vec(1.0)
TABLE = {"stored": E0, "asked": at_cosine(0.9), "far": unit_vec(0.0, 0.0, 1.0)}


def replica(backends, table=TABLE, **arm):
    arm = ArmConfig(name="m", threshold=0.8, index_kind="milvus", ann_check_rate=1.0, **arm)
    exp = experiment(arm)
    clock = ManualClock()
    cache = SemanticCache(TableEmbedder(dict(table)), ExperimentRegistry({exp.experiment_id: exp}),
                          clock=clock, event_sink=RecordingSink(), seed=1, backends=backends)
    return cache, clock


def collection_ids(backends, key=("default", "exp", "m")) -> set[str]:
    client = milvus_store.client(backends.milvus)
    rows = client.query(milvus_store.collection_name(key), filter='id != ""', output_fields=["id"])
    return {row["id"] for row in rows}


def test_an_arm_of_kind_milvus_serves_hits_and_says_so(tmp_path):
    cache, _ = replica(milvus_backends(tmp_path))
    stored = cache.store("stored", "the answer", unit_id="u")
    result = cache.lookup("asked", unit_id="u")
    assert result.hit and result.answer == "the answer" and result.similarity == pytest.approx(0.9, abs=1e-5)
    assert cache.stores.all()[0].indexes[""].kind == "milvus"
    assert not cache.lookup("far", unit_id="u").hit
    assert collection_ids(cache.stores.backends) == {stored.entry_id}


def test_replicas_share_vectors_and_serve_only_entries_they_know(tmp_path):
    backends = milvus_backends(tmp_path)
    first, _ = replica(backends)
    second, _ = replica(backends)
    first.store("stored", "the answer", unit_id="u")
    # The vector is in the shared collection, but the second replica has no metadata (no
    # answer) for it until the entry reaches it: it must miss, not fail.
    assert len(collection_ids(backends)) == 1
    assert not second.lookup("asked", unit_id="u").hit
    entry = next(iter(first.stores.all()[0].entries.values()))
    second.stores.for_key(("default", "exp", "m")).insert(entry)  # what replication applies
    assert second.lookup("asked", unit_id="u").hit
    assert len(collection_ids(backends)) == 1  # the same row, upserted again


def test_removal_on_one_replica_deletes_the_shared_vector(tmp_path):
    backends = milvus_backends(tmp_path)
    first, _ = replica(backends)
    second, _ = replica(backends)
    first.store("stored", "the answer", unit_id="u")
    partition = first.stores.all()[0]
    entry = next(iter(partition.entries.values()))
    second.stores.for_key(("default", "exp", "m")).insert(entry)
    with partition.lock:
        partition.remove(entry.entry_id)  # eviction / expiry / invalidation on the first
    assert collection_ids(backends) == set()
    # Fleet-wide: the second still holds the metadata but no longer finds the vector.
    assert not second.lookup("asked", unit_id="u").hit


def test_expiry_deletes_from_the_collection(tmp_path):
    cache, clock = replica(milvus_backends(tmp_path), ttl_s=10.0)
    cache.store("stored", "the answer", unit_id="u")
    clock.advance(11)
    assert not cache.lookup("asked", unit_id="u").hit
    assert collection_ids(cache.stores.backends) == set()


def test_a_clear_deletes_the_vectors_the_replica_knew(tmp_path):
    cache, _ = replica(milvus_backends(tmp_path))
    cache.store("stored", "the answer", unit_id="u")
    assert cache.clear_namespace("default") == 1
    assert collection_ids(cache.stores.backends) == set()
    assert not cache.lookup("asked", unit_id="u").hit


def test_scopes_are_searched_apart_in_one_collection(tmp_path):
    backends = milvus_backends(tmp_path)
    key = ("ns", "exp", "arm")
    spec = IndexSpec(kind="milvus")
    scoped, unscoped = new_index(8, spec, backends, key, "conv-1"), new_index(8, spec, backends, key, None)
    scoped.add("in-conversation", E0)
    unscoped.add("global", E0)
    assert [e for e, _ in scoped.search(E0, 5)] == ["in-conversation"]
    assert [e for e, _ in unscoped.search(E0, 5)] == ["global"]


def test_search_matches_exact_and_ann_marks_work(tmp_path):
    index = new_index(16, IndexSpec(kind="milvus"), milvus_backends(tmp_path), ("ns", "exp", "arm"))
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((200, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index.add_many([f"e{i}" for i in range(200)], vecs)
    for query in vecs[:20] + 0.1 * rng.standard_normal((20, 16)).astype(np.float32):
        got, exact = index.search(query, 5), index.exact_search(query, 5)
        assert [e for e, _ in got] == [e for e, _ in exact]
        assert got[0][1] == pytest.approx(exact[0][1], abs=1e-6)
    mark = index.mark()
    assert mark.index is index and index.internal_id("e0") < mark.next_id


def test_an_unreachable_milvus_falls_back_to_the_local_twin(tmp_path):
    from cache_core.store.factory import Backends
    from cache_core.store.milvus import MilvusConfig

    milvus_backends(tmp_path)  # skip where pymilvus is missing
    backends = Backends(milvus=MilvusConfig(uri="http://127.0.0.1:9"))  # nothing listens there
    index = new_index(8, IndexSpec(kind="milvus"), backends, ("ns", "exp", "arm"))
    index.add("a", E0)
    index.add("b", unit_vec(0.0, 1.0))
    assert index.remove("b")
    assert index.search(E0, 1)[0][0] == "a" and index.failures >= 3
    assert set(index._unsent) == {"a"} and index._undeleted == {"b"}  # sent once Milvus is back
    milvus_store._down_until.clear()


def test_kind_milvus_without_a_uri_is_refused():
    with pytest.raises(ValueError, match="MILVUS_URI"):
        new_index(8, IndexSpec(kind="milvus"), None)


def test_a_new_process_finds_the_collection_released_and_loads_it(tmp_path):
    backends = milvus_backends(tmp_path)
    index = new_index(8, IndexSpec(kind="milvus"), backends, ("ns", "exp", "arm"))
    index.add("a", E0)
    milvus_store.client(backends.milvus).release_collection(index.collection)
    milvus_store._collections.clear()  # as a restarted process knows none
    again = new_index(8, IndexSpec(kind="milvus"), backends, ("ns", "exp", "arm"))
    again.add("a", E0)
    assert again.search(E0, 1)[0][0] == "a" and again.failures == 0
