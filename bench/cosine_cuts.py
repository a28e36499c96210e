"""What a static cosine threshold serves, and how much of it is wrong, on human-labelled pairs.

    python -m bench.cosine_cuts [--thresholds 0.80,0.85,0.90,0.93,0.95,0.97] [--guards negation,dates,numbers]
                                [--out cosine_cuts]

For every public labelled split the judge trains on (``judge_shared_pairs.load_pairs``: MRPC and
STS-B train / test, banking77 nearest-neighbour pairs, GPTCache's paraphrases beside unrelated
origins), both sides are encoded with the cache's own encoder (the settings' default, onnx-int8
all-MiniLM-L6-v2) and, per threshold, two numbers are reported: the share of the true duplicates
whose cosine reaches it (what the cache would serve of them) and the share of pairs at or above it
that are not duplicates (the hits that would serve another question's answer). That is the choice
an arm's ``threshold`` makes; the same again with the arm's lexical ``guards`` (cache_core.decision.guards)
vetoing the pairs they catch; ``scache serve``'s default arms (infra/serve-experiments.yaml) are
read off this table.

Prints a table; writes bench/results/<out>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cuts(cosines: np.ndarray, duplicate: np.ndarray, thresholds: list[float],
         allowed: np.ndarray | None = None) -> list[dict]:
    """Per threshold: the share of duplicates served and the wrong share of what is served
    (``allowed``: the pairs no guard vetoes; None: all)."""
    rows = []
    for t in thresholds:
        served = (cosines >= t) & (True if allowed is None else allowed)
        rows.append({"threshold": t, "served": float(served[duplicate].mean()) if duplicate.any() else None,
                     "wrong": float(1.0 - duplicate[served].mean()) if served.any() else None,
                     "hits": int(served.sum())})
    return rows


def measure(data: Path, thresholds: list[float], guards: list[str]) -> dict[str, dict]:
    from cache_core.decision.guards import first_conflict
    from cache_core.decision.judge_shared_pairs import load_pairs
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import get_settings

    embedder = load_embedder(get_settings().cache)
    out = {}
    for name, rows in load_pairs(data, embedder.encode).items():
        started = time.monotonic()
        a = embedder.encode([r[0] for r in rows])
        b = embedder.encode([r[1] for r in rows])
        duplicate = np.array([bool(r[2]) for r in rows])
        cosines = np.sum(a * b, axis=1)
        allowed = np.array([first_conflict(r[1], r[0], guards) is None for r in rows])
        out[name] = {"pairs": len(rows), "duplicates": int(duplicate.sum()),
                     "cuts": cuts(cosines, duplicate, thresholds),
                     "guarded": cuts(cosines, duplicate, thresholds, allowed)}
        print(f"{name}: {len(rows)} pairs encoded in {time.monotonic() - started:.0f} s", flush=True)
    return out


def table(results: dict[str, dict], thresholds: list[float], key: str = "cuts") -> str:
    head = "| pairs (duplicates / all) | " + " | ".join(f"{t:.2f}: served / wrong" for t in thresholds) + " |"
    lines = [head, "|" + "---|" * (len(thresholds) + 1)]
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    for name, r in results.items():
        cells = [f"{pct(c['served'])} / {pct(c['wrong'])}" for c in r[key]]
        lines.append(f"| {name} ({r['duplicates']} / {r['pairs']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], guards: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharex=True, sharey=True)
    for ax, key, title in ((axes[0], "cuts", "cosine threshold alone"),
                           (axes[1], "guarded", f"with guards: {', '.join(guards)}")):
        for name, r in results.items():
            points = [(c["wrong"], c["served"], c["threshold"]) for c in r[key] if c["wrong"] is not None]
            if not points:
                continue
            ax.plot([100 * p[0] for p in points], [100 * p[1] for p in points], marker="o", label=name)
            for wrong, served, t in points:
                ax.annotate(f"{t:.2f}", (100 * wrong, 100 * served), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.axvline(5, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("wrong share of hits (%)")
        ax.set_title(title)
    axes[0].set_ylabel("duplicates served (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Static cosine thresholds on labelled pairs (all-MiniLM-L6-v2, onnx-int8)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--thresholds", default="0.80,0.85,0.90,0.93,0.95,0.97")
    parser.add_argument("--guards", default="negation,dates,numbers")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", default="cosine_cuts")
    args = parser.parse_args(argv)
    thresholds = sorted(float(t) for t in args.thresholds.split(","))
    guards = [g for g in args.guards.split(",") if g]
    results = measure(args.data, thresholds, guards)
    text = (f"Cosine threshold alone:\n\n{table(results, thresholds)}\n\n"
            f"With guards {', '.join(guards)}:\n\n{table(results, thresholds, 'guarded')}")
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"guards": guards, "sets": results}, indent=1))
    (RESULTS / f"{args.out}.md").write_text(f"`python -m bench.cosine_cuts`\n\n{text}\n")
    plot(results, guards, RESULTS / f"{args.out}.png")
    return results


if __name__ == "__main__":
    main()
