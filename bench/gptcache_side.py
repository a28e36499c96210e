"""The GPTCache half of bench/compare_gptcache.py; runs in GPTCache's own venv.

    venv-gptcache/bin/python bench/gptcache_side.py PLAN.json  ->  JSON on stdout

PLAN: {"model_path", "scenarios": [{"name", "store": [[question, answer], ...],
"queries": [question, ...]}]}. GPTCache is set up as its README does for
similar search: ``SBERT`` embeddings (the same local MiniLM weights), sqlite +
FAISS data manager, ``SearchDistanceEvaluation``; ``max_size`` is raised so
nothing is evicted (its default, 1000, would evict most of banking77).

Per query we report the best candidate's score and answer. GPTCache hits iff
the best rank >= (max-min) * threshold and returns the best-ranked answer, so
one pass at a low threshold gives the decision at every higher threshold; a
check pass at the README default (0.8) confirms this on real ``get`` calls.
Scores are converted to cosine: rank = 4 - squared L2 = 2 + 2 cos.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gptcache import Cache, Config
from gptcache.adapter.api import get
from gptcache.embedding import SBERT
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

SCAN_THRESHOLD = 0.5  # GPTCache scale; = cosine 0.0
CHECK_THRESHOLD = 0.8  # GPTCache's README default; = cosine 0.6
CHECK_QUERIES = 200


class RecordingEvaluation(SearchDistanceEvaluation):
    """GPTCache's own evaluation, remembering the ranks it gave."""

    def __init__(self):
        super().__init__()
        self.ranks: list[float] = []

    def evaluation(self, src_dict, cache_dict, **kwargs):
        rank = super().evaluation(src_dict, cache_dict, **kwargs)
        self.ranks.append(rank)
        return rank


def rank_to_cosine(rank: float) -> float:
    return (float(rank) - 2.0) / 2.0


def build_cache(workdir: Path, encoder: SBERT, store: list[list[str]]) -> tuple[Cache, RecordingEvaluation]:
    evaluation = RecordingEvaluation()
    manager = get_data_manager(
        CacheBase("sqlite", sql_url=f"sqlite:///{workdir}/sqlite.db"),
        VectorBase("faiss", dimension=encoder.dimension, index_path=str(workdir / "faiss.index")),
        max_size=max(1000, 2 * len(store)))
    cache = Cache()
    cache.init(pre_embedding_func=get_prompt, embedding_func=encoder.to_embeddings,
               data_manager=manager, similarity_evaluation=evaluation,
               config=Config(similarity_threshold=SCAN_THRESHOLD))
    questions = [q for q, _ in store]
    vectors = encoder.model.encode(questions, batch_size=64, convert_to_numpy=True).astype("float32")
    manager.import_data(questions, [a for _, a in store], list(vectors), [None] * len(store))
    return cache, evaluation


def replay(cache: Cache, evaluation: RecordingEvaluation, queries: list[str]) -> dict:
    cosines, answers, latencies = [], [], []
    for query in queries:
        evaluation.ranks.clear()
        started = time.perf_counter()
        answer = get(query, cache_obj=cache)
        latencies.append((time.perf_counter() - started) * 1000)
        best = max(evaluation.ranks) if evaluation.ranks else None
        cosines.append(rank_to_cosine(best) if best is not None else None)
        answers.append(answer)
    return {"similarity": cosines, "answer": answers, "latency_ms": latencies}


def check_at_default(cache: Cache, evaluation: RecordingEvaluation, queries: list[str],
                     scan: dict) -> dict:
    """Real ``get`` calls at threshold 0.8 agree with the scan's derived decision."""
    cache.config.similarity_threshold = CHECK_THRESHOLD
    agree = 0
    for i, query in enumerate(queries[:CHECK_QUERIES]):
        real = get(query, cache_obj=cache)
        sim = scan["similarity"][i]
        derived = scan["answer"][i] if sim is not None and sim >= 2 * CHECK_THRESHOLD - 1 else None
        agree += real == derived
    cache.config.similarity_threshold = SCAN_THRESHOLD
    return {"threshold": CHECK_THRESHOLD, "queries": min(CHECK_QUERIES, len(queries)), "agree": agree}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    encoder = SBERT(plan["model_path"])
    out = {"gptcache_version": __import__("gptcache").__version__, "scenarios": {}}
    for scenario in plan["scenarios"]:
        with tempfile.TemporaryDirectory(prefix="gptcache-bench-") as tmp:
            cache, evaluation = build_cache(Path(tmp), encoder, scenario["store"])
            for query in scenario["queries"][:10]:  # warm-up
                get(query, cache_obj=cache)
            scan = replay(cache, evaluation, scenario["queries"])
            scan["check"] = check_at_default(cache, evaluation, scenario["queries"], scan)
            out["scenarios"][scenario["name"]] = scan
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
