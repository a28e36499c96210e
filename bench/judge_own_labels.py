"""With a user's own labels: how the judge is fitted on them, three ways side by side.

    python -m bench.judge_own_labels [--seeds 4] [--own-labels 2000] [--max-pairs 2500]

For each public set and each seed, a seeded sample of ``--own-labels`` pairs from the set's train
split stands for the user's file, and the other sets are added as public pairs:

* ``min, 80/20``: the min blend, trees on 80% of the own pairs, cut on the other 20% (before;
  ``fit_with_own_labels`` with one fold);
* ``auto, 80/20``: the blend chosen on those 20% (``judge_train.choose_blend``);
* ``auto, 5 folds``: the product's way (``judge_train.fit_with_own_labels``): every own pair
  scored out of fold, the blend, calibration and cut on all of them.

Each is cut at its own 5% operating point; on the set's test split: the share of true
duplicates served and the wrong share of hits at that cut. The seeds vary the sample and the
split, so the spread shows what a user might get. Features are the ones ``bench.judge_quality``
caches. Writes bench/results/judge_own_labels.{json,png}.
"""
from __future__ import annotations

import argparse
import json
import logging

import numpy as np

from bench.judge_quality import MODEL, RESULTS, SOURCES, served_at_cut, shared_features
from cache_core.decision.judge_train import fit_with_own_labels
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.judge_own_labels")
WAYS = ("min, 80/20", "auto, 80/20", "auto, 5 folds")


def compare(feats, seeds: int, own_labels: int) -> dict:
    out = {}
    for held in SOURCES:
        Xt, yt = feats[f"{held}-test"]
        Xo, yo = feats[f"{held}-train"]
        others = [s for s in SOURCES if s != held]
        for seed in range(seeds):
            own = np.random.default_rng(seed).permutation(len(yo))[:own_labels]
            X_extra = np.vstack([feats[f"{s}-train"][0] for s in others])
            y_extra = np.concatenate([feats[f"{s}-train"][1] for s in others])
            for way in WAYS:
                blend, fitting = way.split(", ")
                artifact = fit_with_own_labels(Xo[own], yo[own], X_extra, y_extra, version="bench", encoder=MODEL,
                                               blend=blend, seed=seed, folds=5 if fitting == "5 folds" else 1)
                served, wrong = served_at_cut(artifact.probabilities(Xt), yt, artifact.operating_points["0.05"])
                out.setdefault(held, {}).setdefault(way, []).append(
                    {"seed": seed, "served": served, "wrong": wrong, "blend": artifact.report["blend"]})
            log.info("%s seed %d: %s", held, seed, {w: out[held][w][-1] for w in WAYS})
    return out


def summary(out: dict) -> list[str]:
    lines = ["| test pairs | fitted | served at its own 5% cut (mean, range) | wrong share (mean, max) | chosen |",
             "|---|---|---|---|---|"]
    for held, by_blend in out.items():
        for way, runs in by_blend.items():
            served = [r["served"] * 100 for r in runs]
            wrong = [r["wrong"] * 100 for r in runs]
            chosen = ", ".join(sorted({str(r["blend"] or "none") for r in runs}))
            lines.append(f"| {held} | {way} | {np.mean(served):.1f}% ({min(served):.1f}-{max(served):.1f}) | "
                         f"{np.mean(wrong):.1f}% (max {max(wrong):.1f}) | {chosen} |")
    return lines


def plot(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for way, marker in zip(WAYS, "o^s"):
        for i, held in enumerate(out):
            runs = out[held][way]
            ax.scatter([r["wrong"] * 100 for r in runs], [r["served"] * 100 for r in runs], marker=marker,
                       color=f"C{i}", alpha=0.8, label=f"{held}, {way}")
    ax.axvline(5, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="wrong share of hits at the artifact's 5% cut (%)", ylabel="true duplicates served (%)",
           title="own labels: min 80/20 (o), auto 80/20 (^), auto 5 folds (s)")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(RESULTS / "judge_own_labels.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.judge_own_labels", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--own-labels", type=int, default=2000)
    p.add_argument("--max-pairs", type=int, default=2500, help="as bench.judge_quality (its feature cache)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    feats = shared_features(shared_data_dir(), args.max_pairs)
    out = compare(feats, args.seeds, args.own_labels)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_own_labels.json").write_text(json.dumps(out, indent=1))
    print("\n".join(summary(out)))
    plot(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
