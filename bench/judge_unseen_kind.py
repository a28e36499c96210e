"""Does a judge trained on public sets alone keep its promise on a kind of pair it never saw?

    python -m bench.judge_unseen_kind [--seeds 3] [--max-pairs 2500]

Each public set T (MRPC, STS-B, banking77 neighbour pairs, GPTCache's mock pairs) is in turn
left out entirely. On the other three sets' train splits (per seed: a seeded 90% sample of each
and a seeded 80/20 split), the product's own public-only fit (``judge_train.fit_shared``, as
``judge-train --shared-data`` runs it) gives both rules' cuts in one report:

* sources (before): the strictest of the three sets' own cuts on their held-out rows;
* unseen kind (``judge_train.unseen_kind_cut``): that, then no looser than holding the target on
  each of the three sets left out in turn allows. Nested: it runs on the three sets only, so T
  never influences the cut.

On T's test split, at 2 / 5 / 10% targets: the wrong share of hits and the share of T's true
duplicates served at each cut; the same for a cosine threshold picked from the same three sets'
rows (``cosine_cuts``: what a user without the judge would ship); and cosine's best cut there
(an oracle on T's test split, for reference). Seeds give the ranges. Features are the ones ``bench.judge_quality`` caches.
Writes bench/results/judge_unseen_kind.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np

from bench.judge_quality import MODEL, RESULTS, SOURCES, TARGETS, recall_at, served_at_cut, shared_features
from cache_core.decision.judge_cuts import by_source, operating_points, strictest_over_sources
from cache_core.decision.judge_train import fit_shared
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.judge_unseen_kind")
RULES = {"sources": "strictest over sources", "unseen kind": "kinds left out"}
"""Column name -> the key of its cuts in the report's ``operating_points_by_rule``."""
COLUMNS = ("cosine cut", *RULES)
"""Per run: a static threshold chosen the same way (``cosine_cuts``), then the judge's two rules."""
SAMPLE = 0.9


def training_set(feats, sources: list[str], seed: int):
    """The sets' train splits, a seeded ``SAMPLE`` of each: (X, y, each row's set)."""
    rng = np.random.default_rng(seed)
    parts = []
    for src in sources:
        X, y = feats[f"{src}-train"]
        keep = np.sort(rng.permutation(len(y))[:int(SAMPLE * len(y))])
        parts.append((X[keep], y[keep], np.full(len(keep), src)))
    return tuple(np.concatenate(p) for p in zip(*parts))


def cosine_cuts(cosine: np.ndarray, y: np.ndarray, sources: np.ndarray) -> dict[str, float]:
    """A threshold picked from the same public rows the way the judge's "sources" rule picks its
    cut: per target, the pooled operating point raised to the strictest of the sets' own (the same
    Jeffreys bound; nothing is fitted, so every row counts). What the judge's cut has to beat on a
    kind neither has seen."""
    pooled = {k: v["accept_at"] for k, v in operating_points(cosine, y).items()}
    return strictest_over_sources(pooled, by_source(cosine, y, sources))


def evaluate(feats, seeds: int) -> dict:
    out = {}
    for held in SOURCES:
        Xt, yt = feats[f"{held}-test"]
        row = {"pairs": int(len(yt)), "duplicates": int(yt.sum()),
               "cosine": {f"{t:.2f}": recall_at(Xt[:, 0], yt, t) for t in TARGETS}, "runs": []}
        for seed in range(seeds):
            X, y, src = training_set(feats, [s for s in SOURCES if s != held], seed)
            started = time.monotonic()
            artifact = fit_shared(X, y, src, version="bench", encoder=MODEL, seed=seed, shared_cut="unseen kind")
            prob = artifact.probabilities(Xt)
            run = {"seed": seed, "fit_s": round(time.monotonic() - started, 1),
                   "kind_left_out_points": artifact.report.get("kind_left_out_points", {})}
            columns = {"cosine cut": (Xt[:, 0], cosine_cuts(X[:, 0], y, src))}
            columns |= {name: (prob, artifact.report["operating_points_by_rule"][key]) for name, key in RULES.items()}
            for name, (score, cuts) in columns.items():
                run[name] = {}
                for target, cut in cuts.items():
                    served, wrong = served_at_cut(score, yt, cut)
                    run[name][target] = {"accept_at": cut, "served": served, "wrong": wrong}
            row["runs"].append(run)
            log.info("%s seed %d: %s", held, seed, json.dumps({n: run[n] for n in COLUMNS}))
        out[held] = row
    return out


def summary(out: dict) -> list[str]:
    lines = ["| never-seen set | target | cosine, best cut | " +
             " | ".join(f"{name}: served (range) | {name}: wrong (max)" for name in COLUMNS) + " |",
             "|---|---|---|" + "---|---|" * len(COLUMNS)]
    for held, row in out.items():
        for t in TARGETS:
            key = f"{t:.2f}"
            cells = []
            for name in COLUMNS:
                served = [r[name][key]["served"] * 100 for r in row["runs"]]
                wrong = [r[name][key]["wrong"] * 100 for r in row["runs"]]
                cells += [f"{np.mean(served):.1f}% ({min(served):.1f}-{max(served):.1f})",
                          f"{np.mean(wrong):.1f}% (max {max(wrong):.1f})"]
            lines.append(f"| {held} ({row['duplicates']} dup / {row['pairs']}) | {t:.0%} | "
                         f"{row['cosine'][key]:.1%} | " + " | ".join(cells) + " |")
    return lines


def plot(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(out), figsize=(4 * len(out), 3.8), sharey=True)
    for ax, (held, row) in zip(np.atleast_1d(axes), out.items()):
        for i, t in enumerate(TARGETS):
            key = f"{t:.2f}"
            for name, marker in zip(COLUMNS, "sox"):
                ax.scatter([r[name][key]["wrong"] * 100 for r in row["runs"]],
                           [r[name][key]["served"] * 100 for r in row["runs"]], marker=marker, color=f"C{i}",
                           label=f"{name}, {t:.0%}")
            ax.scatter([t * 100], [row["cosine"][key] * 100], marker="*", s=90, color=f"C{i}",
                       label=f"cosine best cut, {t:.0%}")
            ax.axvline(t * 100, color=f"C{i}", linestyle=":", linewidth=0.8)
        ax.set(title=f"{held} never seen", xlabel="wrong share of hits at the artifact's cut (%)")
    np.atleast_1d(axes)[0].set_ylabel("true duplicates served (%)")
    np.atleast_1d(axes)[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(RESULTS / "judge_unseen_kind.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.judge_unseen_kind", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-pairs", type=int, default=2500, help="as bench.judge_quality (its feature cache)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    feats = shared_features(shared_data_dir(), args.max_pairs)
    out = evaluate(feats, args.seeds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_unseen_kind.json").write_text(json.dumps(out, indent=1))
    lines = summary(out)
    (RESULTS / "judge_unseen_kind.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
