"""Is a fresh upstream answer the same answer as the cached one? Pluggable checks.

An ``Equivalence`` is any callable ``(cached, fresh) -> Comparison``. Two ship here:

* ``ExactMatch``: equal after normalising (case, Unicode form, punctuation, whitespace). Strict: a
  model that words the same answer differently each time makes every check "wrong", so use it for
  deterministic upstreams (temperature 0, templated answers).
* ``EmbeddingCosine``: the cosine of the two answers' embeddings, by the cache's own encoder, at
  its own threshold (``SCACHE_SHADOW__COSINE_THRESHOLD``), not the lookup threshold.

Extension point (not built): a judge endpoint, e.g. an LLM asked "do these two answers say the
same thing?". Implement the callable (it runs on a shadow worker thread, off the request path,
so it may block on HTTP) and pass it to ``ShadowChecker(equivalence=...)``.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cache_core.settings import ShadowSettings


@dataclass(frozen=True)
class Comparison:
    same: bool
    score: float | None = None
    """The check's own score (cosine for EmbeddingCosine, 1/0 for ExactMatch)."""


class Equivalence(Protocol):
    name: str

    def __call__(self, cached: str, fresh: str) -> Comparison: ...


_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", _PUNCT.sub(" ", text)).strip()


class ExactMatch:
    name = "exact"

    def __call__(self, cached: str, fresh: str) -> Comparison:
        same = normalise(cached) == normalise(fresh)
        return Comparison(same, 1.0 if same else 0.0)


class EmbeddingCosine:
    """``encode(texts) -> (n, d)`` rows, as ``Embedder.encode`` (normalised or not: it normalises)."""

    name = "cosine"

    def __init__(self, encode, threshold: float):
        if threshold is None or not 0 < threshold <= 1:
            raise ValueError(f"cosine threshold must be in (0, 1], got {threshold!r}")
        self.encode = encode
        self.threshold = threshold

    def __call__(self, cached: str, fresh: str) -> Comparison:
        if normalise(cached) == normalise(fresh):
            return Comparison(True, 1.0)
        vecs = np.asarray(self.encode([cached, fresh]), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1)
        if not np.all(norms > 0):
            return Comparison(False, 0.0)
        score = float(vecs[0] @ vecs[1] / (norms[0] * norms[1]))
        return Comparison(score >= self.threshold, score)


def from_settings(settings: ShadowSettings, encode) -> Equivalence:
    if settings.equivalence == "exact":
        return ExactMatch()
    return EmbeddingCosine(encode, settings.cosine_threshold)
