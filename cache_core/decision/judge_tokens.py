"""Contextual token vectors for the judge, from the cache's own sentence encoder.

The judge aligns word pieces of the two questions (``judge_features``), so it needs the
encoder's per-token output rather than the pooled sentence vector the cache indexes. The
same packaged weights serve both; nothing is downloaded. Loaded once per process, on the
first lookup of an arm that has a judge.

A lookup's candidates are cached questions, and popular entries come back as candidates
lookup after lookup: their token vectors are kept in a bounded LRU by text, so a warm
lookup runs the encoder over the new question alone (about a fifth of the tokens with five
candidates) instead of re-encoding every candidate.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from cache_core.decision.judge_features import TokenVectors
from cache_core.decision.judge_model import TokenEncoder


CACHED_TEXTS = 8192
"""Token vectors kept per process (a short question's are ~15 x 384 floats: ~25 KB each)."""


class TokenVectorCache:
    """A bounded LRU of ``TokenVectors`` by text in front of an uncached ``TokenEncoder``."""

    def __init__(self, encode: TokenEncoder, capacity: int = CACHED_TEXTS):
        self._encode = encode
        self._capacity = capacity
        self._entries: OrderedDict[str, TokenVectors] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0
        """Texts that went through the encoder (the rest came from the cache)."""

    def __call__(self, texts: Sequence[str]) -> list[TokenVectors]:
        texts = list(texts)
        with self._lock:
            found = {t: self._entries[t] for t in texts if t in self._entries}
            for t in found:
                self._entries.move_to_end(t)
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            fresh = dict(zip(missing, self._encode(missing)))
            found.update(fresh)
            with self._lock:
                self.encoded += len(missing)
                self._entries.update(fresh)
                while len(self._entries) > self._capacity:
                    self._entries.popitem(last=False)
        return [found[t] for t in texts]


@functools.lru_cache(maxsize=4)
def token_encoder(model: str) -> TokenEncoder:
    """A thread-safe, caching ``TokenEncoder`` over ``model`` (sentence-transformers, CPU, offline)."""
    return TokenVectorCache(uncached_token_encoder(model))


def uncached_token_encoder(model: str) -> TokenEncoder:
    from cache_core.embedding.embedder import load_unnormalised

    st_model = load_unnormalised(model)
    tokenizer = st_model.tokenizer
    max_length = int(st_model.max_seq_length)
    lock = threading.Lock()

    def encode(texts: Sequence[str]) -> list[TokenVectors]:
        texts = list(texts)
        with lock:  # one forward pass at a time: torch already uses every core for one
            outputs = st_model.encode(texts, output_value="token_embeddings", convert_to_numpy=False,
                                      batch_size=64, show_progress_bar=False)
        vectors = []
        for text, emb in zip(texts, outputs):
            pieces = tokenizer.convert_ids_to_tokens(
                tokenizer(text, truncation=True, max_length=max_length)["input_ids"])
            e = emb.float().numpy()[:len(pieces)]
            e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-9)
            vectors.append(TokenVectors(e, pieces))
        return vectors

    return encode
