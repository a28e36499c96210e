"""What "wrong" feedback removing entries does to hits over time (a script, not a test).

banking77 as live traffic with known answers, as the demo runs it (infra/traffic.py): the
cache is warmed with the train questions (answer = intent), then the test questions arrive
in ``--passes`` shuffled passes (the same questions again: popular questions come back). A hit is judged by its intent; a share ``--feedback-rate``
of hits get their verdict back through ``SemanticCache.apply_feedback``; a miss stores the
question with its own intent's answer (the model's reply). The same stream runs once per
``invalidate_after_wrong`` setting (0: feedback removes nothing) and feedback rate.

    python bench/feedback_invalidation.py [--threshold 0.8] [--passes 3] [--feedback-rates 1.0 0.2]
Prints correct / false hits per pass and saves bench/results/feedback_invalidation.json and
.png. Embeddings are computed once, in batches (bench/replication.py's TableEncoder).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replication import DATA, RESULTS, TableEncoder  # noqa: E402
from cache_core.cache import SemanticCache  # noqa: E402
from cache_core.experiments import ArmConfig, ExperimentConfig  # noqa: E402
from cache_core.registry import ExperimentRegistry  # noqa: E402


def run(encoder, train, test, threshold: float, invalidate_after: int, feedback_rate: float,
        passes: int, seed: int = 7) -> list[dict]:
    experiment = ExperimentConfig(experiment_id="bench", salt="bench", arms=[ArmConfig(
        name="only", threshold=threshold, invalidate_after_wrong=invalidate_after, capacity_entries=100_000)])
    cache = SemanticCache(encoder, ExperimentRegistry({"bench": experiment}), feedback_memory=10_000)
    for i, (text, intent) in enumerate(train):
        cache.store(text, intent, unit_id=f"w{i}")
    rng, per_pass = random.Random(seed), []
    for number in range(1, passes + 1):
        stream = list(test)
        rng.shuffle(stream)
        hits = correct = invalidated = 0
        for i, (text, intent) in enumerate(stream):
            result = cache.lookup(text, unit_id=f"u{i}")
            if not result.hit:
                cache.store(text, intent, unit_id=f"u{i}")
                continue
            hits += 1
            right = result.answer == intent
            correct += right
            if rng.random() < feedback_rate:
                invalidated += cache.apply_feedback(result.request_id, "correct" if right else "wrong") == "invalidated"
        per_pass.append({"pass": number, "lookups": len(stream), "hits": hits, "correct": correct,
                         "false": hits - correct, "invalidated": invalidated})
    return per_pass


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run_ in result["runs"]:
        label = (f"invalidate after {run_['invalidate_after_wrong']}, feedback on {run_['feedback_rate']:.0%}"
                 if run_["invalidate_after_wrong"] else "feedback removes nothing")
        passes = [p["pass"] for p in run_["passes"]]
        left.plot(passes, [p["false"] for p in run_["passes"]], marker="o", label=label)
        right.plot(passes, [p["correct"] for p in run_["passes"]], marker="o", label=label)
    left.set_title(f"false hits per pass of {result['lookups']} lookups (cosine {result['threshold']})")
    right.set_title("correct hits per pass")
    for axis in (left, right):
        axis.set_xlabel("pass over banking77 test")
        axis.set_xticks(passes)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--feedback-rates", type=float, nargs="+", default=[1.0, 0.2])
    args = parser.parse_args(argv)
    if args.passes < 1 or not all(0 < r <= 1 for r in args.feedback_rates):
        parser.error("need at least one pass and feedback rates in (0, 1]")
    train = list(pd.read_csv(DATA / "train.csv").itertuples(index=False, name=None))
    test = list(pd.read_csv(DATA / "test.csv").itertuples(index=False, name=None))
    texts = sorted({t for t, _ in train + test})
    print(f"encoding {len(texts)} texts once ...", flush=True)
    encoder = TableEncoder(texts)
    settings = [(0, 1.0)] + [(1, rate) for rate in args.feedback_rates]
    result = {"threshold": args.threshold, "warm_entries": len(train), "lookups": len(test), "runs": []}
    for invalidate_after, rate in settings:
        passes = run(encoder, train, test, args.threshold, invalidate_after, rate, args.passes)
        result["runs"].append({"invalidate_after_wrong": invalidate_after, "feedback_rate": rate, "passes": passes})
        print(f"invalidate_after_wrong={invalidate_after} feedback_rate={rate}:", flush=True)
        for p in passes:
            print(f"  pass {p['pass']}: hits {p['hits']}, correct {p['correct']}, false {p['false']}, "
                  f"invalidated {p['invalidated']}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "feedback_invalidation.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "feedback_invalidation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
