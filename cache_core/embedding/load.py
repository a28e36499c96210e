"""The configured encoder (``CacheSettings.encoder_backend``)."""
from __future__ import annotations

from cache_core.embedding.embedder import Embedder, EmbedderError, SentenceTransformerEmbedder
from cache_core.embedding.onnx import OnnxEmbedder
from cache_core.settings import CacheSettings


def load_embedder(cache: CacheSettings) -> Embedder:
    """The configured backend; the model is loaded (and for ONNX exported, once) here."""
    if cache.encoder_backend == "torch":
        return SentenceTransformerEmbedder(cache.model, threads=cache.encoder_threads)
    if cache.encoder_backend in ("onnx", "onnx-int8"):
        return OnnxEmbedder.load(cache.model, quantized=cache.encoder_backend == "onnx-int8",
                                 threads=cache.encoder_threads, models_dir=cache.models_dir)
    raise EmbedderError(f"unknown encoder_backend {cache.encoder_backend!r}")
