"""Adaptive vs fixed TTL, replayed on the same traffic: hit rate, false and stale hits, and
the entries held, side by side.

    python -m bench.ttl_replay [--hours 1.5] [--threshold 0.80] [--out ttl_replay]

Traffic: banking77's test questions (encoded for real by the cache's encoder, as in
bench.index_kinds) on a time axis. Every intent repeats at its own mix of intervals: short
bursts (exponential gaps, mean 10 s), medium (mean 60 s) and long (mean 10 min) gaps, with
weights drawn per intent (Dirichlet), so some intents are bursty, some steady, some rare;
each arrival asks a random test question of its intent. A miss stores that question with its
intent's current answer (provenance: the intent, version 1). Half-way through, the answers of
a quarter of the intents change (version 2): a hit served by an entry of the old version
after that is a *stale* hit (nothing purges them: only the lifetime bounds how long a stale
answer keeps being served). A hit whose entry is of another intent is a *false* hit.

Policies, each on its own cache over the identical stream (one arm, cosine ``--threshold``,
a manual clock, the background expiry sweep every 10 simulated seconds): ``absolute`` TTL 60 /
300 / 3600 s (the last the demo's default), ``sliding`` 120 s, and ``adaptive`` (cache_core.adaptive_ttl, clamped 0-300 s).
Reported per policy: hit rate, correct / false / stale hits, misses (= upstream calls),
entries held (mean and max over the run, sampled every 10 s) and the mean predicted TTL.

Prints a table; writes bench/results/<out>.json and <out>.png.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench.index_kinds import encoded, unit
from cache_core.embedding.embedder import normalise
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ExperimentRegistry
from cache_core.cache import SemanticCache
from infra.runtime import BANKING77_DIR

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_S = 10.0
GAP_MEANS_S = (10.0, 60.0, 600.0)

POLICIES: dict[str, dict] = {
    "absolute 60 s": {"ttl_policy": "absolute", "ttl_s": 60.0},
    "absolute 300 s": {"ttl_policy": "absolute", "ttl_s": 300.0},
    "absolute 3600 s": {"ttl_policy": "absolute", "ttl_s": 3600.0},
    "sliding 120 s": {"ttl_policy": "sliding", "ttl_s": 120.0},
    "adaptive 0-300 s": {"ttl_policy": "adaptive", "ttl_min_s": 0.0, "ttl_max_s": 300.0},
}


class Table:
    """The encoder stand-in: the precomputed embedding of each test question."""

    def __init__(self, texts: list[str], vecs: np.ndarray):
        self.dim = vecs.shape[1]
        self.by_text = dict(zip(texts, vecs))

    def encode_with_norms(self, texts):
        return normalise(np.vstack([self.by_text[t] for t in texts]))

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]


def traffic(labels: list[str], hours: float, seed: int = 0) -> pd.DataFrame:
    """(t, row) sorted by time: each intent's arrivals from its own mix of gap lengths."""
    rng = np.random.default_rng(seed)
    horizon = hours * 3600
    rows_of: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        rows_of.setdefault(label, []).append(i)
    arrivals = []
    for label, rows in rows_of.items():
        weights = rng.dirichlet((1.0, 1.0, 1.0))
        t = rng.uniform(0, 600)
        while t < horizon:
            arrivals.append((t, int(rng.choice(rows))))
            t += rng.exponential(GAP_MEANS_S[rng.choice(3, p=weights)])
    return pd.DataFrame(arrivals, columns=["t", "row"]).sort_values("t", ignore_index=True)


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def replay(name: str, arm: dict, stream: pd.DataFrame, texts: list[str], labels: list[str],
           vecs: np.ndarray, changed: set[str], change_at: float, threshold: float) -> dict:
    exp = ExperimentConfig(experiment_id="ttl", salt="s", arms=[ArmConfig(name="a", threshold=threshold,
                                                                          ann_check_rate=0.0, **arm)])
    clock = Clock()
    start = clock.now
    predicted: list[float] = []

    def sink(event) -> None:
        if event.ttl_predicted_s is not None:
            predicted.append(event.ttl_predicted_s)

    cache = SemanticCache(Table(texts, vecs), ExperimentRegistry({"ttl": exp}), clock=clock, event_sink=sink,
                          seed=1)
    label_of: dict[str, tuple[str, int]] = {}  # entry id -> (intent, answer version)
    counts = dict(lookups=0, hits=0, correct=0, false=0, stale=0, stored=0)
    held: list[int] = []
    next_sweep = start + SWEEP_S
    for t, row in zip(stream.t, stream.row):
        clock.now = start + t
        while next_sweep <= clock.now:
            saved, clock.now = clock.now, next_sweep
            cache.drop_expired()
            held.append(sum(len(p) for p in cache.stores.all()))
            clock.now, next_sweep = saved, next_sweep + SWEEP_S
        label = labels[row]
        version = 2 if label in changed and t >= change_at else 1
        result = cache.lookup(texts[row], unit_id=f"u{row % 500}", experiment_id="ttl")
        counts["lookups"] += 1
        if result.hit:
            counts["hits"] += 1
            served_label, served_version = label_of[result.entry_id]
            if served_label != label:
                counts["false"] += 1
            elif served_version != version:
                counts["stale"] += 1
            else:
                counts["correct"] += 1
            continue
        stored = cache.store(texts[row], f"{label} v{version}", unit_id=f"u{row % 500}", experiment_id="ttl",
                             provenance_source=label, provenance_version=str(version))
        if stored.stored:
            counts["stored"] += 1
            label_of[stored.entry_id] = (label, version)
    cache.flush_events()
    n = counts["lookups"]
    return {"policy": name, **counts, "hit_rate": counts["hits"] / n, "correct_rate": counts["correct"] / n,
            "false_rate": counts["false"] / n, "stale_rate": counts["stale"] / n,
            "stale_share_of_hits": counts["stale"] / max(counts["hits"], 1),
            "entries_mean": float(np.mean(held)), "entries_max": int(np.max(held)),
            "ttl_predicted_mean_s": float(np.mean(predicted)) if predicted else None}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["policy"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = np.arange(len(rows))
    axes[0].bar(x, [100 * r["correct_rate"] for r in rows], label="correct")
    axes[0].bar(x, [100 * r["stale_rate"] for r in rows], bottom=[100 * r["correct_rate"] for r in rows],
                label="stale")
    axes[0].bar(x, [100 * r["false_rate"] for r in rows],
                bottom=[100 * (r["correct_rate"] + r["stale_rate"]) for r in rows], label="false")
    axes[0].set_ylabel("% of lookups")
    axes[0].set_title("hits")
    axes[0].legend()
    axes[1].bar(x, [100 * r["stale_share_of_hits"] for r in rows], color="tab:orange")
    axes[1].set_title("stale hits, % of hits")
    axes[2].bar(x, [r["entries_mean"] for r in rows], color="tab:green")
    axes[2].set_title("entries held (mean)")
    for ax in axes:
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("TTL policies replayed on the same banking77 traffic")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=1.5)
    parser.add_argument("--threshold", type=float, default=0.80)
    parser.add_argument("--changed-share", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="ttl_replay")
    args = parser.parse_args(argv)
    test = pd.read_csv(BANKING77_DIR / "test.csv")
    texts, labels = list(test.text), list(test.category)
    vecs = unit(encoded("test"))
    stream = traffic(labels, args.hours, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    intents = sorted(set(labels))
    changed = set(rng.choice(intents, int(len(intents) * args.changed_share), replace=False))
    change_at = args.hours * 3600 / 2
    print(f"{len(stream)} lookups over {args.hours:g} h, {len(intents)} intents, "
          f"{len(changed)} of them change answer at {change_at / 3600:g} h", flush=True)
    rows = []
    for name, arm in POLICIES.items():
        started = time.perf_counter()
        row = replay(name, arm, stream, texts, labels, vecs, changed, change_at, args.threshold)
        rows.append(row)
        ttl = f"{row['ttl_predicted_mean_s']:.0f} s" if row["ttl_predicted_mean_s"] is not None else "-"
        print(f"{name:>17}  hit {100 * row['hit_rate']:5.1f}%  correct {row['correct']:5d}  false {row['false']:4d}"
              f"  stale {row['stale']:4d} ({100 * row['stale_share_of_hits']:.1f}% of hits)  stored {row['stored']:5d}"
              f"  entries mean {row['entries_mean']:6.0f} max {row['entries_max']:5d}  ttl {ttl}"
              f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    result = {"lookups": len(stream), "hours": args.hours, "threshold": args.threshold,
              "changed_intents": sorted(changed), "change_at_s": change_at, "seed": args.seed, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, RESULTS / f"{args.out}.png")
    return result


if __name__ == "__main__":
    main()
