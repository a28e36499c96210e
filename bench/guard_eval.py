"""Measure the lexical guards on banking77: false hits removed vs correct hits lost.

``python -m bench.guard_eval [--threshold 0.8] [--data DIR] [--embeddings-cache DIR]``

Warms a flat index with train.csv (answer = the intent), replays test.csv as
traffic, and decides like SemanticCache (top-5 candidates above the threshold,
the first one every enabled guard lets pass is served). A hit is correct when
the served entry has the query's intent, false otherwise. For each guard alone
and all together it prints hits, false hits and the difference to no guard.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import faiss
import numpy as np
import pandas as pd

from cache_core.decision.guards import GUARD_ORDER, first_conflict
from infra.runtime import BANKING77_DIR

K = 5


def _embed(texts: list[str], cache_file: Path | None) -> np.ndarray:
    if cache_file is not None and cache_file.exists():
        return np.load(cache_file)
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    vecs = load_embedder(CacheSettings()).encode(texts)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache_file, vecs)
    return vecs


def evaluate(train: pd.DataFrame, test: pd.DataFrame, train_vecs: np.ndarray,
             test_vecs: np.ndarray, threshold: float, guards: list[str]) -> dict:
    index = faiss.IndexFlatIP(train_vecs.shape[1])
    index.add(np.ascontiguousarray(train_vecs, dtype=np.float32))
    sims, ids = index.search(np.ascontiguousarray(test_vecs, dtype=np.float32), K)
    counts = {"hits": 0, "correct": 0, "false": 0, "blocked": {g: 0 for g in guards}}
    for row, (query, intent) in enumerate(zip(test.text, test.category)):
        for sim, idx in zip(sims[row], ids[row]):
            if sim < threshold:
                break
            guard = first_conflict(query, train.text.iat[idx], guards)
            if guard is not None:
                counts["blocked"][guard] += 1
                continue
            counts["hits"] += 1
            counts["correct" if train.category.iat[idx] == intent else "false"] += 1
            break
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.guard_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--data", type=Path, default=BANKING77_DIR)
    parser.add_argument("--embeddings-cache", type=Path, default=None,
                        help="keep train/test embeddings here (.npy) between runs")
    args = parser.parse_args(argv)
    if not -1.0 <= args.threshold <= 1.0:  # a cosine; also refuses nan
        parser.error(f"--threshold must be in [-1, 1], got {args.threshold}")
    try:
        train = pd.read_csv(args.data / "train.csv")
        test = pd.read_csv(args.data / "test.csv")
    except FileNotFoundError as exc:
        print(f"banking77 not found: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # a directory, not UTF-8, not CSV (pandas' errors are ValueErrors)
        print(f"banking77 unreadable in {args.data}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    for name, frame in (("train", train), ("test", test)):
        if not {"text", "category"} <= set(frame.columns):
            print(f"banking77 {args.data / name}.csv needs columns text and category, has {list(frame.columns)}",
                  file=sys.stderr)
            return 2
    cache = args.embeddings_cache
    try:
        train_vecs = _embed(train.text.tolist(), cache / "train.npy" if cache else None)
        test_vecs = _embed(test.text.tolist(), cache / "test.npy" if cache else None)
    except (OSError, ValueError) as exc:  # a cache file that is not .npy, a cache dir that cannot be written
        print(f"embeddings cache {cache}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    base = evaluate(train, test, train_vecs, test_vecs, args.threshold, [])
    print(f"threshold {args.threshold}: {len(test)} queries, no guard: {base['hits']} hits, "
          f"{base['false']} false ({base['false'] / max(base['hits'], 1):.1%})")
    for guards in [[g] for g in GUARD_ORDER] + [list(GUARD_ORDER)]:
        got = evaluate(train, test, train_vecs, test_vecs, args.threshold, guards)
        print(f"{'+'.join(guards):32} hits {got['hits']:5}  false {got['false']:4} "
              f"({got['false'] / max(got['hits'], 1):.1%})  false removed {base['false'] - got['false']:4}  "
              f"correct lost {base['correct'] - got['correct']:4}  blocks {got['blocked']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
