"""The ONNX backends (``onnx`` / ``onnx-int8``, the default): the export, made here once per
machine from the local weights (never downloaded) and keyed by their files and the library
versions, and ``OnnxEmbedder``, which runs it on ONNX Runtime (the package docstring of
cache_core.embedding.embedder says why the export is ours).

Making an export needs the ``export`` extra (torch, sentence-transformers, onnx); running one
needs only onnxruntime and tokenizers. Without the extra (a plain ``pip install .``, the runtime
image) an existing export is used as it is, whatever its key, and a missing one is an error
that says how to build it (``python -m cache_core.embedding.export``, or copy the directory).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
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


ONNX_RECIPE = 3
"""Bump when the export recipe changes: every cached export is then redone."""
ONNX_OPSET = 17
ONNX_FILE = "model.onnx"
TOKEN_OUTPUT = "token_embeddings"
"""The graph's second output: per-token vectors before pooling (for the judge)."""
TOKEN_BATCH = 32
"""Texts per run of the token pass (sorted by length first, so each run pads little)."""
ENCODING_VERSION = 2
"""Bump when a text's vector changes while the export does not, so stored vectors and feature
caches keyed by it are redone (2: an int8 export runs each text alone, ``OnnxEmbedder``)."""
META_FILE = "export.json"
EXPORT_EXTRA = ("torch", "sentence_transformers", "onnx")
"""What making an export imports (the ``export`` extra); running one imports none of it."""
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


def _weight_files(location: str) -> tuple[Path, list[Path]] | None:
    root = Path(location)
    if not root.is_dir():
        return None
    return root, sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)


def _weights_fingerprint(location: str) -> list[list]:
    """Name, size and sha256 of the model's files: new weights re-export, a reinstall of the
    same ones (another virtualenv sharing SCACHE_HOME: new mtimes) does not. About 0.5 s for MiniLM."""
    found = _weight_files(location)
    if found is None:
        return [[location]]
    root, files = found
    out = []
    for path in files:
        with open(path, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        out.append([str(path.relative_to(root)), path.stat().st_size, digest])
    return out


def _weights_stat(location: str) -> list[list]:
    """Name, size and mtime of the model's files: the free check tried before hashing them."""
    found = _weight_files(location)
    if found is None:
        return [[location]]
    root, files = found
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def export_key(model: str, quantized: bool, weights=_weights_fingerprint) -> dict:
    """What an export depends on; a cached export is reused only if this matches."""
    return {"recipe": ONNX_RECIPE, "opset": ONNX_OPSET, "model": model, "int8": quantized,
            "weights": weights(resolve_model_path(model)), "versions": _versions()}


def _stat_key(model: str, quantized: bool) -> dict:
    return export_key(model, quantized, weights=_weights_stat)


def onnx_export_dir(model: str, quantized: bool, models_dir: Path | None = None) -> Path:
    """``<models_dir or scache_home()/models>/<name>-onnx[-int8]``."""
    if models_dir is None:
        from cache_core.runtime import scache_home

        models_dir = scache_home() / "models"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or model)
    return Path(models_dir) / f"{name}-onnx{'-int8' if quantized else ''}"


def can_export() -> bool:
    """Whether the ``export`` extra is installed, judged without importing it (torch takes seconds)."""
    for name in EXPORT_EXTRA:
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def _read_meta(target: Path) -> dict | None:
    try:
        return json.loads((target / META_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_current(target: Path, model: str, quantized: bool) -> bool:
    """The export in ``target`` was made from these weights with these versions: the same files by
    mtime (free), else by content (the weights are hashed only then)."""
    meta = _read_meta(target)
    if meta is None or not (target / ONNX_FILE).is_file():
        return False
    if meta.get("stat_key") == _stat_key(model, quantized):
        return True
    return meta.get("key") == export_key(model, quantized)


def ensure_onnx_export(model: str, quantized: bool = False, models_dir: Path | None = None) -> Path:
    """The directory of an up-to-date ONNX export of ``model``, exporting it if needed.

    Safe across processes (a file lock; the directory appears by an atomic rename,
    metadata written last). The int8 variant is quantised from the fp32 export.
    Without the ``export`` extra the existing directory is returned unchecked (``installed_export``).
    """
    target = onnx_export_dir(model, quantized, models_dir)
    if not can_export():
        return installed_export(target, model)
    if _is_current(target, model, quantized):
        return target
    fp32 = ensure_onnx_export(model, False, models_dir) if quantized else None
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(target, model, quantized):  # another process finished it meanwhile
            return target
        log.warning("exporting the encoder to ONNX (once per machine and weights; about 20-60 s)",
                    extra={"model": model, "int8": quantized, "dir": str(target)})
        staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        started = time.perf_counter()
        try:
            if quantized:
                report = _quantize(fp32, staging)
            else:
                report = export_fp32(model, staging)
            report["export_s"] = round(time.perf_counter() - started, 2)
            meta = {"key": export_key(model, quantized), "stat_key": _stat_key(model, quantized), "report": report}
            (staging / META_FILE).write_text(json.dumps(meta, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, EmbedderError):
                raise
            raise EmbedderError(f"ONNX export of {model!r} failed: {exc}") from exc
    log.info("onnx export ready", extra={"model": model, "dir": str(target), **report})
    return target


def installed_export(target: Path, model: str) -> Path:
    """``target`` if it holds an export (a runtime without the ``export`` extra cannot check
    its key against the weights, nor make one), else an error saying how to get one."""
    if (target / ONNX_FILE).is_file() and (target / "tokenizer.json").is_file():
        meta = _read_meta(target) or {}
        made_for = meta.get("key", {}).get("model")
        if made_for not in (None, model):
            log.warning("onnx export was made for another model", extra={"dir": str(target), "made_for": made_for})
        return target
    raise EmbedderError(
        f"no ONNX export of {model!r} in {target}, and this install cannot make one (the export extra, "
        f"torch + sentence-transformers + onnx, is not installed): run `python -m cache_core.embedding.export` "
        f"where `pip install 'scache[export]'` is installed and copy {target.name}/ to {target.parent}/ "
        f"(or point SCACHE_CACHE__MODELS_DIR at where it is)")


class _Traceable:
    """Builds the torch module that ``torch.onnx.export`` traces: tokens -> raw pooled vector, and
    (second output) the contextual token vectors the judge aligns (``judge_tokens``)."""

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
                return features["sentence_embedding"], features["token_embeddings"]

        return Pooled().eval()


def export_fp32(model: str, staging: Path) -> dict:
    import torch

    st_model = load_unnormalised(model)
    features = st_model.preprocess(EXPORT_PROBES[:2])
    input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]
    args = tuple(features[n] for n in input_names)
    axes = {n: {0: "batch", 1: "tokens"} for n in input_names} | {"embedding": {0: "batch"},
                                                                   TOKEN_OUTPUT: {0: "batch", 1: "tokens"}}
    with torch.no_grad():
        torch.onnx.export(_Traceable.wrap(st_model, input_names), args, str(staging / ONNX_FILE),
                          input_names=input_names, output_names=["embedding", TOKEN_OUTPUT],
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
    return {"probe_min_cosine_vs_fp32": _probe_agreement(staging, reference, alone=True)}


def _probe_agreement(export_dir: Path, reference: np.ndarray, alone: bool = False) -> float:
    """Smallest cosine between the export's and the reference's probe vectors;
    an export that disagrees with its source is refused, not cached."""
    got = OnnxEmbedder.from_dir(export_dir, threads=1, alone=alone).encode(EXPORT_PROBES)
    worst = float(np.min(np.sum(got * normalise(reference)[0], axis=1)))
    if worst < 0.95:
        raise EmbedderError(f"ONNX export disagrees with its source (min cosine {worst:.4f})")
    return round(worst, 6)


def _export_is_int8(export_dir: Path) -> bool:
    try:
        return bool(json.loads((export_dir / META_FILE).read_text())["key"]["int8"])
    except (OSError, ValueError, KeyError, TypeError):
        return export_dir.name.endswith("-int8")  # a copied export without its metadata


class OnnxEmbedder:
    """An exported model on ONNX Runtime (CPU): tokenise, run, normalise.

    The graph outputs the raw pooled vector, so ``encode_with_norms`` reports the
    same pre-normalisation norm as the torch backend.

    An int8 export runs each text alone (``alone``). Its quantisation is dynamic: every
    MatMul's input scale is taken from the whole input tensor, padding and the other texts of
    the batch included, so a text's vector depended on what it was batched with (banking77:
    cosine to itself alone down to 0.982, pair cosines moved by up to 0.08), and a store
    encoded in a batch disagreed with a lookup of the same text encoded on its own. Alone,
    a text has one vector, a little closer to fp32's (min cosine 0.9885 vs 0.9865 on 400
    banking77 questions), at about the same CPU per text as padded batches (less for long texts).
    """

    def __init__(self, session, tokenizer, input_names: list[str], name: str, export_dir: Path,
                 alone: bool = False):
        self.alone = alone
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = input_names
        self.name = name
        self.export_dir = export_dir
        self.dim = int(session.get_outputs()[0].shape[-1])
        self.load_s = 0.0

    @classmethod
    def load(cls, model: str, quantized: bool = False, threads: int | None = None,
             models_dir: Path | None = None) -> "OnnxEmbedder":
        """Export (once per machine) and load ``model``."""
        started = time.perf_counter()
        embedder = cls.from_dir(ensure_onnx_export(model, quantized, models_dir), threads, name=model)
        embedder.load_s = time.perf_counter() - started
        log.info("embedding model loaded", extra={
            "model": model, "backend": "onnx-int8" if quantized else "onnx", "dim": embedder.dim,
            "threads": threads, "load_s": round(embedder.load_s, 2)})
        return embedder

    @classmethod
    def from_dir(cls, export_dir: Path, threads: int | None = None, name: str = "",
                 alone: bool | None = None) -> "OnnxEmbedder":
        """``alone``: run each text by itself (None: if the export's metadata says int8)."""
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
        if alone is None:
            alone = _export_is_int8(export_dir)
        return cls(session, tokenizer, settings["inputs"], name or export_dir.name, export_dir, alone)

    def _feeds(self, texts: list[str], encoded=None) -> dict[str, np.ndarray]:
        encoded = encoded if encoded is not None else self._tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encoded)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, enc in enumerate(encoded):
            n = len(enc.ids)
            ids[row, :n], mask[row, :n], types[row, :n] = enc.ids, 1, enc.type_ids
        named = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: named[name] for name in self._input_names}

    def token_vectors(self, texts: list[str]) -> list[tuple[np.ndarray, list[str]]]:
        """Per text: its contextual token vectors (raw) and its word pieces, [CLS] and [SEP]
        included, from the graph's second output (exports of recipe 3 on)."""
        if TOKEN_OUTPUT not in {o.name for o in self._session.get_outputs()}:
            raise EmbedderError(f"{self.export_dir} has no {TOKEN_OUTPUT} output (an older export: remake it "
                                "with python -m cache_core.embedding.export)")
        texts = list(texts)
        encoded = self._tokenizer.encode_batch(texts)
        rows: list = [None] * len(texts)
        # By length, in chunks: one run over a whole training batch pads every text to the longest
        # (MRPC: ~2x the work); the masked padding leaves the real tokens' vectors as they are.
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        step = 1 if self.alone else TOKEN_BATCH
        for start in range(0, len(order), step):
            chunk = order[start:start + step]
            part = [encoded[i] for i in chunk]
            out = self._session.run([TOKEN_OUTPUT], self._feeds([texts[i] for i in chunk], part))[0]
            for row, i in enumerate(chunk):
                rows[i] = (out[row, :len(part[row].ids)], list(part[row].tokens))
        return rows

    def encode_with_norms(self, texts: list[str], batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32)
        # Sort by length so each chunk pads to similar lengths, then restore order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        raw = np.empty((len(texts), self.dim), dtype=np.float32)
        batch_size = 1 if self.alone else batch_size
        for start in range(0, len(texts), batch_size):
            chunk = order[start:start + batch_size]
            out = self._session.run(["embedding"], self._feeds([texts[i] for i in chunk]))[0]
            raw[chunk] = out
        return normalise(raw)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.encode_with_norms(texts)[0]
