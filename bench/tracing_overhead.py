"""What OpenTelemetry spans cost a lookup: tracing off (the default) vs on, in one process.

    python -m bench.tracing_overhead [--entries 2000] [--lookups 400] [--rounds 5] [--out bench/results/tracing_overhead.json]

A SemanticCache (flat store, the default onnx-int8 encoder) warmed with banking77 train questions answers
banking77 test questions; rounds alternate between tracing off and on (the SDK's in-memory exporter behind
a batching processor, as the service runs its exporters), so load from other work hits both alike. Each
lookup on is one trace of four spans (lookup, embed, search, decide; publish is not in the path here).
Reports lookup CPU time p50/p99 per mode (this thread's: wall time on a loaded machine is mostly
waiting), also with the encoder out of the way (every query already in the embedding cache), and the
span sites' own CPU cost per lookup, measured alone over 20,000 iterations (the lookup figures are too
noisy here to show a difference of that size).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from infra.runtime import BANKING77_DIR


def build(entries: int, tracing, embedder):
    from cache_core.cache import SemanticCache
    from cache_core.embedding.cache import EmbeddingCache
    from cache_core.experiments import ArmConfig, ExperimentConfig
    from cache_core.registry import ExperimentRegistry
    from cache_core.records import StoreItem

    experiment = ExperimentConfig(experiment_id="bench", salt="salt", arms=[ArmConfig(name="a", threshold=0.85)])
    cache = SemanticCache(embedder, ExperimentRegistry({"bench": experiment}), tracing=tracing,
                          embedding_cache=EmbeddingCache(100_000))
    train = list(pd.read_csv(f"{BANKING77_DIR}/train.csv").text[:entries])
    cache.store_many([StoreItem(query=q, answer=f"answer {i}", unit_id="seed") for i, q in enumerate(train)],
                     every_arm=True)
    return cache


def timed(cache, queries: list[str]) -> list[float]:
    """CPU time of this thread per lookup, in ms (wall time on a loaded machine is mostly waiting;
    the encoder runs on this thread: one intra-op thread)."""
    out = []
    for i, query in enumerate(queries):
        started = time.thread_time()
        cache.lookup(query, unit_id=f"u{i % 50}")
        out.append((time.thread_time() - started) * 1000)
    return out


def span_pattern_us(tracing, n: int = 20_000) -> float:
    """CPU µs per lookup of the span sites alone (lookup + embed + search + decide, with their attributes)."""
    from cache_core.tracing import annotate

    started = time.thread_time()
    for i in range(n):
        with tracing.span("scache.lookup", {"scache.namespace": "default"}) as span:
            with tracing.span("scache.embed"):
                pass
            with tracing.span("scache.search", {"scache.index_kind": "flat"}) as search:
                annotate(search, candidates=3)
            with tracing.span("scache.decide"):
                pass
            annotate(span, request_id="r", decision="hit", similarity=0.9, threshold=0.85, arm="a",
                     experiment_id="bench", config_version=1, guard=None)
    return (time.thread_time() - started) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--lookups", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/tracing_overhead.json"))
    args = parser.parse_args(argv)

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cache_core.embedding.cache import EmbeddingCache
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings, TracingSettings
    from cache_core.tracing import OFF, build_tracing

    embedder = load_embedder(CacheSettings())
    spans = InMemorySpanExporter()
    on = build_tracing(TracingSettings(), "bench", exporter=spans)
    caches = {"off": build(args.entries, OFF, embedder), "on": build(args.entries, on, embedder)}
    queries = list(pd.read_csv(f"{BANKING77_DIR}/test.csv").sample(args.lookups, random_state=0).text)
    encoded: dict[str, list[float]] = {"off": [], "on": []}
    cached: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(args.rounds):
        for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
            cache = caches[mode]
            cache.embedding_cache = EmbeddingCache(100_000)  # empty: the first pass encodes each query
            encoded[mode] += timed(cache, queries)
            cached[mode] += timed(cache, queries)   # second pass: the embedding cache answers
            spans.clear()
    result = {"entries": args.entries, "lookups_per_mode": len(encoded["off"]), "encoder": "onnx-int8",
              "spans_per_lookup": 4}
    for name, series in (("encoded", encoded), ("embedding_cached", cached)):
        for mode, values in series.items():
            result[f"{name}_{mode}_cpu_p50_ms"] = round(float(np.percentile(values, 50)), 4)
            result[f"{name}_{mode}_cpu_p99_ms"] = round(float(np.percentile(values, 99)), 4)
        result[f"{name}_added_p50_us"] = round(
            (result[f"{name}_on_cpu_p50_ms"] - result[f"{name}_off_cpu_p50_ms"]) * 1000, 1)
    result["span_sites_off_cpu_us"] = round(span_pattern_us(OFF), 2)
    result["span_sites_on_cpu_us"] = round(span_pattern_us(on), 2)
    spans.clear()
    on.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
