"""Compressed and hashed index kinds keep the only copy of an entry's vector
(``VectorStore.compact_entries``): their entries hold no float32 embedding, and every path
that needs one (snapshots, replication, demotion to disk, re-layouts, expiry ghosts) gets it
from the store. Float kinds keep theirs on the entry, as before."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from kafka import TopicPartition

from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from cache_core.settings import KafkaSettings
from cache_core.state.codec import decode_vec
from cache_core.state.persistence import Persistence
from cache_core.state.replication import EntryFollower, share
from cache_core.store.factory import Backends
from cache_core.store.faiss import IndexSpec, VectorIndex
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, experiment

DIM = 32
N = 120  # past ivf_sq_int8's training size at ivf_nlist=2 (78): the codes are the reference
RNG = np.random.default_rng(7)
VECS = RNG.standard_normal((N, DIM)).astype(np.float32)
VECS /= np.linalg.norm(VECS, axis=1, keepdims=True)
TABLE = {f"q{i}": VECS[i] for i in range(N)}
COMPACT = ["ivf_sq_int8", "sq_fp16", "hnsw_sq_int8", "semhash"]


def close_enough(kind: str) -> float:
    """Least cosine of a decoded vector with the original: int8 codes whose ranges were learnt
    from 78 random 32-d vectors clip a later one's extremes (0.937 seen); fp16 keeps ~1e-3."""
    return 0.9 if kind == "ivf_sq_int8" else 0.99


def arm(kind: str, **extra) -> ArmConfig:
    return ArmConfig(name="a", threshold=0.9, index_kind=kind, ivf_nlist=2, ivf_nprobe=2,
                     ann_check_rate=0.0, ttl_s=1000.0, **extra)


def make(kind: str, clock=None, backends: Backends | None = None, **extra):
    exp = experiment(arm(kind, **extra))
    clock = clock or ManualClock()
    cache = SemanticCache(TableEmbedder(dict(TABLE)), ExperimentRegistry({exp.experiment_id: exp}), clock=clock,
                          seed=1, backends=backends)
    return cache, clock


def fill(cache, n=N):
    for i in range(n):
        assert cache.store(f"q{i}", f"answer {i}", unit_id="u").stored


def entries(cache):
    return [e for p in cache.partitions() for e in p.entries.values()]


def assert_hits(cache, n=N, step=7):
    for i in range(0, n, step):
        result = cache.lookup(f"q{i}", unit_id="u")
        assert result.hit and result.answer == f"answer {i}", i


@pytest.mark.parametrize("kind", COMPACT)
def test_a_compressed_arms_entries_hold_no_float32_embedding(kind):
    cache, _ = make(kind)
    fill(cache)
    [partition] = cache.partitions()
    assert all(e.embedding is None for e in partition.entries.values())
    got = np.vstack(partition.vectors_of(list(partition.entries.values())))
    want = VECS[[int(e.query[1:]) for e in partition.entries.values()]]
    assert np.min((got * want).sum(1)) > close_enough(kind)  # decoded: fp16 or int8 codes
    assert_hits(cache)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_float_arms_keep_their_embedding_on_the_entry(kind):
    cache, _ = make(kind)
    fill(cache, 10)
    assert all(np.allclose(e.embedding, VECS[int(e.query[1:])], atol=1e-6) for e in entries(cache))


def test_ivf_codes_give_back_single_vectors_after_adds_and_removals():
    index = VectorIndex(DIM, IndexSpec("ivf_sq_int8", ivf_nlist=2))
    for i in range(N):
        index.add(f"e{i}", VECS[i])
    assert index.reference_precision == "codes"
    for i in range(0, N, 5):
        index.remove(f"e{i}")
    index.add("e1", VECS[3])  # replaced: a new internal id, in whichever list it lands
    kept = [i for i in range(N) if i % 5 and i != 1]
    one_by_one = np.vstack([index.vector(f"e{i}") for i in kept])
    assert np.allclose(one_by_one, index.vectors([f"e{i}" for i in kept]))
    assert np.min((one_by_one * VECS[kept]).sum(1)) > close_enough("ivf_sq_int8")
    assert float(index.vector("e1") @ VECS[3]) > close_enough("ivf_sq_int8")
    with pytest.raises(KeyError):
        index.vector("e0")


@pytest.mark.parametrize("kind", ["ivf_sq_int8", "hnsw_sq_int8"])
def test_snapshot_and_log_restore_a_compressed_arm(kind, tmp_path):
    cache, clock = make(kind)
    persistence = Persistence(tmp_path)
    persistence.open(cache)
    fill(cache, N // 2)
    persistence.snapshot()  # half from the snapshot (vectors read back from the store) ...
    for i in range(N // 2, N):
        cache.store(f"q{i}", f"answer {i}", unit_id="u")  # ... half from the log
    persistence.close(final_snapshot=False)

    restored, _ = make(kind, clock=clock)
    again = Persistence(tmp_path)
    report = again.open(restored)
    assert report.entries == N
    assert all(e.embedding is None for e in entries(restored))
    assert_hits(restored)
    again.snapshot()  # and a second generation, from a restored compact store
    again.close()
    third, _ = make(kind, clock=clock)
    last = Persistence(tmp_path)
    assert last.open(third).entries == N
    assert_hits(third, step=11)
    last.close()


class Feed:
    def __init__(self):
        self.messages = []

    def publish_entry(self, message) -> None:
        self.messages.append(message)


def test_replication_of_a_compressed_arm_sends_the_vector_it_was_stored_with():
    clock = ManualClock()
    a, _ = make("ivf_sq_int8", clock=clock)
    b, _ = make("ivf_sq_int8", clock=clock)
    feed = Feed()
    share(a, feed, "a", "m")
    kafka = KafkaSettings(entries_topic="entries.unit")
    follower = EntryFollower(kafka, b, "b", "m")
    fill(a)
    puts = [m for m in feed.messages if m.change == "put"]
    assert len(puts) == N
    for message in puts:  # the encoder's vector (to float rounding), not the codes' decoding
        assert np.allclose(decode_vec(message.embedding), VECS[int(message.entry["query"][1:])], atol=1e-6)
    tp = TopicPartition(kafka.entries_topic, 0)
    for offset, message in enumerate(feed.messages):
        follower._positions[tp] = offset + 1
        follower.handle(SimpleNamespace(value=message.model_dump_json().encode(), offset=offset), tp)
    follower.after_batch()
    assert follower.stats()["applied"] == N
    assert all(e.embedding is None for e in entries(b))
    assert_hits(b)


@pytest.mark.parametrize("kind", ["ivf_sq_int8", "sq_fp16"])
def test_demotion_to_disk_and_promotion_round_trip_on_a_compressed_arm(kind, tmp_path):
    cache, clock = make(kind, capacity_entries=N - 20, disk_entries=1000, backends=Backends(disk_dir=tmp_path))
    fill(cache)
    [partition] = cache.partitions()
    assert len(partition) == N - 20 and partition.cold() == 20
    cold = partition.disk.entries()
    assert all(e.embedding is not None and float(e.embedding @ VECS[int(e.query[1:])]) > close_enough(kind)
               for e in cold)
    result = cache.lookup(cold[0].query, unit_id="u")
    assert result.hit and result.answer == cold[0].answer and result.event.tier == "disk"
    promoted = partition.entries[cold[0].entry_id]
    assert promoted.embedding is None  # back in memory: the store holds its vector again
    assert all(e.embedding is None for e in partition.entries.values())


def test_a_relayout_between_float_and_compressed_kinds_moves_the_vector():
    cache, _ = make("ivf_sq_int8")
    fill(cache)
    [partition] = cache.partitions()
    partition.reconfigure(IndexSpec("flat"), partition.capacity_entries, partition.capacity_bytes)
    assert all(e.embedding is not None for e in partition.entries.values())  # given back, decoded
    partition.reconfigure(IndexSpec("sq_fp16"), partition.capacity_entries, partition.capacity_bytes)
    assert all(e.embedding is None for e in partition.entries.values())
    got = np.vstack(partition.vectors_of(list(partition.entries.values())))
    want = VECS[[int(e.query[1:]) for e in partition.entries.values()]]
    assert np.min((got * want).sum(1)) > close_enough("ivf_sq_int8")  # the int8 decoding, kept in fp16


def test_the_expiry_sweep_leaves_an_adaptive_compressed_arm_ghosts_with_vectors():
    cache, clock = make("sq_fp16", ttl_policy="adaptive", ttl_min_s=1.0, ttl_max_s=10.0)
    fill(cache, 5)
    clock.advance(100.0)
    assert cache.drop_expired() == 5
    life = cache.lifetimes._stores[cache.partitions()[0].key]
    assert len(life.ghosts) == 5
    assert all(float(g[0] @ VECS[i]) > 0.99 for i, g in enumerate(life.ghosts))


def test_same_text_lookup_survives_a_hash_collision_of_its_slot(monkeypatch):
    """``by_text`` keys are hashes (cache_core.store.partition._text_slot): a collision makes the
    earlier text unfindable as "the same question", never another text's entry found for it."""
    from cache_core.store import partition as partition_module

    cache, _ = make("sq_fp16")
    monkeypatch.setattr(partition_module, "_text_slot", lambda scope, key: 42)
    fill(cache, 2)
    [partition] = cache.partitions()
    assert partition.existing_same_text(None, "q0") is None  # q1 took the slot
    assert partition.existing_same_text(None, "  Q1 ").query == "q1"
    assert partition.existing_same_text("conversation", "q1") is None
    assert cache.store("q1", "newer", unit_id="u").reason == "updated"
    assert len(partition) == 2


def test_text_slots_are_small_ints():
    """A ``by_text`` key is an int under 2^60 (32 B, not the 48 B of a full 64-bit hash)."""
    import sys

    from cache_core.store.partition import _text_slot

    slots = [_text_slot(scope, f"question {i}") for i in range(2000) for scope in (None, "conversation")]
    assert all(0 <= s < 1 << 60 and sys.getsizeof(s) <= 32 for s in slots)
    assert len(set(slots)) == len(slots)


def test_drop_expired_lru_looks_only_at_the_lru_end():
    """Expired entries within ``EVICTION_SCAN`` of the LRU end go; one further in stays."""
    from cache_core.store.partition import EVICTION_SCAN

    cache, clock = make("flat")
    fill(cache, EVICTION_SCAN + 2)
    [partition] = cache.partitions()
    order = list(partition.entries)
    clock.advance(10 ** 7)  # every entry expired
    assert partition.drop_expired_lru(clock()) == EVICTION_SCAN
    assert list(partition.entries) == order[EVICTION_SCAN:]
