"""Contextual token vectors for the judge, from the cache's own sentence encoder.

The judge aligns word pieces of the two questions (``judge_features``), so it needs the
encoder's per-token output rather than the pooled sentence vector the cache indexes. The
same packaged weights serve both; nothing is downloaded. Loaded once per process, on the
first lookup of an arm that has a judge.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import numpy as np

from cache_core.decision.judge_features import TokenVectors
from cache_core.decision.judge_model import TokenEncoder


@functools.lru_cache(maxsize=4)
def token_encoder(model: str) -> TokenEncoder:
    """A thread-safe ``TokenEncoder`` over ``model`` (sentence-transformers, CPU, offline)."""
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
