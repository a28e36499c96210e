"""Encoder backends side by side: torch vs ONNX Runtime vs ONNX int8.

    python -m bench.encoder_speed [--queries 200] [--threads 1 2] [--out bench/results/encoder_speed.json]

For each backend and intra-op thread count: single-query latency p50/p99 (banking77
test queries, one at a time), batch-of-32 latency, bulk throughput (texts/s), and
agreement with torch (cosine of the normalised vectors, min and mean). Thread
counts are process-wide for torch, so each configuration runs in its own process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from infra.runtime import BANKING77_DIR

BANKING77 = BANKING77_DIR
BACKENDS = ("torch", "onnx", "onnx-int8")


def texts(n: int) -> list[str]:
    return list(pd.read_csv(f"{BANKING77}/test.csv").sample(n, random_state=0).text)


def measure(backend: str, threads: int, queries: int) -> dict:
    """Runs in a child process (``--one``): torch's thread count cannot be undone."""
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    started = time.perf_counter()
    embedder = load_embedder(CacheSettings(encoder_backend=backend, encoder_threads=threads))
    load_s = time.perf_counter() - started
    sample = texts(queries)
    for text in sample[:20]:  # warm-up: first runs allocate
        embedder.encode([text])
    single = []
    for text in sample:
        started = time.perf_counter()
        embedder.encode([text])
        single.append((time.perf_counter() - started) * 1000)
    batch32 = []
    for start in range(0, len(sample) - 31, 32):
        started = time.perf_counter()
        embedder.encode(sample[start:start + 32])
        batch32.append((time.perf_counter() - started) * 1000)
    bulk = list(pd.read_csv(f"{BANKING77}/train.csv").text[:2000])
    started = time.perf_counter()
    vectors = embedder.encode(bulk)
    bulk_s = time.perf_counter() - started
    return {"backend": backend, "threads": threads, "load_s": round(load_s, 2),
            "single_p50_ms": float(np.percentile(single, 50)),
            "single_p99_ms": float(np.percentile(single, 99)),
            "batch32_p50_ms": float(np.percentile(batch32, 50)),
            "bulk_texts_per_s": round(len(bulk) / bulk_s, 1),
            "vectors": vectors[:500].tolist()}


def run_child(backend: str, threads: int, queries: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.encoder_speed", "--one", backend,
                          "--threads", str(threads), "--queries", str(queries)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = (f"{'backend':<10} {'thr':>3} {'p50 ms':>7} {'p99 ms':>7} {'b32 ms':>7} "
            f"{'texts/s':>8} {'cos min':>8} {'cos mean':>8} {'speed-up':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['backend']:<10} {r['threads']:>3} {r['single_p50_ms']:>7.2f} "
                     f"{r['single_p99_ms']:>7.2f} {r['batch32_p50_ms']:>7.1f} {r['bulk_texts_per_s']:>8.0f} "
                     f"{r['cos_min']:>8.4f} {r['cos_mean']:>8.4f} {r['speedup_p50']:>7.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path("bench/results/encoder_speed.json"))
    parser.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.threads[0], args.queries)))
        return
    rows = [run_child(b, t, args.queries) for t in args.threads for b in BACKENDS]
    reference = {r["threads"]: np.array(r["vectors"]) for r in rows if r["backend"] == "torch"}
    torch_p50 = {r["threads"]: r["single_p50_ms"] for r in rows if r["backend"] == "torch"}
    for r in rows:
        sims = np.sum(np.array(r.pop("vectors")) * reference[r["threads"]], axis=1)
        r["cos_min"], r["cos_mean"] = float(sims.min()), float(sims.mean())
        r["speedup_p50"] = torch_p50[r["threads"]] / r["single_p50_ms"]
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
