"""Contextual token vectors for the judge, from the cache's own sentence encoder.

The judge aligns word pieces of the two questions (``judge_features``), so it needs the
encoder's per-token output rather than the pooled sentence vector the cache indexes. The
same packaged weights serve both; nothing is downloaded. The token pass runs on the fp32
ONNX export (its second output), which setup makes beside the int8 one, and on torch only
where there is no export. Loaded once per process, on the
first lookup of an arm that has a judge.

A lookup's candidates are cached questions, and popular entries come back as candidates
lookup after lookup: their token vectors are kept in a bounded LRU by text, so a warm
lookup runs the encoder over the new question alone (about a fifth of the tokens with five
candidates) instead of re-encoding every candidate.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cache_core.decision.judge_features import TokenEncoder, TokenVectors

log = logging.getLogger(__name__)


REMEMBERED_TEXTS = 50_000
"""Distinct texts whose sentence vectors a training run keeps (~1.5 KB each at 384-d)."""
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
def token_encoder(model: str, models_dir: Path | None = None) -> TokenEncoder:
    """A thread-safe, caching ``TokenEncoder`` over ``model``."""
    return TokenVectorCache(uncached_token_encoder(model, models_dir))


def uncached_token_encoder(model: str, models_dir: Path | None = None) -> TokenEncoder:
    """The fp32 ONNX export's token output when there is one (or it can be made): torch-free,
    so a runtime install without the export extra can judge, and equal to the torch vectors
    the shared artifacts were trained on to ~1e-5. Else sentence-transformers on torch."""
    from cache_core.embedding.embedder import EmbedderError
    from cache_core.embedding.onnx import OnnxEmbedder

    try:
        onnx = OnnxEmbedder.load(model, quantized=False, models_dir=models_dir)
        onnx.token_vectors(["probe"])
    except EmbedderError as exc:
        log.info("judge token pass on torch", extra={"model": model, "why": str(exc)})
        return torch_token_encoder(model)
    return onnx_token_encoder(onnx)


def export_token_encoder(export_dir: Path) -> TokenEncoder:
    """A caching ``TokenEncoder`` over the ONNX export in ``export_dir`` (a judge's own tuned
    encoder, ``judge_encoder_tuning``); ``EmbedderError`` when it cannot run."""
    from cache_core.embedding.onnx import OnnxEmbedder

    onnx = OnnxEmbedder.from_dir(Path(export_dir), name=Path(export_dir).name, alone=False)
    onnx.token_vectors(["probe"])
    return TokenVectorCache(onnx_token_encoder(onnx))


def onnx_token_encoder(onnx) -> TokenEncoder:
    """Token vectors from an ``OnnxEmbedder``'s token output, one run at a time."""
    lock = threading.Lock()

    def encode(texts: Sequence[str]) -> list[TokenVectors]:
        with lock:  # one run at a time: ONNX Runtime already spreads one over the cores
            rows = onnx.token_vectors(list(texts))
        return [TokenVectors(_unit_rows(vectors), pieces, vectors.mean(axis=0)) for vectors, pieces in rows]

    return encode


def _unit_rows(e: np.ndarray) -> np.ndarray:
    e = np.asarray(e, dtype=np.float32)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-9)


def torch_token_encoder(model: str) -> TokenEncoder:
    from cache_core.embedding.embedder import load_unnormalised

    return sentence_transformer_token_encoder(load_unnormalised(model))


def sentence_transformer_token_encoder(st_model) -> TokenEncoder:
    """Token vectors from a loaded sentence-transformers model (training's tuned copies)."""
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
            raw = emb.float().numpy()[:len(pieces)]
            vectors.append(TokenVectors(_unit_rows(raw), pieces, raw.mean(axis=0)))
        return vectors

    return encode


def training_encoders(settings):
    """The cache's own sentence encoder, each distinct text encoded once (the shared sets repeat
    banking77's questions: 25,538 texts in the default run, 17,738 distinct), and the token pass
    (``token_encoder``, which remembers texts too). A second intra-op thread for the encoder saved
    10 s of a 2 min run for 30 s more CPU: not taken, training may share the machine with a cache."""
    from cache_core.embedding.cache import remembering
    from cache_core.embedding.load import load_embedder

    embedder = load_embedder(settings)
    encode = remembering(embedder.encode_with_norms, REMEMBERED_TEXTS)
    return encode, token_encoder(settings.model, settings.models_dir)
