"""Error-bounded thresholds vs global thresholds, replaying banking77 (issue 25 part 3).

``python -m bench.error_bound [--hit-share 0.25] [--near-miss-share 1.0] [--band 0.1]
[--start 0.90] [--start-threshold 1.0] [--compare-start] [--compare-audit] [--warm-share 1.0]
[--estimators staircase curves] [--mix-gptcache] [--out bench/results/error_bound]``

banking77 train.csv warms the cache (answer = the intent), test.csv is the live traffic,
in file order (with ``--warm-share`` below 1 a seeded share of train warms and the rest of
train is streamed before test). A hit is correct when the served entry has the query's
intent. Like the cache, every miss stores its query. Verdicts arrive at once for a sampled
``--hit-share`` of hits and ``--near-miss-share`` of near-misses (a miss whose nearest
candidate lies within ``--band`` below the threshold used: the shadow check's band), and go
into the same ``VerdictBook`` ``HitRule.decide`` reads. Intent clusters are the cache's own
(``OnlineClusters``, radius 0.55), not the labels.

Compared, each on the same stream: global thresholds on a grid, the best global cut for
each δ (chosen on this very stream: an oracle no deployment has, so a generous baseline),
and the error-bounded policy at δ = 0.02, 0.05, 0.10 starting from ``--start``, once per
``--estimators`` (the curves estimator and the staircase it replaced, by default). Printed and
written: realised false-hit rate (wrong share of hits) and hit rate overall and per window
of ``--window`` queries, the share of lookups each level decided, and a PNG.
The cold start: until its threshold is learnt the arm serves at or above
max(``--start``, ``--start-threshold``) (the policy's ``start_threshold``, default 1.0: only
exact repeats); ``--compare-start`` also replays each arm with ``start_threshold`` = ``--start``
(the unbounded start it had before) and prints both first windows' wrong hits;
``--compare-audit`` also replays each curves arm with ``audit: false`` (the curves' cuts alone,
before the evidence audit) and keeps it as ``audit_off``.
``--mix-gptcache`` adds GPTCache's mock pairs (origin stored, paraphrase queried; correct if
its own origin) to the same cache, banking77 being unrelated traffic for them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cache_core.clusters import OnlineClusters
from cache_core.decision.error_bound import Judged
from cache_core.decision.rule import HitRule
from cache_core.embedding.onnx import ENCODING_VERSION
from cache_core.experiments import ArmConfig
from cache_core.records import CacheEntry, Candidate
from cache_core.runtime import scache_home
from infra.runtime import BANKING77_DIR, shared_data_dir

DELTAS = (0.02, 0.05, 0.10)
GLOBAL_GRID = tuple(round(t, 2) for t in np.arange(0.70, 0.991, 0.01))
K = 5
EXPERIMENT = "bench"


@dataclass
class Stream:
    warm_texts: list[str]
    warm_labels: list[str]
    warm_vecs: np.ndarray
    live_texts: list[str]
    live_labels: list[str]
    live_vecs: np.ndarray
    name: str


def encoded(texts: list[str], name: str) -> np.ndarray:
    """``texts`` encoded by the cache's default encoder, kept under SCACHE_HOME/bench by ``name``."""
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    settings = CacheSettings()
    store = scache_home() / "bench" / f"{name}-{settings.encoder_backend}-e{ENCODING_VERSION}.npy"
    if store.exists():
        vecs = np.load(store)
        if len(vecs) == len(texts):
            return vecs.astype(np.float32)
    vecs = load_embedder(settings).encode(texts).astype(np.float32)
    store.parent.mkdir(parents=True, exist_ok=True)
    np.save(store, vecs)
    return vecs


def banking77_stream(data: Path, warm_share: float, seed: int) -> Stream:
    train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
    train_vecs, test_vecs = encoded(list(train.text), "banking77-train"), encoded(list(test.text), "banking77-test")
    order = np.random.default_rng(seed).permutation(len(train))
    cut = int(round(warm_share * len(train)))
    warm, rest = (np.arange(len(train)), np.arange(0)) if warm_share >= 1 else (order[:cut], order[cut:])
    texts, labels = list(train.text), list(train.category)
    return Stream([texts[i] for i in warm], [labels[i] for i in warm], train_vecs[warm],
                  [texts[i] for i in rest] + list(test.text), [labels[i] for i in rest] + list(test.category),
                  np.vstack([train_vecs[rest], test_vecs]), "banking77")


def with_gptcache(stream: Stream, mock: Path, seed: int) -> Stream:
    """The same stream plus GPTCache's mock pairs: origins warm, paraphrases shuffled into the live traffic."""
    pairs = json.loads(mock.read_text())
    origins, similar = [p["origin"] for p in pairs], [p["similar"] for p in pairs]
    labels = [f"mock-{i}" for i in range(len(pairs))]
    live_texts, live_labels = stream.live_texts + similar, stream.live_labels + labels
    live_vecs = np.vstack([stream.live_vecs, encoded(similar, "gptcache-mock-similar")])
    order = np.random.default_rng(seed).permutation(len(live_texts))
    return Stream(stream.warm_texts + origins, stream.warm_labels + labels,
                  np.vstack([stream.warm_vecs, encoded(origins, "gptcache-mock-origin")]),
                  [live_texts[i] for i in order], [live_labels[i] for i in order], live_vecs[order],
                  "banking77+gptcache-mock")


def unit(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


@dataclass
class Prepared:
    """What every policy's replay of a stream shares: the warm entries, each live query's
    intent cluster and its nearest warm entries (the warm part of the index never changes)."""

    stream: Stream
    live: np.ndarray
    warm_entries: list[CacheEntry]
    live_clusters: list[int]
    warm_top: np.ndarray
    warm_top_sims: np.ndarray


def prepare(stream: Stream) -> Prepared:
    warm, live = unit(stream.warm_vecs), unit(stream.live_vecs)
    clusters = OnlineClusters(warm.shape[1], radius=0.55, background=False)  # retrain inline: reproducible
    entries = [_entry(f"w{i}", text, label, int(clusters.assign(vec)))
               for i, (text, label, vec) in enumerate(zip(stream.warm_texts, stream.warm_labels, warm))]
    live_clusters = [int(clusters.assign(vec)) for vec in live]
    tops, top_sims = [], []
    for start in range(0, len(live), 1024):
        sims = live[start:start + 1024] @ warm.T
        top = np.argpartition(-sims, K, axis=1)[:, :K]
        tops.append(top)
        top_sims.append(np.take_along_axis(sims, top, axis=1))
    return Prepared(stream, live, entries, live_clusters, np.vstack(tops), np.vstack(top_sims))


def simulate(prepared: Prepared, arm: ArmConfig, *, hit_share: float, near_share: float, band: float,
             seed: int, window: int, weighted: bool = True) -> dict:
    """Replay the live traffic through ``HitRule.decide`` with verdicts fed back; the figures.
    Each verdict carries its check probability (``hit_share`` or ``near_share``), or 1.0 when not
    ``weighted`` (how the verdicts were recorded before they were weighted)."""
    rng = np.random.default_rng(seed)
    rule = HitRule()
    stream, live = prepared.stream, prepared.live
    stored_vecs = np.zeros_like(live)
    stored: list[CacheEntry] = []
    hits, wrongs, sources, thresholds, verdicts = [], [], [], [], 0
    for i, (text, label, vec) in enumerate(zip(stream.live_texts, stream.live_labels, live)):
        cluster = prepared.live_clusters[i]
        candidates = [Candidate(prepared.warm_entries[j], float(s))
                      for j, s in zip(prepared.warm_top[i], prepared.warm_top_sims[i])]
        candidates = sorted(candidates + _top(stored_vecs[:len(stored)] @ vec, stored),
                            key=lambda c: -c.similarity)[:K]
        decision = rule.decide(text, candidates, arm, cluster, experiment_id=EXPERIMENT)
        judged = None
        if decision.hit:
            wrong = decision.served.entry.answer != label
            hits.append(True)
            wrongs.append(wrong)
            if rng.random() < hit_share:
                judged = (decision.served, wrong, hit_share)
        else:
            hits.append(False)
            wrongs.append(False)
            near = candidates[0] if candidates else None
            if near is not None and decision.threshold - band <= near.similarity and rng.random() < near_share:
                judged = (near, near.entry.answer != label, near_share)
            stored_vecs[len(stored)] = vec
            stored.append(_entry(f"l{i}", text, label, cluster))
        if judged is not None:
            verdicts += 1
            found, wrong, check_prob = judged
            rule.verdicts.record(Judged(EXPERIMENT, arm.name, found.entry.entry_id, found.entry.intent_cluster,
                                        float(found.similarity), wrong, check_prob if weighted else 1.0))
        sources.append(decision.threshold_source or "static")
        thresholds.append(min(decision.threshold, 1.0))
    return summarise(np.array(hits), np.array(wrongs), sources, thresholds, window, verdicts)


def _entry(entry_id: str, text: str, label: str, cluster: int) -> CacheEntry:
    return CacheEntry(entry_id=entry_id, query=text, embedding=np.zeros(1, np.float32), answer=label,
                      created_at=0.0, ttl_s=1e9, ttl_policy="absolute", max_age_s=1e9, namespace="default",
                      intent_cluster=cluster)


def _top(sims: np.ndarray, entries: list[CacheEntry]) -> list[Candidate]:
    if len(sims) == 0:
        return []
    top = np.argpartition(-sims, min(K, len(sims) - 1))[:K]
    return [Candidate(entries[j], float(sims[j])) for j in top]


def summarise(hits: np.ndarray, wrongs: np.ndarray, sources: list[str], thresholds: list[float], window: int,
              verdicts: int) -> dict:
    n = len(hits)
    windows = []
    for start in range(0, n, window):
        h, w = hits[start:start + window], wrongs[start:start + window]
        windows.append({"start": start, "hit_rate": float(h.mean()),
                        "false_hit_rate": float(w.sum() / max(h.sum(), 1))})
    share = {s: sources.count(s) / n for s in ("entry", "cluster", "arm", "static")}
    first = slice(0, window)
    second = slice(n // 2, n)
    return {"queries": n, "hits": int(hits.sum()), "false_hits": int(wrongs.sum()),
            "hit_rate": float(hits.mean()), "false_hit_rate": float(wrongs.sum() / max(hits.sum(), 1)),
            "correct_hit_rate": float((hits & ~wrongs).mean()),
            "second_half": {"hit_rate": float(hits[second].mean()),
                            "false_hit_rate": float(wrongs[second].sum() / max(hits[second].sum(), 1))},
            "first_window": {"queries": len(hits[first]), "hits": int(hits[first].sum()),
                             "false_hits": int(wrongs[first].sum()),
                             "false_hit_rate": float(wrongs[first].sum() / max(hits[first].sum(), 1))},
            "verdicts": verdicts, "source_share": share, "median_threshold": float(np.median(thresholds)),
            "windows": windows}


def run(stream: Stream, args) -> dict:
    prepared = prepare(stream)
    opts = dict(hit_share=args.hit_share, near_share=args.near_miss_share, band=args.band, seed=args.seed,
                window=args.window, weighted=not args.unweighted)
    started = time.perf_counter()
    sweep = {t: simulate(prepared, ArmConfig(name="global", threshold=t), **opts) for t in args.grid}
    print(f"\n== {stream.name}: {len(stream.warm_texts)} warm entries, {len(stream.live_texts)} live queries ==")
    print("global threshold   hit rate   false-hit rate")
    for t, r in sweep.items():
        print(f"  {t:.2f}            {r['hit_rate']:6.1%}     {r['false_hit_rate']:6.1%}")
    result = {"stream": stream.name, "warm": len(stream.warm_texts), "live": len(stream.live_texts),
              "global": {f"{t:.2f}": r for t, r in sweep.items()}, "best_global": {},
              "error_bounded": {name: {} for name in args.estimators}}
    for delta in args.deltas:
        fitting = [t for t, r in sweep.items() if r["false_hit_rate"] <= delta]
        best = min(fitting) if fitting else None
        result["best_global"][str(delta)] = None if best is None else {"threshold": best, **sweep[best]}
        base = sweep[best] if best is not None else None
        print(f"δ={delta:.2f}: best global cut {'none' if best is None else f'{best:.2f}'}"
              + ("" if base is None else f" hit {base['hit_rate']:.1%} false {base['false_hit_rate']:.1%}"))
        for name in args.estimators:
            bounded = simulate(prepared, bounded_arm(name, delta, args, args.start_threshold), **opts)
            result["error_bounded"][name][str(delta)] = bounded
            print(f"   {name:>9}: hit {bounded['hit_rate']:.1%} false {bounded['false_hit_rate']:.1%}"
                  f" (2nd half: hit {bounded['second_half']['hit_rate']:.1%} false "
                  f"{bounded['second_half']['false_hit_rate']:.1%}), verdicts {bounded['verdicts']}, decided by "
                  + ", ".join(f"{k} {v:.0%}" for k, v in bounded["source_share"].items()), flush=True)
            if args.compare_audit and name == "curves":
                before = simulate(prepared, bounded_arm(name, delta, args, args.start_threshold, audit=False), **opts)
                bounded["audit_off"] = before
                print(f"   {'':>9}  without the audit (the curves alone, before): hit {before['hit_rate']:.1%} "
                      f"false {before['false_hit_rate']:.1%} ({before['false_hits']} of {before['hits']}; "
                      f"2nd half {before['second_half']['hit_rate']:.1%} / {before['second_half']['false_hit_rate']:.1%})"
                      f" vs {bounded['false_hits']} of {bounded['hits']}", flush=True)
            if args.compare_start:
                before = simulate(prepared, bounded_arm(name, delta, args, args.start), **opts)
                bounded["start_before"] = before
                print(f"   {'':>9}  first {args.window} queries, start {args.start:.2f} (before) vs "
                      f"{max(args.start, bounded_arm(name, delta, args, args.start_threshold).threshold_policy.start_threshold):.2f}:"
                      f" {_first(before)} vs {_first(bounded)}; whole run hit {before['hit_rate']:.1%} false "
                      f"{before['false_hit_rate']:.1%} vs {bounded['hit_rate']:.1%} false "
                      f"{bounded['false_hit_rate']:.1%}", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")
    return result


def bounded_arm(estimator: str, delta: float, args, start_threshold: float | None, audit: bool = True) -> ArmConfig:
    """The error-bounded arm: threshold ``--start``, ``start_threshold`` (None: the policy's default),
    ``audit`` (False: the curves' cuts alone, as before the audit)."""
    policy = {"kind": "error_bounded", "delta": delta, "estimator": estimator, "confidence": args.confidence,
              "audit": audit}
    if start_threshold is not None:
        policy["start_threshold"] = start_threshold
    return ArmConfig(name=f"bound-{estimator}-{delta}", threshold=args.start, threshold_policy=policy)


def _first(r: dict) -> str:
    f = r["first_window"]
    return (f"{f['false_hits']} wrong of {f['hits']} hits ({f['false_hit_rate']:.1%}; "
            f"{f['false_hits'] / max(r['false_hits'], 1):.0%} of the run's wrong hits)")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 3, figsize=(16, 4.6 * len(results)), squeeze=False)
    styles = {"curves": ("*", "-"), "staircase": ("x", ":")}
    colours = dict(zip(DELTAS, ("tab:blue", "tab:orange", "tab:green")))
    for row, result in zip(axes, results):
        sweep = result["global"]
        row[0].plot([r["false_hit_rate"] for r in sweep.values()], [r["hit_rate"] for r in sweep.values()],
                    "o-", color="grey", ms=3, label="global thresholds 0.70–0.99")
        for name, by_delta in result["error_bounded"].items():
            for delta, r in by_delta.items():
                row[0].plot(r["false_hit_rate"], r["hit_rate"], styles.get(name, ("o", "-"))[0], ms=11,
                            color=colours.get(float(delta)), label=f"{name} δ={delta}")
                if "audit_off" in r:  # --compare-audit: the curves alone (before), hollow
                    off = r["audit_off"]
                    row[0].plot(off["false_hit_rate"], off["hit_rate"], "*", ms=11, mfc="none",
                                color=colours.get(float(delta)), label=f"{name} alone δ={delta}")
        for delta in result["best_global"]:
            row[0].axvline(float(delta), ls=":", lw=0.8, color=colours.get(float(delta), "k"))
        row[0].set(xlabel="false-hit rate (wrong share of hits)", ylabel="hit rate", title=result["stream"])
        row[0].legend(fontsize=7)
        for col, metric in ((1, "false_hit_rate"), (2, "hit_rate")):
            for name, by_delta in result["error_bounded"].items():
                for delta, r in by_delta.items():
                    row[col].plot([w["start"] for w in r["windows"]], [w[metric] for w in r["windows"]],
                                  ls=styles.get(name, ("o", "-"))[1], color=colours.get(float(delta)),
                                  label=f"{name} δ={delta}")
            for delta, best in result["best_global"].items():
                if best is not None:
                    row[col].plot([w["start"] for w in best["windows"]], [w[metric] for w in best["windows"]],
                                  ls="--", lw=0.8, color=colours.get(float(delta)),
                                  label=f"best global for {delta} ({best['threshold']})")
                if metric == "false_hit_rate":
                    row[col].axhline(float(delta), ls=":", lw=0.8, color=colours.get(float(delta)))
            row[col].set(xlabel="live query", ylabel=metric.replace("_", " "),
                         title=f"{metric.replace('_', ' ')} over time (solid: curves, dotted: staircase)")
            row[col].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.error_bound", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=BANKING77_DIR)
    parser.add_argument("--mock", type=Path, default=shared_data_dir() / "gptcache-mock" / "mock_data.json")
    parser.add_argument("--hit-share", type=float, default=0.25, help="share of hits that get a verdict")
    parser.add_argument("--near-miss-share", type=float, default=1.0, help="share of near-misses that get one")
    parser.add_argument("--band", type=float, default=0.1, help="near-miss band below the threshold used")
    parser.add_argument("--start", type=float, default=0.90, help="the error-bounded arm's threshold until it learns")
    parser.add_argument("--start-threshold", type=float, default=None,
                        help="the policy's start_threshold (default: its own, 1.0)")
    parser.add_argument("--compare-start", action="store_true",
                        help="also replay each arm with start_threshold = --start (the unbounded start)")
    parser.add_argument("--compare-audit", action="store_true",
                        help="also replay each curves arm with audit: false (the curves alone: before the audit)")
    parser.add_argument("--unweighted", action="store_true",
                        help="record every verdict with check probability 1 (no 1/p weights: the fits before)")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--warm-share", type=float, default=1.0, help="share of train that warms the cache")
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--grid", type=float, nargs="+", default=list(GLOBAL_GRID), help="global thresholds")
    parser.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS))
    parser.add_argument("--estimators", nargs="+", choices=("curves", "staircase"),
                        default=["staircase", "curves"], help="the error-bounded estimators compared")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix-gptcache", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/error_bound"))
    args = parser.parse_args(argv)
    for name in ("hit_share", "near_miss_share", "warm_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    try:
        stream = banking77_stream(args.data, args.warm_share, args.seed)
        streams = [stream] + ([with_gptcache(stream, args.mock, args.seed)] if args.mix_gptcache else [])
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read the data: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    results = [run(s, args) for s in streams]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.with_suffix(".json").write_text(json.dumps({"params": params, "results": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
