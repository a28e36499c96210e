"""An exact-text LRU in front of the encoder: a question asked again skips the model.

Keys are the query text exactly as received (no normalisation: two texts that differ in
a space may embed differently, and the cache must not change what the encoder would say).
Values are the L2-normalised vector and the norm before normalisation, as
``Embedder.encode_with_norms`` returns them. The encode time a hit saves is estimated
as the mean encode time per text of the recent misses (an exponentially weighted mean,
so a slower or faster machine shows within a few dozen encodes). Thread-safe.

``remembering`` puts one in front of a batch job's encoder: the judge's training meets each
banking77 question in four pairs or so, and encodes it once.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

SAVED_MS_WEIGHT = 0.05
"""Weight of the newest miss in the mean encode time (about the last 20 misses count)."""


@dataclass(frozen=True)
class CachedEmbedding:
    vec: np.ndarray
    norm: float
    saved_ms: float
    """The encode time this hit saved (the recent mean per text)."""


class EmbeddingCache:
    """Up to ``max_entries`` texts' embeddings, least recently used out first."""

    def __init__(self, max_entries: int):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._items: OrderedDict[str, tuple[np.ndarray, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._encode_ms: float | None = None
        self.hits = 0
        self.misses = 0
        self.saved_ms_total = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> CachedEmbedding | None:
        """The cached embedding of ``text`` (counted as a hit), or None (a miss)."""
        with self._lock:
            found = self._items.get(text)
            if found is None:
                self.misses += 1
                return None
            self._items.move_to_end(text)
            self.hits += 1
            saved = self._encode_ms or 0.0
            self.saved_ms_total += saved
            vec, norm = found
            return CachedEmbedding(vec, norm, saved)

    def put_many(self, texts: list[str], vecs: np.ndarray, norms: np.ndarray, encode_ms: float) -> None:
        """Remember the embeddings of one encoder call that took ``encode_ms`` for ``texts``."""
        if not texts:
            return
        per_text = encode_ms / len(texts)
        with self._lock:
            self._encode_ms = per_text if self._encode_ms is None else \
                (1 - SAVED_MS_WEIGHT) * self._encode_ms + SAVED_MS_WEIGHT * per_text
            for text, vec, norm in zip(texts, vecs, norms):
                vec = np.array(vec, dtype=np.float32)  # a copy: callers may reuse their batch
                self._items[text] = (vec, float(norm))
                self._items.move_to_end(text)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def stats(self) -> dict:
        with self._lock:
            looked_up = self.hits + self.misses
            return {"entries": len(self._items), "max_entries": self.max_entries, "hits": self.hits,
                    "misses": self.misses, "hit_rate": self.hits / looked_up if looked_up else None,
                    "saved_ms_total": round(self.saved_ms_total, 3),
                    "encode_ms_per_text": None if self._encode_ms is None else round(self._encode_ms, 3)}


def remembering(encode_with_norms: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
                max_entries: int) -> Callable[[Sequence[str]], np.ndarray]:
    """``texts -> unit vectors`` that asks the model only for the distinct texts it does not
    remember (the last ``max_entries``), in one call per batch."""
    cache = EmbeddingCache(max_entries)

    def encode(texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return encode_with_norms([])[0]
        vec_of, missing = {}, []
        for text in dict.fromkeys(texts):
            found = cache.get(text)
            if found is None:
                missing.append(text)
            else:
                vec_of[text] = found.vec
        if missing:
            started = time.perf_counter()
            vecs, norms = encode_with_norms(missing)
            cache.put_many(missing, vecs, norms, (time.perf_counter() - started) * 1000)
            vec_of.update(zip(missing, vecs))
        return np.stack([vec_of[t] for t in texts])

    encode.cache = cache  # its hit and miss counts, for the log
    return encode
