"""The disk tier (cache_core.store.disk_tier): an arm holds more entries than its memory
budget, cold entries are found, served, promoted on a hit and say so in the event; expiry,
invalidation, purges and clears reach them; the file survives a reopen."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.records import EntryMatch
from cache_core.registry import ExperimentRegistry
from cache_core.store.disk_tier import DiskTier
from cache_core.store.factory import Backends
from tests.unit.cache_core.helpers import ManualClock, RecordingSink, TableEmbedder, experiment

DIM = 16


def basis(i: int) -> np.ndarray:
    vec = np.zeros(DIM, dtype=np.float32)
    vec[i] = 1.0
    return vec


def near(i: int) -> np.ndarray:
    vec = basis(i)
    vec[(i + 1) % DIM] = 0.3
    return vec / np.linalg.norm(vec)


TABLE = {**{f"q{i}": basis(i) for i in range(DIM)}, **{f"ask{i}": near(i) for i in range(DIM)}}


def make(tmp_path, capacity=3, disk=100, **arm):
    arm = ArmConfig(name="a", threshold=0.9, capacity_entries=capacity, disk_entries=disk,
                    ann_check_rate=0.0, **arm)
    exp = experiment(arm)
    clock, sink = ManualClock(), RecordingSink()
    cache = SemanticCache(TableEmbedder(dict(TABLE)), ExperimentRegistry({exp.experiment_id: exp}),
                          clock=clock, event_sink=sink, seed=1, backends=Backends(disk_dir=tmp_path))
    return cache, clock, sink


def partition(cache):
    return cache.stores.all()[0]


def fill(cache, clock, n):
    for i in range(n):
        cache.store(f"q{i}", f"answer {i}", unit_id="u")
        clock.advance(1)


def test_an_arm_holds_more_than_its_memory_budget(tmp_path):
    cache, clock, _ = make(tmp_path)
    fill(cache, clock, 8)
    store = partition(cache)
    assert len(store) == 3 and store.cold() == 5 and store.evictions == 0
    assert store.disk.memory_bytes() < 5 * DIM * 4 + 5 * 200


def test_a_cold_hit_is_served_promoted_and_logged_as_disk(tmp_path):
    cache, clock, sink = make(tmp_path)
    fill(cache, clock, 8)
    store = partition(cache)
    assert "q0" not in {e.query for e in store.entries.values()}
    result = cache.lookup("ask0", unit_id="u")
    assert result.hit and result.answer == "answer 0" and result.similarity == pytest.approx(1 / np.sqrt(1.09), abs=2e-3)
    cache.flush_events()
    assert sink.events[-1].tier == "disk"
    assert "q0" in {e.query for e in store.entries.values()} and len(store) == 3 and store.cold() == 5
    assert store.disk.promotions == 1
    again = cache.lookup("ask0", unit_id="u")
    cache.flush_events()
    assert again.hit and sink.events[-1].tier == "memory"
    assert not cache.lookup("q15", unit_id="u").hit
    cache.flush_events()
    assert sink.events[-1].tier is None


def test_without_a_disk_tier_novel_entries_are_refused_under_pressure(tmp_path):
    cache, clock, _ = make(tmp_path, disk=0)
    fill(cache, clock, 8)  # all novel: past 3 the memory is full and they are refused
    store = partition(cache)
    assert len(store) == 3 and store.cold() == 0 and store.disk is None
    assert cache.lookup("ask0", unit_id="u").hit and not cache.lookup("ask5", unit_id="u").hit


def test_the_disk_tier_drops_its_oldest_past_capacity(tmp_path):
    cache, clock, _ = make(tmp_path, disk=2)
    fill(cache, clock, 8)
    store = partition(cache)
    assert store.cold() == 2 and store.disk.evictions == 3
    assert not cache.lookup("ask0", unit_id="u").hit and cache.lookup("ask4", unit_id="u").hit


def test_expired_cold_entries_are_not_served_and_are_swept(tmp_path):
    cache, clock, _ = make(tmp_path, ttl_s=100.0)
    fill(cache, clock, 8)
    clock.advance(95)  # q0..q2 (stored first) are past 100 s, q3.. not yet
    assert not cache.lookup("ask0", unit_id="u").hit
    assert cache.lookup("ask4", unit_id="u").hit
    clock.advance(100)
    assert cache.drop_expired() >= 4 and partition(cache).cold() == 0


def test_invalidation_purge_and_clear_reach_the_disk(tmp_path):
    cache, clock, _ = make(tmp_path)
    fill(cache, clock, 8)
    store = partition(cache)
    cold = [e for e in store.disk.entries() if e.query == "q1"][0]
    with store.lock:
        assert store.remove(cold.entry_id).query == "q1"  # a "wrong" verdict's removal
    assert not cache.lookup("ask1", unit_id="u").hit
    assert cache.purge("default", EntryMatch(query="q2")) == 1
    assert not cache.lookup("ask2", unit_id="u").hit
    assert cache.clear_namespace("default") == 3 + 3
    assert not cache.lookup("ask3", unit_id="u").hit


def test_the_file_survives_a_reopen(tmp_path):
    tier = DiskTier(tmp_path / "t.sqlite", DIM, 10)
    cache, clock, _ = make(tmp_path / "other")
    fill(cache, clock, 4)
    entry = next(iter(partition(cache).entries.values()))
    tier.put(entry)
    tier.close()
    again = DiskTier(tmp_path / "t.sqlite", DIM, 10)
    assert len(again) == 1 and again.search(entry.embedding, None, 1)[0][0] == entry.entry_id
    loaded = again.load(entry.entry_id)
    assert loaded.answer == entry.answer and loaded.expires_at() == pytest.approx(entry.expires_at())
    assert np.allclose(loaded.embedding, entry.embedding, atol=1e-3)


def test_scoped_cold_entries_answer_only_their_scope(tmp_path):
    cache, clock, _ = make(tmp_path)
    for i in range(6):
        cache.store(f"q{i}", f"answer {i}", unit_id="u", scope="conv")
        clock.advance(1)
    assert partition(cache).cold() == 3
    assert cache.lookup("ask0", unit_id="u", scope="conv").hit
    assert not cache.lookup("ask1", unit_id="u").hit


def test_the_tier_maps_ids_through_its_file_and_evicts_by_seq(tmp_path):
    cache, clock, _ = make(tmp_path / "src")
    fill(cache, clock, 6)
    entries = list(partition(cache).entries.values()) + partition(cache).disk.entries()
    tier = DiskTier(tmp_path / "t.sqlite", DIM, 3)
    for entry in entries[:4]:
        tier.put(entry)
    assert len(tier) == 3 and tier.evictions == 1 and entries[0].entry_id not in tier
    tier.put(entries[1])  # re-demoted: a new seq, so it is the newest now
    tier.put(entries[4])
    assert entries[1].entry_id in tier and entries[2].entry_id not in tier and len(tier) == 3
    assert tier.take(entries[3].entry_id).entry_id == entries[3].entry_id and len(tier) == 2
    assert tier.take(entries[3].entry_id) is None and not tier.remove(entries[3].entry_id)
    tier.close()
    again = DiskTier(tmp_path / "t.sqlite", DIM, 3)
    assert len(again) == 2 and {e.entry_id for e in again.entries()} == {entries[1].entry_id, entries[4].entry_id}
    assert again.search(entries[4].embedding, None, 1)[0][0] == entries[4].entry_id


def cold_entry(i: int, vec: np.ndarray, scope: str | None = None):
    from cache_core.records import CacheEntry

    return CacheEntry(entry_id=f"e{i}", query=f"q {i}", embedding=vec, answer=f"a {i}", created_at=0.0,
                      ttl_s=1e9, ttl_policy="absolute", max_age_s=1e9, namespace="default",
                      intent_cluster=-1, scope=scope)


def test_a_large_tier_searches_int8_inverted_lists_and_rescores_from_the_file(tmp_path, monkeypatch):
    from cache_core.store import cold_codes

    monkeypatch.setattr(cold_codes, "MIN_NLIST", 4)  # IVF from 156 entries, not 2,496
    monkeypatch.setattr(cold_codes, "MAX_NLIST", 16)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((800, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    tier = DiskTier(tmp_path / "t.sqlite", DIM, 701, train_in_background=False)
    for i, vec in enumerate(vecs):
        tier.put(cold_entry(i, vec))
    tier.put(cold_entry(10_000, vecs[0], scope="conv"))  # another scope: its own (flat) codes
    assert len(tier) == 701 and tier.evictions == 100 and tier.rebuilds == 3
    codes = tier._codes[""]
    assert codes.nlist == 16 and codes.live == 700 and "e99" not in tier and "e100" in tier
    found = [tier.search(vecs[i], None, 3) for i in range(100, 800)]
    hits = sum(f[0][0] == f"e{i}" for i, f in zip(range(100, 800), found))
    assert hits >= 0.9 * 700  # nprobe 8 of 16 lists on random 16-d vectors
    assert all(f[0][1] == pytest.approx(1.0, abs=2e-3) for i, f in zip(range(100, 800), found) if f[0][0] == f"e{i}")
    assert tier.search(vecs[0], "conv", 1) == [("e10000", pytest.approx(1.0, abs=2e-3))]
    assert all(e != "e0" for e, _ in tier.search(vecs[0], None, 5))  # evicted: not in the file
    for i in range(100, 200):
        assert tier.remove(f"e{i}")
    assert codes.live == 600 and codes._index.ntotal < 700  # removals compacted in batches
    assert all(e != "e150" for e, _ in tier.search(vecs[150], None, 5))
    assert tier.memory_bytes() < 700 * (DIM + 8) + 16 * DIM * 4 + 8 * 64 + 2 * (2 * DIM + 8)
    tier.close()
    again = DiskTier(tmp_path / "t.sqlite", DIM, 701)
    assert len(again) == 601 and again._codes[""].nlist == 8 and again._codes[""].live == 600
    assert again.search(vecs[500], None, 1)[0][0] == "e500" and "e150" not in again
    assert again.search(vecs[0], "conv", 1)[0][0] == "e10000"


def test_put_many_is_put_in_one_transaction(tmp_path):
    rng = np.random.default_rng(1)
    vecs = rng.standard_normal((6, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    tier = DiskTier(tmp_path / "t.sqlite", DIM, 4)
    tier.put_many([cold_entry(i, vec) for i, vec in enumerate(vecs)] + [cold_entry(5, vecs[5])])
    assert len(tier) == 4 and tier.evictions == 2 and tier.demotions == 7 and "e1" not in tier
    assert tier.search(vecs[5], None, 1)[0][0] == "e5"
    tier.close()
    assert len(DiskTier(tmp_path / "t.sqlite", DIM, 4)) == 4


def test_growing_lists_are_trained_on_a_thread_while_the_old_codes_serve(tmp_path, monkeypatch):
    """The k-means of a scope's next lists runs off the partition's lock: the demotion that finds
    the codes outgrown only starts it, the old codes keep serving and taking demotions, and the first
    demotion after it ended fills and swaps in the trained lists."""
    from cache_core.store import cold_codes

    monkeypatch.setattr(cold_codes, "MIN_NLIST", 4)  # IVF from 156 entries, not 2,496
    monkeypatch.setattr(cold_codes, "MAX_NLIST", 16)
    release = threading.Event()
    train = cold_codes.ColdCodes.train

    def slow_train(codes, sample):  # the k-means, held until the test lets it go
        assert threading.current_thread().name == "scache-disk-tier-train"
        release.wait(30)
        train(codes, sample)

    monkeypatch.setattr(cold_codes.ColdCodes, "train", slow_train)
    rng = np.random.default_rng(2)
    vecs = rng.standard_normal((400, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    tier = DiskTier(tmp_path / "t.sqlite", DIM, 1000)
    for i in range(200):  # past 156: outgrown, a thread starts training 4 lists
        tier.put(cold_entry(i, vecs[i]))
    assert "" in tier._training and tier._training[""][0].is_alive()
    assert tier._codes[""].nlist == 0 and tier.rebuilds == 0  # the flat codes still serve
    assert tier.search(vecs[10], None, 1)[0][0] == "e10"
    for i in range(200, 300):  # demotions while it trains: taken by the old codes
        tier.put(cold_entry(i, vecs[i]))
    assert tier._codes[""].live == 300 and tier.rebuilds == 0
    release.set()
    tier._training[""][0].join(30)
    tier.put(cold_entry(300, vecs[300]))  # the first demotion after: fills and swaps
    assert tier.rebuilds == 1 and tier._codes[""].nlist > 0 and tier._codes[""].live == 301
    found = sum(tier.search(vecs[i], None, 1)[0][0] == f"e{i}" for i in range(301))
    assert found >= 0.9 * 301
    tier.clear()
    assert not tier._training
    tier.close()
