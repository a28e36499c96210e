"""Where a lookup's time goes with 10^5 cached entries: encode vs search vs the rest.

    python -m bench.lookup_latency [--backend onnx-int8] [--entries 100000] [--index hnsw]
                                   [--lookups 300] [--concurrency 4] [--ann-check-rate 0.1]
                                   [--tag after]

Fills one partition with ``--entries`` vectors: the banking77 train texts
(encoded for real) plus noisy copies of their vectors up to the count (cosine
about 0.9 to their source, so the index has realistic clusters). Then, on
banking77 test queries, measures:

* bare ``encode`` of one query (the model alone, no batching thread);
* ``paired``: bare encode and lookup of each query back to back (same load for both:
  the ratio to trust on a shared machine);
* in-process ``SemanticCache.lookup`` through the service's BatchingEncoder,
  with its own embed / search spans from the event;
* HTTP ``/v1/lookup`` (the FastAPI app, a null publisher), sequential and with
  ``--concurrency`` clients at once.

Prints one JSON object and writes bench/results/lookup_latency-<backend>-<index>.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import uvicorn

from cache_core.records import CacheEntry, entry_bytes
from cache_core.embedding.batching import BatchingEncoder
from cache_core.embedding.embedder import normalise
from cache_core.embedding.load import load_embedder
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.store.faiss import IndexSpec, set_search_threads
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import CacheSettings, Settings
from infra.runtime import free_port, wait_until
from infra.runtime import BANKING77_DIR

BANKING77 = BANKING77_DIR
RESULTS = Path(__file__).resolve().parent / "results"


class NullPublisher:
    def publish_event(self, event) -> None: ...
    def publish_feedback(self, feedback) -> None: ...
    def stats(self) -> dict:
        return {}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def summary(values: list[float]) -> dict:
    return {"p50_ms": round(statistics.median(values), 3), "p99_ms": round(pct(values, 99), 3)}


def corpus_vectors(embedder, entries: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    train = pd.read_csv(BANKING77 / "train.csv")
    base = embedder.encode(list(train.text))
    rng = np.random.default_rng(seed)
    texts, answers, rows = list(train.text), list(train.category), [base]
    while sum(len(r) for r in rows) < entries:
        noisy = base + rng.normal(0, 0.025, base.shape).astype(np.float32)  # cosine ~0.9
        rows.append(normalise(noisy)[0])
        n = len(texts)
        texts += [f"{t} #{n + i}" for i, t in enumerate(train.text)]
        answers += list(train.category)
    vectors = np.vstack(rows)[:entries]
    return texts[:entries], answers[:entries], vectors


def fill(cache, texts: list[str], answers: list[str], vectors: np.ndarray) -> float:
    """Entries straight into the partition, the index built in one FAISS call."""
    experiment = cache.registry.get()
    arm = experiment.arms[0]
    partition = cache.stores.for_arm("default", experiment, arm)
    now = time.time()
    ids = []
    with partition.lock:
        for text, answer, vec in zip(texts, answers, vectors):
            entry = CacheEntry(entry_id=uuid.uuid4().hex, query=text, embedding=vec, answer=answer,
                               created_at=now, ttl_s=86400, ttl_policy="absolute", max_age_s=86400,
                               namespace="default", intent_cluster=0,
                               approx_bytes=entry_bytes(text, answer, vec))
            partition.entries[entry.entry_id] = entry
            partition.bytes += entry.approx_bytes
            ids.append(entry.entry_id)
        started = time.perf_counter()
        partition._index_for(None).add_many(ids, vectors)
        return time.perf_counter() - started


def registry_for(index: str, entries: int, ann_check_rate: float) -> ExperimentRegistry:
    arm = ArmConfig(name="a", index_kind=index, ann_check_rate=ann_check_rate,
                    capacity_entries=max(entries * 2, 1000), capacity_bytes=8 * 1024**3)
    return ExperimentRegistry({"bench": ExperimentConfig(experiment_id="bench", salt="s", arms=[arm])})


def time_bare_encode(embedder, queries: list[str]) -> list[float]:
    out = []
    for q in queries:
        started = time.perf_counter()
        embedder.encode([q])
        out.append((time.perf_counter() - started) * 1000)
    return out


def time_in_process(cache, queries: list[str]) -> dict:
    total, embed, search = [], [], []
    for i, q in enumerate(queries):
        started = time.perf_counter()
        result = cache.lookup(q, unit_id=f"u{i}")
        total.append((time.perf_counter() - started) * 1000)
        embed.append(result.embed_ms)
        search.append(result.search_ms)
    cache.flush_events()
    return {"lookup": summary(total), "embed_span": summary(embed), "search_span": summary(search)}


def time_paired(embedder, cache, queries: list[str]) -> dict:
    """Bare encode and lookup of the same query back to back, so both see the same
    machine load (on a shared 2-core box, load drifts between separate phases)."""
    bare, total = [], []
    for i, q in enumerate(queries):
        started = time.perf_counter()
        embedder.encode([q])
        bare.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        cache.lookup(q, unit_id=f"p{i}")
        total.append((time.perf_counter() - started) * 1000)
    cache.flush_events()
    ratios = [t / b for t, b in zip(total, bare)]
    return {"bare_encode": summary(bare), "lookup": summary(total),
            "lookup_over_encode_p50": round(statistics.median(total) / statistics.median(bare), 2),
            "median_pair_ratio": round(statistics.median(ratios), 2)}


def time_http(app, queries: list[str], concurrency: int) -> dict:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{base}/healthz").status_code == 200, 30, "bench app")
    local = threading.local()

    def ask(i: int) -> tuple[float, float, float]:
        client = getattr(local, "client", None) or httpx.Client(base_url=base)
        local.client = client
        started = time.perf_counter()
        body = client.post("/v1/lookup", json={"query": queries[i % len(queries)],
                                               "unit_id": f"u{i}"}).json()
        return (time.perf_counter() - started) * 1000, body["latency_ms"], 0.0

    out = {}
    try:
        for workers in sorted({1, concurrency}):
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(ask, range(10)))  # warm-up
                started = time.perf_counter()
                samples = list(pool.map(ask, range(len(queries))))
                wall = time.perf_counter() - started
            out[f"clients_{workers}"] = {"http": summary([s[0] for s in samples]),
                                         "in_service": summary([s[1] for s in samples]),
                                         "lookups_per_s": round(len(queries) / wall, 1)}
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="onnx-int8", choices=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--threads", type=int, default=1, help="encoder intra-op threads")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--index", default="hnsw", choices=["flat", "hnsw", "ivf"])
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--ann-check-rate", type=float, default=0.1,
                        help="share of lookups sampled for the ANN-vs-exact check (ArmConfig default 0.1)")
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    args = parser.parse_args()
    set_search_threads(1)
    embedder = load_embedder(CacheSettings(encoder_backend=args.backend, encoder_threads=args.threads))
    queries = list(pd.read_csv(BANKING77 / "test.csv").sample(args.lookups, random_state=0).text)
    time_bare_encode(embedder, queries[:20])
    bare = summary(time_bare_encode(embedder, queries))
    texts, answers, vectors = corpus_vectors(embedder, args.entries)
    settings = Settings(service={"open_access": True})
    app = create_app(build_components(settings, NullPublisher(), BatchingEncoder(embedder),
                                      registry=registry_for(args.index, args.entries, args.ann_check_rate)))
    set_search_threads(2)  # build in parallel, search with one thread
    build_s = fill(app.state.components.cache, texts, answers, vectors)
    set_search_threads(1)
    in_process = time_in_process(app.state.components.cache, queries)
    paired = time_paired(embedder, app.state.components.cache, queries)
    http = time_http(app, queries, args.concurrency)
    result = {"backend": args.backend, "threads": args.threads, "entries": args.entries,
              "index": args.index, "ann_check_rate": args.ann_check_rate, "index_build_s": round(build_s, 1), "bare_encode": bare,
              "in_process": in_process, "paired": paired, "http": http,
              "lookup_over_encode_p50": round(in_process["lookup"]["p50_ms"] / bare["p50_ms"], 2)}
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    (RESULTS / f"lookup_latency-{args.backend}-{args.index}{tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
