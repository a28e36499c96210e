"""What "wrong" feedback removing entries does to hits over time (a script, not a test).

banking77 as live traffic with known answers, as the demo runs it (infra/traffic.py). Two
scenarios: (1) the cache is warmed with the train questions (answer = intent), then the test
questions arrive in ``--passes`` shuffled passes (the same questions again: popular questions
come back); (2) it is warmed with train's first half, then the test questions arrive, then
train's second half, paraphrases none of it has seen (does feedback help beyond repeats?). A hit is judged by its intent; a share ``--feedback-rate``
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


def run(encoder, warm, streams, threshold: float, invalidate_after: int, feedback_rate: float,
        seed: int = 7) -> list[dict]:
    """Warm a cache with ``warm``, then serve each stream in turn; figures per stream."""
    experiment = ExperimentConfig(experiment_id="bench", salt="bench", arms=[ArmConfig(
        name="only", threshold=threshold, invalidate_after_wrong=invalidate_after, capacity_entries=100_000)])
    cache = SemanticCache(encoder, ExperimentRegistry({"bench": experiment}), feedback_memory=10_000)
    for i, (text, intent) in enumerate(warm):
        cache.store(text, intent, unit_id=f"w{i}")
    rng, per_pass = random.Random(seed), []
    for number, stream in enumerate(streams, 1):
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


def _label(run_: dict) -> str:
    if not run_["invalidate_after_wrong"]:
        return "feedback removes nothing"
    return f"invalidate after {run_['invalidate_after_wrong']}, feedback on {run_['feedback_rate']:.0%}"


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for run_ in result["repeat"]:
        passes = [p["pass"] for p in run_["passes"]]
        left.plot(passes, [p["false"] for p in run_["passes"]], marker="o", label=_label(run_))
    left.set_title(f"the same {result['test_lookups']} test questions again (cosine {result['threshold']})")
    left.set_xlabel("pass")
    left.set_ylabel("false hits")
    left.set_xticks(passes)
    left.legend(fontsize=8)
    names = ["test questions\n(with feedback)", "unseen paraphrases\n(train, 2nd half)"]
    width = 0.8 / len(result["unseen"])
    for n, run_ in enumerate(result["unseen"]):
        right.bar([x + n * width for x in range(2)], [p["false"] for p in run_["passes"]], width, label=_label(run_))
    right.set_xticks([x + width * (len(result["unseen"]) - 1) / 2 for x in range(2)], names)
    right.set_title("warmed with train's 1st half: then test, then new paraphrases")
    right.set_ylabel("false hits")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _report(name: str, runs: list[dict]) -> None:
    print(name, flush=True)
    for run_ in runs:
        print(f"  {_label(run_)}:", flush=True)
        for p in run_["passes"]:
            print(f"    pass {p['pass']}: {p['lookups']} lookups, hits {p['hits']}, correct {p['correct']}, "
                  f"false {p['false']}, invalidated {p['invalidated']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--feedback-rates", type=float, nargs="+", default=[1.0, 0.2])
    args = parser.parse_args(argv)
    if args.passes < 1 or not all(0 < r <= 1 for r in args.feedback_rates):
        parser.error("need at least one pass and feedback rates in (0, 1]")
    train = list(pd.read_csv(DATA / "train.csv").sample(frac=1.0, random_state=7).itertuples(index=False, name=None))
    test = list(pd.read_csv(DATA / "test.csv").itertuples(index=False, name=None))
    texts = sorted({t for t, _ in train + test})
    print(f"encoding {len(texts)} texts once ...", flush=True)
    encoder = TableEncoder(texts)
    rng = random.Random(7)
    repeats = [rng.sample(test, len(test)) for _ in range(args.passes)]
    half = len(train) // 2
    result = {"threshold": args.threshold, "test_lookups": len(test), "repeat": [], "unseen": []}
    for invalidate_after, rate in [(0, 1.0)] + [(1, r) for r in args.feedback_rates]:
        settings = {"invalidate_after_wrong": invalidate_after, "feedback_rate": rate}
        result["repeat"].append({**settings, "warm_entries": len(train), "passes": run(
            encoder, train, repeats, args.threshold, invalidate_after, rate)})
        result["unseen"].append({**settings, "warm_entries": half, "passes": run(
            encoder, train[:half], [test, train[half:]], args.threshold, invalidate_after, rate)})
    _report("warmed with all of train, the test questions again and again:", result["repeat"])
    _report("warmed with train's first half, then test (with feedback), then train's second half:", result["unseen"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "feedback_invalidation.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / "feedback_invalidation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
