"""The exact-text embedding cache (cache_core.embedding.cache) and its part in lookups,
stores and events."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cache_core.embedding.cache import EmbeddingCache, remembering
from cache_core.events import CacheEvent, clickhouse_columns
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import TableEmbedder
from tests.unit.cache_core.test_cache import make_cache

E0 = np.eye(8, dtype=np.float32)[0]


def vec(i: int) -> np.ndarray:
    return np.eye(8, dtype=np.float32)[i % 8]


def test_lru_keeps_the_most_recent_texts_and_counts():
    cache = EmbeddingCache(2)
    cache.put_many(["a", "b"], np.stack([vec(0), vec(1)]), np.array([1.0, 2.0]), encode_ms=10.0)
    assert cache.get("a").norm == 1.0  # "a" is now the most recent
    cache.put_many(["c"], vec(2)[None], np.array([3.0]), encode_ms=5.0)
    assert cache.get("b") is None and len(cache) == 2
    assert cache.get("c").vec == pytest.approx(vec(2)) and cache.get("a") is not None
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (3, 1) and stats["hit_rate"] == pytest.approx(0.75)


def test_a_remembering_encoder_asks_the_model_once_per_distinct_text_and_keeps_the_order():
    calls: list[list[str]] = []
    table = {t: vec(i) * (i + 2) for i, t in enumerate("abcd")}  # raw vectors: norms 2..5

    def model(texts):
        calls.append(list(texts))
        raw = np.stack([table[t] for t in texts]) if texts else np.zeros((0, 8), np.float32)
        norms = np.linalg.norm(raw, axis=1)
        return raw / np.maximum(norms, 1e-9)[:, None], norms

    encode = remembering(model, max_entries=2)
    first = encode(["a", "b", "a"])
    assert calls == [["a", "b"]]
    assert first == pytest.approx(np.stack([vec(0), vec(1), vec(0)]))
    assert encode(["b", "c", "a"]) == pytest.approx(np.stack([vec(1), vec(2), vec(0)]))
    assert calls[1] == ["c"]  # "a" and "b" remembered
    encode(["a", "b"])  # two remembered: "c" pushed out "b", the least recently used
    assert calls[2] == ["b"]
    assert encode([]).shape == (0, 8)


def test_saved_time_is_the_recent_mean_encode_time_per_text():
    cache = EmbeddingCache(10)
    cache.put_many(["a", "b"], np.stack([vec(0), vec(1)]), np.ones(2), encode_ms=20.0)  # 10 per text
    assert cache.get("a").saved_ms == pytest.approx(10.0)
    cache.put_many(["c"], vec(2)[None], np.ones(1), encode_ms=30.0)
    assert 10.0 < cache.get("a").saved_ms < 30.0
    assert cache.stats()["saved_ms_total"] > 20.0


def test_texts_are_exact_keys_and_stored_vectors_are_copies():
    cache = EmbeddingCache(10)
    batch = np.stack([vec(0)])
    cache.put_many(["Hello"], batch, np.ones(1), encode_ms=1.0)
    batch[0] = 0.0  # the caller reuses its buffer
    assert cache.get("hello") is None and cache.get("Hello ") is None
    assert cache.get("Hello").vec == pytest.approx(vec(0))
    with pytest.raises(ValueError):
        EmbeddingCache(0)


class CountingEmbedder(TableEmbedder):
    def __init__(self, table):
        super().__init__(table)
        self.texts: list[str] = []

    def encode_with_norms(self, texts):
        self.texts += list(texts)
        return super().encode_with_norms(texts)


def counted_cache(**kwargs):
    cache, clock, sink, exp = make_cache({"q": E0, "other": vec(3)}, **kwargs)
    cache.embedder = CountingEmbedder(cache.embedder.table)
    return cache, sink


def test_a_repeated_question_skips_the_encoder_and_says_so_in_its_event():
    cache, sink = counted_cache(embedding_cache=EmbeddingCache(100))
    first = cache.lookup("q", unit_id="u")
    cache.store("q", "answer", unit_id="u")  # the reply to the miss: no second encode
    again = cache.lookup("q", unit_id="u")
    assert cache.embedder.texts == ["q"]
    assert not first.hit and again.hit
    events = [e for e in sink.events if e.decision != "none"]
    assert (events[0].embed_cached, events[0].embed_saved_ms) == (False, 0.0)
    assert events[-1].embed_cached and events[-1].embed_saved_ms >= 0.0
    stats = cache.embedding_cache.stats()
    assert stats["hits"] == 2 and stats["misses"] == 1


def test_async_lookups_use_it_too():
    cache, sink = counted_cache(embedding_cache=EmbeddingCache(100))
    asyncio.run(cache.lookup_async("q", unit_id="u"))
    asyncio.run(cache.lookup_async("q", unit_id="u"))
    assert cache.embedder.texts == ["q"] and sink.events[-1].embed_cached


def test_a_batch_store_encodes_only_the_texts_it_lacks():
    from cache_core.records import StoreItem
    cache, _ = counted_cache(embedding_cache=EmbeddingCache(100))
    cache.lookup("q", unit_id="u")
    cache.store_many([StoreItem("q", "a1", "u"), StoreItem("other", "a2", "u")])
    assert cache.embedder.texts == ["q", "other"]
    assert cache.lookup("other", unit_id="u").hit


def test_without_it_every_text_is_encoded():
    cache, sink = counted_cache()
    cache.lookup("q", unit_id="u")
    cache.lookup("q", unit_id="u")
    assert cache.embedder.texts == ["q", "q"] and not sink.events[-1].embed_cached


def test_the_event_schema_and_settings_carry_it():
    columns = dict(clickhouse_columns(CacheEvent))
    assert columns["embed_cached"] == "Bool" and columns["embed_saved_ms"] == "Float64"
    names = list(columns)
    assert names.index("embed_cached") == names.index("embed_ms") + 1
    assert Settings().cache.embedding_cache_entries == 10_000
