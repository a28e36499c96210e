"""The disk tier at scale: resident memory per entry all in, lookup search time and recall@1
of an arm with a small memory tier and a long cold tail, before vs after a change.

    python -m bench.disk_tier [--memory 10000] [--sizes 100000,1000000] [--kind ivf_sq_int8]
                              [--queries 300] [--before-rev 58b1d08~1] [--before-queries 60]
                              [--bulk] [--merge disk_tier_1e5,...] [--out disk_tier]

One store (``Partition``) whose memory tier holds ``--memory`` entries of index kind
``--kind`` (nlist 64, nprobe 8: the arm defaults) with a disk tier behind it, filled to each
size through the product's path (``evict_for`` + ``insert`` per entry, each insert past the
memory demoting the LRU victim to the file) with bench.index_kinds' vectors (banking77 train
encodings, noisy copies, random unit vectors) in a shuffled order, each entry a
``CacheEntry`` with a uuid id, a distinct banking77 question (numbered) and its intent's demo
answer. Every (version, size) runs in a fresh process, so no freed heap of earlier work is
reused. Reported:

* ``bytes_per_entry``: the process's resident memory grown by the fill (RSS after
  ``malloc_trim``) over all entries, hot and cold: the hot entries with their texts and
  index, the cold codes and whatever maps the tier keeps, SQLite's page cache; the file's
  pages in the OS cache are not resident memory of the process;
* ``cold_estimate_bytes``: ``DiskTier.memory_bytes()`` per cold entry (the tier's own figure);
* ``fill_per_s``; ``search_p50/p99_ms`` and ``search_cpu_*``: ``Partition.search`` of
  banking77 test encodings (both tiers, the cold candidates re-scored and loaded), wall and
  the thread's CPU time, FAISS on one thread;
* ``recall_at_1``: its best against exact float32 search over all the vectors (a tie within
  1e-6 counts); ``best_from_disk``: how often that best was a cold entry.

``--bulk``: the cold part goes straight into the tier with ``DiskTier.put_many`` (10,000
rows per transaction, codes still added one by one as a demotion adds them), then the hot
part through the product's path: a 10^6 fill takes minutes instead of hours on a loaded
machine (a demotion per insert commits a SQLite transaction each). ``--before-rev``: the same run with the disk tier as it was at that git revision
(``cache_core/store/disk_tier.py`` read by ``git show``), ``--before-queries`` queries (its
cold search is a full scan). Prints a table; writes bench/results/<out>.json and <out>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import numpy as np

from bench.index_kinds import BANKING77_DIR, corpus, encoded, exact_top1, resident_bytes, text_pair, unit
from cache_core.store.faiss import IndexSpec, set_search_threads

RESULTS = Path(__file__).resolve().parent / "results"
BULK_BATCH = 10_000
ROOT = Path(__file__).resolve().parent.parent


def old_disk_tier(rev: str) -> type:
    """``DiskTier`` as it was at git revision ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:cache_core/store/disk_tier.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"disk_tier_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses and annotations look it up
    exec(compile(source, f"{rev}:cache_core/store/disk_tier.py", "exec"), module.__dict__)
    return module.DiskTier


def run(version: str, rev: str | None, kind: str, memory: int, size: int, queries: int, bulk: bool) -> dict:
    """One (version, size) in a fresh process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_child, version, rev, kind, memory, size, queries, bulk).result()


def _child(version: str, rev: str | None, kind: str, memory: int, size: int, n_queries: int,
           bulk: bool) -> dict:
    import pandas as pd

    from cache_core.records import CacheEntry, entry_bytes
    from cache_core.store import partition as partition_module
    from cache_core.store.factory import Backends
    from infra.traffic import answer_for

    set_search_threads(1)
    if rev is not None:
        partition_module.DiskTier = old_disk_tier(rev)
    vecs = corpus(unit(encoded("train")), size)
    queries = unit(encoded("test"))[:n_queries]
    best_scores, best_ids = exact_top1(vecs, queries)
    frame = pd.read_csv(BANKING77_DIR / "train.csv")
    texts, answers = list(frame.text), [answer_for(intent) for intent in frame.category]
    del frame
    order = np.random.default_rng(2).permutation(size)
    spec = IndexSpec(kind, ivf_nlist=64, ivf_nprobe=8)
    with tempfile.TemporaryDirectory() as tmp:
        base = resident_bytes()
        store = partition_module.Partition(("bench", "disk", str(size)), vecs.shape[1], spec, memory, 1 << 62,
                                           Backends(disk_dir=Path(tmp)))
        store.reconfigure(spec, memory, 1 << 62, disk_entries=size)
        now = time.time()

        def made(i: int) -> CacheEntry:
            query, answer = text_pair(i, texts, answers)
            vec = vecs[i].copy()  # as admission.new_entry hands it over
            return CacheEntry(entry_id=uuid.uuid4().hex, query=query, embedding=vec, answer=answer,
                              created_at=now, ttl_s=86400.0, ttl_policy="absolute", max_age_s=86400.0,
                              namespace="default", intent_cluster=-1, approx_bytes=entry_bytes(query, answer, vec))

        started = time.perf_counter()
        hot = order.tolist()
        if bulk:  # the cold part straight into the tier, one transaction per batch
            hot = hot[size - memory:]
            for start in range(0, size - memory, BULK_BATCH):
                batch = [made(i) for i in order[start:min(start + BULK_BATCH, size - memory)].tolist()]
                if hasattr(store.disk, "put_many"):
                    store.disk.put_many(batch)
                else:  # an earlier tier: the same transaction around its put
                    store.disk._db.execute("BEGIN")
                    for entry in batch:
                        store.disk.put(entry)
                    store.disk._db.execute("COMMIT")
        for i in hot:
            entry = made(i)
            store.evict_for(entry.approx_bytes, now)
            store.insert(entry)
        fill_s = time.perf_counter() - started
        grown = resident_bytes() - base
        wall, cpu, top, from_disk = [], [], [], 0
        for query in queries:
            began, began_cpu = time.perf_counter(), time.thread_time()
            outcome = store.search(query, None, now)
            cpu.append((time.thread_time() - began_cpu) * 1000)
            wall.append((time.perf_counter() - began) * 1000)
            best = outcome.best
            top.append(int(best.entry.query.rsplit("#", 1)[1]) if best is not None else -1)
            from_disk += best is not None and best.tier == "disk"
        top = np.asarray(top)
        hit = top >= 0
        tie = np.zeros(len(top), dtype=bool)
        tie[hit] = np.abs((vecs[top[hit]] * queries[hit]).sum(1) - best_scores[hit]) < 1e-6
        cold = store.cold()
        file_bytes = sum(p.stat().st_size for p in Path(tmp).iterdir())
        row = {
            "version": version, "rev": rev, "bulk_fill": bulk, "kind": kind, "entries": size, "in_memory": len(store), "on_disk": cold,
            "queries": len(queries), "fill_s": round(fill_s, 1), "fill_per_s": round(size / fill_s),
            "bytes_per_entry": round(grown / size, 1),
            "cold_estimate_bytes": round(store.disk.memory_bytes() / max(cold, 1), 1),
            "file_bytes_per_entry": round(file_bytes / max(cold, 1)),
            "search_p50_ms": round(float(np.percentile(wall, 50)), 3),
            "search_p99_ms": round(float(np.percentile(wall, 99)), 3),
            "search_cpu_p50_ms": round(float(np.percentile(cpu, 50)), 3),
            "search_cpu_p99_ms": round(float(np.percentile(cpu, 99)), 3),
            "recall_at_1": round(float(((top == best_ids) | tie).mean()), 4),
            "best_from_disk": round(from_disk / len(queries), 3),
            "load_average": round(os.getloadavg()[0], 1),
        }
        store.disk.close()
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for version in sorted({r["version"] for r in rows}):
        group = sorted((r for r in rows if r["version"] == version), key=lambda r: r["entries"])
        sizes = [r["entries"] for r in group]
        for ax, column in zip(axes, ("bytes_per_entry", "search_cpu_p99_ms", "recall_at_1", "fill_per_s")):
            ax.plot(sizes, [r[column] for r in group], marker="o", label=version)
    for ax, title in zip(axes, ("resident bytes per entry, all in", "search CPU p99 (ms, 1 thread)",
                                "recall@1 vs exact float32", "fill (entries/s; --bulk rows: cold part by put_many)")):
        ax.set_xscale("log")
        ax.set_xlabel("entries (memory tier 10^4, the rest on disk)")
        ax.set_title(title, fontsize=10)
    axes[0].axhline(600, color="grey", linestyle="--", linewidth=1)
    axes[1].set_yscale("log")
    axes[1].axhline(2.0, color="grey", linestyle="--", linewidth=1)
    axes[2].axhline(0.95, color="grey", linestyle="--", linewidth=1)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", type=int, default=10_000)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--kind", default="ivf_sq_int8")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--before-rev", default=None, help="also run the disk tier of this git revision")
    parser.add_argument("--before-queries", type=int, default=60)
    parser.add_argument("--label", default="after", help="the current tree's rows are named so")
    parser.add_argument("--before-only", action="store_true", help="with --before-rev: only that revision")
    parser.add_argument("--bulk", action="store_true",
                        help="fill the cold part with DiskTier.put_many (one commit per 10,000) instead of a demotion per insert")
    parser.add_argument("--merge", default="", help="comma-separated earlier <out> names whose rows come first")
    parser.add_argument("--out", default="disk_tier")
    args = parser.parse_args(argv)
    rows = [row for name in args.merge.split(",") if name
            for row in json.loads((RESULTS / f"{name}.json").read_text())["rows"]]
    for size in [int(s) for s in args.sizes.split(",") if s]:
        versions = ([("before", args.before_rev, args.before_queries)] if args.before_rev else []) \
            + ([] if args.before_only else [(args.label, None, args.queries)])
        for version, rev, queries in versions:
            row = run(version, rev, args.kind, args.memory, size, queries, args.bulk)
            rows.append(row)
            print(f"{version:>6} {size:>8}: {row['in_memory']} in memory + {row['on_disk']} on disk;"
                  f" {row['bytes_per_entry']:.0f} B/entry resident all in (cold estimate"
                  f" {row['cold_estimate_bytes']:.0f} B, file {row['file_bytes_per_entry']} B); fill"
                  f" {row['fill_per_s']}/s ({row['fill_s']} s); search p50/p99 {row['search_p50_ms']}/"
                  f"{row['search_p99_ms']} ms wall, {row['search_cpu_p50_ms']}/{row['search_cpu_p99_ms']} ms CPU;"
                  f" recall@1 {row['recall_at_1']}; best from disk {100 * row['best_from_disk']:.0f}%;"
                  f" load {row['load_average']}", flush=True)
    result = {"rows": rows, "memory_entries": args.memory, "kind": args.kind, "argv": sys.argv[1:]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, RESULTS / f"{args.out}.png")
    return result


if __name__ == "__main__":
    main()
