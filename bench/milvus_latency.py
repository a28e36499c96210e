"""Lookup latency of index kind ``milvus`` (cache_core.store.milvus, on milvus-lite here)
side by side with in-process FAISS ``flat``, in one run on the same vectors and queries.

    python -m bench.milvus_latency [--sizes 10000,100000] [--queries 500] [--out milvus_latency]

Vectors and queries as in bench.index_kinds (banking77 train encoded for real, noisy copies
up to half the size, random unit vectors for the rest; queries: banking77 test texts). Per
size, both kinds behind the cache's own index classes (what a partition calls): ``flat`` is
``VectorIndex`` (FAISS IndexFlatIP, one thread), ``milvus`` is ``MilvusIndex`` (a gRPC call to
the embedded Milvus server, FLAT index, metric IP, filtered on the store's scope, then the
candidates this replica knows re-scored exactly from its local twin). Reports the fill rate
(entries/s; milvus upserts in batches of 1,000), search wall time per single query p50/p99
(Milvus's server is another process, so the calling thread's CPU time would not count it;
wall time on this loaded 2-core machine it is), the ratio milvus / flat, and recall@1 against
exact search. A Milvus cluster adds a network round trip on top; milvus-lite runs the same
engine locally, so these are a floor for it.

Prints a table; writes bench/results/<out>.json and <out>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.index_kinds import corpus, encoded, exact_top1, unit
from cache_core.store.factory import Backends, new_index
from cache_core.store.faiss import IndexSpec, set_search_threads
from cache_core.store.milvus import MilvusConfig

RESULTS = Path(__file__).resolve().parent / "results"


def timed_searches(index, queries: np.ndarray, k: int = 5) -> tuple[np.ndarray, list[str]]:
    times, top = [], []
    for query in queries:
        start = time.perf_counter()
        found = index.search(query, k)
        times.append((time.perf_counter() - start) * 1000)
        top.append(found[0][0] if found else "")
    return np.array(times), top


def measure(kind: str, vecs: np.ndarray, queries: np.ndarray, truth: np.ndarray, scores: np.ndarray,
            backends: Backends | None, size: int) -> dict:
    index = new_index(vecs.shape[1], IndexSpec(kind=kind), backends, key=("bench", str(size), kind))
    ids = [f"e{i}" for i in range(len(vecs))]
    start = time.perf_counter()
    for lo in range(0, len(vecs), 1000):
        index.add_many(ids[lo:lo + 1000], vecs[lo:lo + 1000])
    fill_s = time.perf_counter() - start
    start = time.perf_counter()
    if hasattr(index, "flush"):
        index.flush()  # sealed and indexed, as a warmed store is (an unsealed one is slower still)
    flush_s = time.perf_counter() - start
    timed_searches(index, queries[:20])  # warm up (connections, caches)
    times, top = timed_searches(index, queries)
    # a tie within 1e-6 counts as agreement, as in bench.index_kinds
    got = np.array([vecs[int(e[1:])] @ q if e else -1.0 for e, q in zip(top, queries)])
    recall = float(np.mean([(e == f"e{t}") or abs(g - s) < 1e-6 for e, t, g, s in zip(top, truth, got, scores)]))
    failures = getattr(index, "failures", 0)
    return {"kind": kind, "entries": size, "fill_s": round(fill_s, 2), "flush_s": round(flush_s, 2),
            "fill_per_s": round(size / fill_s), "p50_ms": round(float(np.percentile(times, 50)), 3),
            "p99_ms": round(float(np.percentile(times, 99)), 3), "mean_ms": round(float(times.mean()), 3),
            "recall_at_1": round(recall, 4), "queries": len(queries), "failures": failures}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, marker in (("flat", "o"), ("milvus", "s")):
        mine = [r for r in rows if r["kind"] == kind]
        sizes = [r["entries"] for r in mine]
        ax.plot(sizes, [r["p50_ms"] for r in mine], marker=marker, label=f"{kind} p50")
        ax.plot(sizes, [r["p99_ms"] for r in mine], marker=marker, linestyle="--", label=f"{kind} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entries in the store")
    ax.set_ylabel("search wall time per lookup (ms)")
    ax.set_title("index kind milvus (milvus-lite) vs FAISS flat, one query at a time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--out", default="milvus_latency")
    args = parser.parse_args(argv)
    set_search_threads(1)
    real, queries = unit(encoded("train")), unit(encoded("test"))[: args.queries]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        backends = Backends(milvus=MilvusConfig(uri=os.path.join(tmp, "bench.db")))
        for size in [int(s) for s in args.sizes.split(",")]:
            vecs = corpus(real, size)
            scores, truth = exact_top1(vecs, queries)
            pair = [measure(kind, vecs, queries, truth, scores, backends, size) for kind in ("flat", "milvus")]
            flat, milvus = pair
            for row in pair:
                row["p50_vs_flat"] = round(row["p50_ms"] / flat["p50_ms"], 2)
                row["p99_vs_flat"] = round(row["p99_ms"] / flat["p99_ms"], 2)
            rows += pair
            for r in pair:
                print(f"{size:>8} {r['kind']:>7}  fill {r['fill_per_s']:>7}/s  p50 {r['p50_ms']:7.3f} ms"
                      f"  p99 {r['p99_ms']:7.3f} ms  x{r['p50_vs_flat']:.2f}/x{r['p99_vs_flat']:.2f}"
                      f"  recall@1 {r['recall_at_1']:.3f}  failures {r['failures']}", flush=True)
    load = os.getloadavg()
    result = {"rows": rows, "load_average": [round(x, 2) for x in load], "queries": args.queries,
              "backend": "milvus-lite 3.2.2 (pymilvus 2.5.18), FLAT, IP; FAISS one thread"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, RESULTS / f"{args.out}.png")
    return result


if __name__ == "__main__":
    main()
