"""The ONNX backends (``onnx`` / ``onnx-int8``): the export, made here once per machine
from the local weights (never downloaded) and keyed by their files and the library
versions, and ``OnnxEmbedder``, which runs it on ONNX Runtime (the package docstring of
cache_core.embedding.embedder says why the export is ours).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from cache_core.embedding.embedder import EmbedderError, load_unnormalised, normalise, resolve_model_path

log = logging.getLogger(__name__)


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
