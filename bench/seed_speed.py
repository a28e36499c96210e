"""Seeding a cache: one store per call vs ``store_many`` batches (a script, not a test).

The real model (torch, one thread as the service runs it) and a persistent cache with
fsync on, as deployed: banking77 train questions are stored one by one, then the same
number in batches of ``--batch``, each into a fresh cache. Prints records per second.

    python bench/seed_speed.py [--records 2000] [--batch 256]
Saves bench/results/seed_speed.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replication import DATA, RESULTS  # noqa: E402
from cache_core.cache import SemanticCache  # noqa: E402
from cache_core.records import StoreItem  # noqa: E402
from cache_core.embedding.load import load_embedder  # noqa: E402
from cache_core.experiments import ArmConfig, ExperimentConfig  # noqa: E402
from cache_core.state.persistence import Persistence  # noqa: E402
from cache_core.registry import ExperimentRegistry  # noqa: E402
from cache_core.settings import CacheSettings  # noqa: E402


def fresh_cache(embedder, directory: Path) -> tuple[SemanticCache, Persistence]:
    experiment = ExperimentConfig(experiment_id="bench", salt="bench", arms=[ArmConfig(name="only")])
    cache = SemanticCache(embedder, ExperimentRegistry({"bench": experiment}))
    persistence = Persistence(directory, fsync=True)
    persistence.open(cache)
    return cache, persistence


def timed(label: str, run) -> float:
    started = time.perf_counter()
    stored = run()
    seconds = time.perf_counter() - started
    print(f"  {label}: {stored} stored in {seconds:.1f} s", flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    if args.records < 1 or args.batch < 1:
        parser.error("--records and --batch must be positive")
    rows = pd.read_csv(DATA / "train.csv").head(args.records)
    items = [StoreItem(text, intent, f"u{i}") for i, (text, intent) in enumerate(zip(rows.text, rows.category))]
    embedder = load_embedder(CacheSettings())
    embedder.encode(["warm up the model"])
    result = {"records": len(items), "batch": args.batch, "encoder": "torch, 1 thread", "fsync": True}
    with tempfile.TemporaryDirectory(prefix="scache-bench-seed-") as tmp:
        cache, persistence = fresh_cache(embedder, Path(tmp) / "one")
        one = timed("one store per call", lambda: sum(
            cache.store(i.query, i.answer, i.unit_id).stored for i in items))
        persistence.close(final_snapshot=False)
        cache, persistence = fresh_cache(embedder, Path(tmp) / "batched")
        batched = timed(f"store_many, {args.batch} per call", lambda: sum(
            r[0].stored for start in range(0, len(items), args.batch)
            for r in cache.store_many(items[start:start + args.batch])))
        persistence.close(final_snapshot=False)
    result.update(one_per_call_per_s=round(len(items) / one, 1), batched_per_s=round(len(items) / batched, 1),
                  speedup=round(one / batched, 2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "seed_speed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
