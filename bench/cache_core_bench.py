"""Timings of the online path: model load, single encode, FAISS search per index kind,
and lookup latency over HTTP with 10^4 cached entries (banking77 train texts).

    python -m bench.cache_core_bench [--entries 10000] [--lookups 200]

Prints one JSON object. Runs everything in-process on loopback; a null publisher
stands in for Kafka so only the cache path is timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid

import httpx
import numpy as np
import pandas as pd
import uvicorn

from cache_core.records import CacheEntry, entry_bytes
from cache_core.embedding.load import load_embedder
from cache_core.store.faiss import IndexSpec, VectorIndex, set_search_threads
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import CacheSettings, Settings
from infra.runtime import free_port, wait_until
from infra.runtime import BANKING77_DIR

BANKING77 = BANKING77_DIR


class NullPublisher:
    def publish_event(self, event) -> None: ...
    def publish_feedback(self, feedback) -> None: ...
    def stats(self) -> dict:
        return {}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def time_encode(embedder, texts: list[str]) -> dict:
    samples = []
    for text in texts:
        started = time.perf_counter()
        embedder.encode([text])
        samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": statistics.median(samples), "p95_ms": percentile(samples, 95)}


def time_index_kinds(vectors: np.ndarray, queries: np.ndarray) -> dict:
    out = {}
    for spec in (IndexSpec("flat"), IndexSpec("hnsw"), IndexSpec("ivf", ivf_nlist=64, ivf_nprobe=8)):
        started = time.perf_counter()
        index = VectorIndex(vectors.shape[1], spec)
        for i, vec in enumerate(vectors):
            index.add(str(i), vec)
        build_s = time.perf_counter() - started
        samples, agree = [], 0
        for query in queries:
            started = time.perf_counter()
            ann = index.search(query, 5)
            samples.append((time.perf_counter() - started) * 1000)
            agree += ann[0][0] == index.exact_search(query, 5)[0][0]
        out[spec.kind] = {"build_s": round(build_s, 2), "search_p50_ms": statistics.median(samples),
                          "search_p95_ms": percentile(samples, 95),
                          "top1_agreement": agree / len(queries)}
    return out


def fill_cache(app, texts: list[str], vectors: np.ndarray, categories: list[str]) -> None:
    """Insert pre-encoded entries straight into every arm's partition (fast fill)."""
    cache = app.state.components.cache
    experiment = cache.registry.get()
    now = time.time()
    for arm in experiment.arms:
        partition = cache.stores.for_arm("default", experiment, arm)
        for text, vec, category in zip(texts, vectors, categories):
            partition.insert(CacheEntry(
                entry_id=uuid.uuid4().hex, query=text, embedding=vec, answer=category,
                created_at=now, ttl_s=3600, ttl_policy="absolute", max_age_s=86400,
                namespace="default", intent_cluster=cache.clusters.assign(vec, update=False),
                approx_bytes=entry_bytes(text, category, vec)))


def time_http_lookups(embedder, texts, vectors, categories, questions: list[str]) -> dict:
    app = create_app(build_components(Settings(service={"open_access": True}), NullPublisher(), embedder))
    fill_cache(app, texts, vectors, categories)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{base}/healthz").status_code == 200, 30, "bench app")
    samples, hits, server_ms = [], 0, []
    with httpx.Client(base_url=base) as client:
        for i, question in enumerate(questions):
            started = time.perf_counter()
            body = client.post("/v1/lookup", json={"query": question, "unit_id": f"u{i}"}).json()
            samples.append((time.perf_counter() - started) * 1000)
            hits += body["hit"]
            server_ms.append(body["latency_ms"])
    server.should_exit = True
    thread.join(timeout=10)
    return {"entries_per_arm": len(texts), "lookups": len(questions),
            "http_p50_ms": statistics.median(samples), "http_p95_ms": percentile(samples, 95),
            "in_service_p50_ms": statistics.median(server_ms), "hit_rate": hits / len(questions)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--lookups", type=int, default=200)
    args = parser.parse_args()
    set_search_threads(1)  # as the service does
    started = time.perf_counter()
    embedder = load_embedder(CacheSettings())
    load_s = time.perf_counter() - started
    train = pd.read_csv(f"{BANKING77}/train.csv").head(args.entries)
    test = pd.read_csv(f"{BANKING77}/test.csv").sample(args.lookups, random_state=0)
    encode = time_encode(embedder, list(test.text[:50]))
    started = time.perf_counter()
    vectors = embedder.encode(list(train.text))
    bulk_s = time.perf_counter() - started
    queries = embedder.encode(list(test.text))
    result = {
        "model_load_s": round(load_s, 2),
        "single_encode": encode,
        "bulk_encode_texts_per_s": round(len(train) / bulk_s, 1),
        "faiss": time_index_kinds(vectors, queries),
        "http_lookup": time_http_lookups(embedder, list(train.text), vectors,
                                         list(train.category), list(test.text)),
    }
    print(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
