"""The disk tier: entries held per byte of memory, and what a lookup pays to search it.

    python -m bench.disk_tier [--memory 1000] [--sizes 10000,100000] [--queries 300] [--out disk_tier]

One store (``Partition``, flat index) with room for ``--memory`` entries in memory and a
disk tier behind it, filled to each size with banking77-derived vectors (bench.index_kinds'
corpus: real train encodings, noisy copies, random unit vectors) carrying banking77-sized
texts; queries are banking77 test encodings. Reports per size: memory charged per hot entry
(``capacity_bytes`` accounting: texts + two float32 copies + overhead) vs resident per cold
one (float16 code + id + maps), bytes per entry in the SQLite file, fill rate (every insert
past the memory demotes one), the search time of a lookup over both tiers p50/p99 (wall;
the cold codes are a full float16 scan), and how often the best candidate came from disk.

Prints a table; writes bench/results/<out>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.index_kinds import corpus, encoded, unit
from cache_core.records import CacheEntry, entry_bytes
from cache_core.store.factory import Backends
from cache_core.store.faiss import IndexSpec, set_search_threads
from cache_core.store.partition import Partition

RESULTS = Path(__file__).resolve().parent / "results"
QUERY = "How do I know if my card has been delivered to the right address?"
ANSWER = "Your card is on its way: you can follow its delivery in the app under Card > Track. " * 3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", type=int, default=1000)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--out", default="disk_tier")
    args = parser.parse_args(argv)
    set_search_threads(1)
    real, queries = unit(encoded("train")), unit(encoded("test"))[: args.queries]
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        vecs = corpus(real, size)
        with tempfile.TemporaryDirectory() as tmp:
            store = Partition(("bench", "disk", str(size)), vecs.shape[1], IndexSpec("flat"), args.memory,
                              1 << 40, Backends(disk_dir=Path(tmp)))
            store.reconfigure(IndexSpec("flat"), args.memory, 1 << 40, disk_entries=size)
            now = time.time()
            started = time.perf_counter()
            for i, vec in enumerate(vecs):
                entry = CacheEntry(entry_id=f"e{i}", query=QUERY, embedding=vec, answer=ANSWER, created_at=now,
                                   ttl_s=86400.0, ttl_policy="absolute", max_age_s=86400.0, namespace="bench",
                                   intent_cluster=-1, approx_bytes=entry_bytes(QUERY, ANSWER, vec))
                store.evict_for(entry.approx_bytes, now)
                store.insert(entry)
            fill_s = time.perf_counter() - started
            times, cold_best = [], 0
            for query in queries:
                t0 = time.perf_counter()
                outcome = store.search(query, None, now)
                times.append((time.perf_counter() - t0) * 1000)
                cold_best += bool(outcome.best) and outcome.best.tier == "disk"
            hot = next(iter(store.entries.values())).approx_bytes
            file_bytes = sum(os.path.getsize(p) for p in Path(tmp).iterdir())
            row = {"entries": size, "in_memory": len(store), "on_disk": store.cold(),
                   "hot_bytes_per_entry": hot, "cold_resident_bytes_per_entry": store.disk.memory_bytes() / store.cold(),
                   "file_bytes_per_entry": round(file_bytes / store.cold()), "fill_per_s": round(size / fill_s),
                   "search_p50_ms": round(float(np.percentile(times, 50)), 3),
                   "search_p99_ms": round(float(np.percentile(times, 99)), 3),
                   "best_from_disk": cold_best / len(queries)}
            store.disk.close()
        rows.append(row)
        print(f"{size:>8}: memory {row['in_memory']} + disk {row['on_disk']}; hot {row['hot_bytes_per_entry']} B"
              f" vs cold {row['cold_resident_bytes_per_entry']:.0f} B resident ({row['file_bytes_per_entry']} B in"
              f" the file); fill {row['fill_per_s']}/s; search p50 {row['search_p50_ms']} ms p99"
              f" {row['search_p99_ms']} ms; best from disk {100 * row['best_from_disk']:.0f}%", flush=True)
    result = {"rows": rows, "memory_entries": args.memory, "load_average": [round(x, 2) for x in os.getloadavg()]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
