"""Index kinds at scale: build time, bytes per entry, search latency and recall@1 vs exact.

    python -m bench.index_kinds [--sizes 10000,100000,1000000] [--queries 1000]
                                [--kinds all] [--large-kinds flat,sq_int8,ivf_sq_int8,ivf_pq,semhash]
                                [--max-build-s 240] [--all-in] [--out index_kinds]

Vectors (384-d, unit length): the banking77 train texts encoded for real by the cache's
encoder (cache_core.embedder; encodings kept in scache_home()/bench/), noisy copies of
them (cosine ~0.9 to their text, so each text has a crowd of near-ties) up to half of
the size, random unit vectors for the rest. Queries: banking77 test texts, encoded the
same way (real paraphrases of stored questions, none of them stored).

Per size and kind, FAISS on one thread (as the service runs it): the structure built by
``cache_core.store.kinds.build`` with all vectors (training included), its bytes per
entry (serialised size / entries: the structure alone, without the reference copy and
id maps the cache also keeps; ``--all-in`` measures those), search-only latency per single query (wall p50/p99,
and the thread's CPU time p50/p99: on a machine shared with other work, wall time mostly
measures the scheduler), and recall@1 against exact search (a tie within 1e-6 counts) two
ways: ``raw``, the
structure's own top-1 (what the bytes above buy on their own) and ``rescored``, the
top-1 after re-scoring ``ann_candidates`` candidates exactly (what the cache serves;
for exact kinds the same). Flat scans at 10^6 time fewer queries (``--scan-queries``).
Graph kinds are skipped at sizes where their single-threaded build would pass
``--max-build-s`` (estimated from the previous size); from 10^6 entries on only
``--large-kinds`` run. Kinds that train learn from a sample of 39 points per centroid
(IVF lists at most 1024 here), as FAISS's k-means would subsample anyway.

With ``--all-in``, each kind is also measured as the cache holds it: a whole
``VectorIndex`` (the store behind a partition: the structure, whatever it keeps to re-score
candidates and to answer the ANN check's exact scan, and its entry-id maps with the
32-character ids themselves), filled by ``add_many`` and trained on all its vectors as the
cache trains it. ``store_bytes_per_entry`` is the process's resident memory grown by
building it (RSS after ``malloc_trim``, over entries), ``store_p50/p99_ms`` and
``store_cpu_*`` time ``VectorIndex.search(q, 5)`` (the partition's call, re-score
included), and ``store_recall_at_1`` is its top-1 against exact float32 search.

Prints a table; writes bench/results/<out>.json and <out>.png.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import time
from pathlib import Path

import faiss
import numpy as np
import pandas as pd

from cache_core.store import kinds as index_kinds
from cache_core.store.faiss import IndexSpec, VectorIndex, set_search_threads
from cache_core.runtime import scache_home
from infra.runtime import BANKING77_DIR

RESULTS = Path(__file__).resolve().parent / "results"
DIM = 384

# name -> spec; parameters chosen for 10^4..10^6 entries (ivf_nlist grows with size below).
KINDS: dict[str, IndexSpec] = {
    "flat": IndexSpec("flat"),
    "hnsw": IndexSpec("hnsw", hnsw_m=32, hnsw_ef_search=64),
    "hnsw-ef16": IndexSpec("hnsw", hnsw_m=32, hnsw_ef_search=16),
    "sq_fp16": IndexSpec("sq_fp16"),
    "sq_int8": IndexSpec("sq_int8"),
    "sq_int4": IndexSpec("sq_int4"),
    "hnsw_sq_int8": IndexSpec("hnsw_sq_int8", hnsw_m=16, hnsw_ef_search=64),
    "hnsw_sq_int4": IndexSpec("hnsw_sq_int4", hnsw_m=16, hnsw_ef_search=64),
    "ivf": IndexSpec("ivf", ivf_nprobe=16),
    "ivf_sq_int8": IndexSpec("ivf_sq_int8", ivf_nprobe=16),
    "ivf_sq_int8-np8": IndexSpec("ivf_sq_int8", ivf_nprobe=8),
    "ivf_sq_int4": IndexSpec("ivf_sq_int4", ivf_nprobe=16, ann_candidates=32),
    "ivf_pq": IndexSpec("ivf_pq", ivf_nprobe=16, pq_m=48, ann_candidates=32),
    "semhash": IndexSpec("semhash", semhash_tables=4, semhash_radius=4, ann_candidates=64),
    "semhash-r2x8": IndexSpec("semhash", semhash_tables=8, semhash_radius=2, ann_candidates=64),
}
GRAPH = ("hnsw",)  # kinds whose build is a graph insertion per vector
SCANS = ("flat", "sq_")  # kinds that read every entry per query


def encoded(split: str) -> np.ndarray:
    """banking77 ``split`` encoded by the cache's default encoder (kept between runs)."""
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    settings = CacheSettings()
    store = scache_home() / "bench" / f"banking77-{split}-{settings.encoder_backend}.npy"
    if store.exists():
        return np.load(store)
    texts = list(pd.read_csv(BANKING77_DIR / f"{split}.csv").text)
    vecs = load_embedder(settings).encode(texts).astype(np.float32)
    store.parent.mkdir(parents=True, exist_ok=True)
    np.save(store, vecs)
    return vecs


def unit(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


def corpus(real: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [real[:size]]
    copies = max(size // 2 - len(real), 0)
    if copies:
        base = real[rng.integers(0, len(real), copies)]
        parts.append(unit(base + rng.normal(0, 0.025, base.shape).astype(np.float32)))
    rest = size - sum(len(p) for p in parts)
    if rest > 0:
        parts.append(unit(rng.standard_normal((rest, DIM)).astype(np.float32)))
    return np.ascontiguousarray(np.vstack(parts))


def spec_at(spec: IndexSpec, size: int) -> IndexSpec:
    """IVF lists grow with the size (about 4 sqrt(n), at most 1024: k-means on two shared
    cores stays within a minute)."""
    if spec.kind.startswith("ivf"):
        nlist = int(min(1024, max(16, 4 * np.sqrt(size))))
        nlist = 1 << int(np.log2(nlist))
        return IndexSpec(**{**spec.__dict__, "ivf_nlist": nlist})
    return spec


def exact_top1(vecs: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vecs)
    scores, ids = flat.search(queries, 1)
    return scores[:, 0], ids[:, 0]


def measure(name: str, spec: IndexSpec, vecs: np.ndarray, queries: np.ndarray,
            truth: tuple[np.ndarray, np.ndarray]) -> dict:
    started = time.perf_counter()
    ids = np.arange(len(vecs), dtype=np.int64)
    if spec.kind == "flat":
        structure = faiss.IndexIDMap(faiss.IndexFlatIP(DIM))
        structure.add_with_ids(vecs, ids)
    else:
        wanted = index_kinds.traits(spec).train_size
        sample = vecs[np.random.default_rng(1).choice(len(vecs), wanted, replace=False)] \
            if 0 < wanted < len(vecs) else None
        structure = index_kinds.build(spec, DIM, vecs, ids, train=sample)
    build_s = time.perf_counter() - started
    rescore = index_kinds.traits(spec).rescore
    wanted = max(1, spec.ann_candidates) if rescore else 1
    latencies, cpu, raw_top, rescored_top = [], [], [], []
    for query in queries:
        q = query[None, :]
        began, began_cpu = time.perf_counter(), time.thread_time()
        _, found = structure.search(q, wanted)
        cpu.append((time.thread_time() - began_cpu) * 1000)
        latencies.append((time.perf_counter() - began) * 1000)
        found = found[0][found[0] >= 0]
        raw_top.append(found[0] if len(found) else -1)
        if rescore and len(found):  # the cache's step after the search
            rescored_top.append(found[int(np.argmax(vecs[found] @ query))])
        else:
            rescored_top.append(raw_top[-1])
    best_scores, best_ids = truth

    def recall(top: list[int]) -> float:
        top = np.asarray(top)
        hit = (top == best_ids[:len(top)])
        found = top >= 0
        tie = np.zeros_like(hit)
        tie[found] = np.abs((vecs[top[found]] * queries[found]).sum(1) - best_scores[:len(top)][found]) < 1e-6
        return float((hit | tie).mean())

    return {
        "kind": name, "index_kind": spec.kind, "entries": len(vecs), "queries": len(queries),
        "build_s": round(build_s, 2),
        "bytes_per_entry": round(index_kinds.bytes_per_entry(structure) if spec.kind != "flat"
                                 else faiss.serialize_index(structure).nbytes / len(vecs), 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 3),
        "p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 3),
        "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 3),
        "recall_at_1_raw": round(recall(raw_top), 4),
        "recall_at_1_rescored": round(recall(rescored_top), 4),
        "candidates": wanted,
        "params": {k: v for k, v in spec.__dict__.items() if k != "kind"},
    }


def resident_bytes() -> int:
    """The process's resident memory, after returning freed heap to the system."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: freed memory may stay counted
        pass
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def entry_name(i: int) -> str:
    """As long as the cache's ids (uuid4().hex)."""
    return f"{i:032x}"


def measure_store(spec: IndexSpec, vecs: np.ndarray, queries: np.ndarray,
                  truth: tuple[np.ndarray, np.ndarray]) -> dict:
    """The kind as the cache holds it: a whole ``VectorIndex``, all in (module docstring)."""
    before = resident_bytes()
    index = VectorIndex(DIM, spec)
    names = [entry_name(i) for i in range(len(vecs))]
    index.add_many(names, vecs)
    del names
    grown = resident_bytes() - before
    latencies, cpu, top = [], [], []
    for query in queries:
        began, began_cpu = time.perf_counter(), time.thread_time()
        found = index.search(query, 5)
        cpu.append((time.thread_time() - began_cpu) * 1000)
        latencies.append((time.perf_counter() - began) * 1000)
        top.append(int(found[0][0], 16) if found else -1)
    top = np.asarray(top)
    best_scores, best_ids = truth
    found = top >= 0
    tie = np.zeros(len(top), dtype=bool)
    tie[found] = np.abs((vecs[top[found]] * queries[found]).sum(1) - best_scores[found]) < 1e-6
    row = {
        "store_bytes_per_entry": round(grown / len(vecs), 1),
        "store_p50_ms": round(float(np.percentile(latencies, 50)), 3),
        "store_p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "store_cpu_p50_ms": round(float(np.percentile(cpu, 50)), 3),
        "store_cpu_p99_ms": round(float(np.percentile(cpu, 99)), 3),
        "store_recall_at_1": round(float(((top == best_ids) | tie).mean()), 4),
    }
    del index
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(rows)
    all_in = "store_bytes_per_entry" in frame
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    for kind, group in frame.groupby("kind"):
        group = group.sort_values("entries")
        for ax, column in zip(axes, ("build_s", "cpu_p99_ms", "bytes_per_entry", "recall_at_1_raw")):
            line, = ax.plot(group.entries, group[column], marker="o", label=kind)
        if all_in:  # the whole store, dashed in the same colour
            for ax, column in zip(axes[1:], ("store_cpu_p99_ms", "store_bytes_per_entry", "store_recall_at_1")):
                ax.plot(group.entries, group[column], marker="s", linestyle="--", color=line.get_color())
    suffix = " (dashed: whole store, all in)" if all_in else ""
    for ax, title in zip(axes, ("build time (s)", "search CPU p99 (ms, 1 thread)" + suffix,
                                "bytes per entry (structure)" + suffix,
                                "recall@1 vs exact (structure's own top-1)" + suffix)):
        ax.set_xscale("log")
        ax.set_xlabel("entries")
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[1].axhline(2.0, color="grey", linestyle="--", linewidth=1)
    axes[2].set_yscale("log")
    axes[2].axhline(600, color="grey", linestyle="--", linewidth=1)
    axes[3].axhline(0.95, color="grey", linestyle="--", linewidth=1)
    axes[3].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--scan-queries", type=int, default=100,
                        help="queries for full-scan kinds above 10^5 entries")
    parser.add_argument("--kinds", default="all", help="comma-separated names of KINDS, or all")
    parser.add_argument("--large-kinds", default="flat,sq_int8,ivf_sq_int8,ivf_sq_int4,ivf_pq,semhash",
                        help="the kinds run at 10^6 entries and more")
    parser.add_argument("--max-build-s", type=float, default=240.0)
    parser.add_argument("--all-in", action="store_true",
                        help="also measure each kind as a whole VectorIndex (memory all in, search with re-score)")
    parser.add_argument("--out", default="index_kinds")
    args = parser.parse_args(argv)
    set_search_threads(1)
    faiss.cvar.distance_compute_blas_threshold = 20  # batched exact ground truth through BLAS
    names = list(KINDS) if args.kinds == "all" else args.kinds.split(",")
    real, tests = encoded("train"), encoded("test")
    queries = np.ascontiguousarray(tests[:args.queries])
    rows, build_rate = [], {}
    for size in (int(s) for s in args.sizes.split(",")):
        vecs = corpus(real, size)
        truth = exact_top1(vecs, queries)
        for name in names if size < 1_000_000 else args.large_kinds.split(","):
            spec = spec_at(KINDS[name], size)
            if spec.kind.startswith(GRAPH) and name in build_rate and build_rate[name] * size > args.max_build_s:
                print(f"{size:>8} {name:<14} skipped: build estimated at {build_rate[name] * size:.0f} s")
                continue
            few = size > 100_000 and spec.kind.startswith(SCANS)
            subset = queries[:args.scan_queries] if few else queries
            row = measure(name, spec, vecs, subset, (truth[0][:len(subset)], truth[1][:len(subset)]))
            build_rate[name] = row["build_s"] / size
            rows.append(row)
            print(f"{size:>8} {name:<14} build {row['build_s']:>7.1f}s  {row['bytes_per_entry']:>7.1f} B/entry  "
                  f"wall p50 {row['p50_ms']:>7.3f} p99 {row['p99_ms']:>7.3f} ms  cpu p50 {row['cpu_p50_ms']:>7.3f} "
                  f"p99 {row['cpu_p99_ms']:>7.3f} ms  recall@1 raw "
                  f"{row['recall_at_1_raw']:.3f} rescored {row['recall_at_1_rescored']:.3f}"
                  f"  ({row['queries']} q)", flush=True)
            if args.all_in:
                row.update(measure_store(spec, vecs, subset, (truth[0][:len(subset)], truth[1][:len(subset)])))
                print(f"{size:>8} {name:<14} all in: {row['store_bytes_per_entry']:>7.1f} B/entry  "
                      f"wall p50 {row['store_p50_ms']:>7.3f} p99 {row['store_p99_ms']:>7.3f} ms  cpu p50 "
                      f"{row['store_cpu_p50_ms']:>7.3f} p99 {row['store_cpu_p99_ms']:>7.3f} ms  recall@1 "
                      f"{row['store_recall_at_1']:.3f}", flush=True)
            RESULTS.mkdir(exist_ok=True)  # written as it goes: a long run stopped early keeps its rows
            (RESULTS / f"{args.out}.json").write_text(json.dumps({"rows": rows}, indent=1))
    goal = [r for r in rows if r["entries"] >= 1_000_000 and r["kind"] not in ("flat", "hnsw", "ivf")
            and r["cpu_p99_ms"] < 2.0 and r["recall_at_1_raw"] >= 0.95 and r["bytes_per_entry"] < 600]
    all_in = [r for r in rows if r["entries"] >= 1_000_000 and "store_bytes_per_entry" in r
              and r["kind"] not in ("flat", "hnsw", "ivf") and r["store_cpu_p99_ms"] < 2.0
              and r["store_recall_at_1"] >= 0.95 and r["store_bytes_per_entry"] < 600]
    result = {"rows": rows, "goal_1e6_met_by": [r["kind"] for r in goal],
              "goal_1e6_all_in_met_by": [r["kind"] for r in all_in],
              "setup": {"dim": DIM, "queries": args.queries, "faiss_threads": 1,
                        "corpus": "banking77 train encoded + noisy copies (cos ~0.9) to half + random unit"}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    plot(rows, RESULTS / f"{args.out}.png")
    print("goal at 10^6 (search CPU p99 < 2 ms, recall@1 >= 0.95 raw, < 600 B/entry) met by:", result["goal_1e6_met_by"])
    if args.all_in:
        print("the same goal all in (whole VectorIndex: resident memory, search with re-score) met by:",
              result["goal_1e6_all_in_met_by"])
    return result


if __name__ == "__main__":
    main()
