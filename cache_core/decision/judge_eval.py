"""Check judges on labelled pairs they never saw: ``python -m cache_core.decision.judge_eval``.

    ./scache judge-eval --pairs later_pairs.csv --version v2 --version v3 [--floor 0.60]

Before a judge goes out as a canary: ``judge-train``'s report rests on rows of its own training
file; this reads a file the judges never saw (a later sample of your labels or verdicts, in any
format ``judge-train --pairs`` reads) and scores each pair as a judged arm scores a lookup's
candidate: the cache's own encoder's cosine must reach the arm's floor (``--floor``, the arm's
``threshold``), then the judge's probability must reach the cut the arm serves at for each target
(``judge: {max_false_hit_rate: t}``, ``JudgeArtifact.accept_at``). One candidate per pair, so the
judge's pick among several candidates is not in it.

Per target and version it prints the share of the true duplicates served and the wrong share of
those hits, beside two oracle cuts picked with these very labels: the judge's own ranking above the
floor, and a plain cosine threshold (what a cosine arm could serve at best, for a fair "did the
judge help"). A report goes to ``--report`` (JSON, and a PNG of served against wrong share
beside it when matplotlib is installed). Bad input is a one-line error and exit 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from cache_core.decision.judge_cuts import TARGETS, at_cuts, best_cut_served, curve
from cache_core.decision.judge_model import JudgeArtifact, JudgeLoadError, artifact_name
from cache_core.decision.judge_pairs_file import PairsError, read_pairs_file

log = logging.getLogger("cache_core.decision.judge_eval")

DEFAULT_FLOOR = 0.60
"""The floor README's judged arm uses (``threshold: 0.60``): candidates below it are never judged."""
MIN_PLOTTED_HITS = 20


def evaluate(artifact: JudgeArtifact, X: np.ndarray, y: np.ndarray, floor: float) -> dict:
    """Per target (``judge_cuts.at_cuts``): what the cut its arm serves at serves above ``floor``,
    and ``oracle_recall``, the judge's own ranking at the best cut there."""
    prob, above_floor = artifact.probabilities(X), X[:, 0] >= floor
    judged = np.where(above_floor, prob, -np.inf)  # below the floor a candidate is never judged
    out = at_cuts(judged, y, {f"{t:.2f}": artifact.accept_at(t) for t in TARGETS})
    for key, row in out.items():
        row["oracle_recall"] = best_cut_served(prob, y, float(key), above_floor)
    return out


def cosine_oracle(X: np.ndarray, y: np.ndarray) -> dict:
    """Per target, the most a plain cosine threshold serves on these pairs."""
    return {f"{t:.2f}": best_cut_served(X[:, 0], y, t) for t in TARGETS}


def table(results: dict[str, dict], cosine: dict, y: np.ndarray, floor: float) -> list[str]:
    lines = [f"{len(y)} pairs, {int(y.sum())} duplicates; floor {floor:.2f}. Served = share of the duplicates; "
             "oracle = the best cut on these very pairs.",
             "| target | " + " | ".join(f"judge {v}: served (hits, wrong) | judge {v}: oracle" for v in results)
             + " | cosine: oracle |",
             "|---|" + "---|---|" * len(results) + "---|"]
    for key in cosine:
        cells = []
        for row in (r[key] for r in results.values()):
            wrong = "no hit" if row["false_hit"] is None else f"{row['false_hit']:.1%} wrong"
            cells += [f"{row['recall']:.1%} ({row['hits']} hits, {wrong})", f"{row['oracle_recall']:.1%}"]
        lines.append(f"| {float(key):.0%} | " + " | ".join(cells) + f" | {cosine[key]:.1%} |")
    return lines


def plot(artifacts: dict[str, JudgeArtifact], Xs: dict[str, np.ndarray], y: np.ndarray, results: dict,
         floor: float, path: Path) -> bool:
    """Served share against wrong share of hits along every cut, each judge's shipped cuts marked
    (``Xs``: each version's feature matrix; column 0, the cache's cosine, is the same in all)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    X = next(iter(Xs.values()))
    above = X[:, 0] >= floor
    share = y[above].sum() / max(y.sum(), 1)
    lines = {f"judge {v}": (a.probabilities(Xs[v])[above], y[above], share) for v, a in artifacts.items()}
    lines["cosine"] = (X[:, 0], y, 1.0)
    for i, (name, (score, labels, scale)) in enumerate(lines.items()):
        c = curve(score, labels)
        settled = c["right"] + c["wrong"] >= MIN_PLOTTED_HITS  # the first few hits swing the share from 0 to 100%
        ax.plot(c["false_hit"][settled] * 100, c["recall"][settled] * scale * 100, color=f"C{i}", label=name)
    for i, row in enumerate(results.values()):
        pts = [(r["false_hit"] * 100, r["recall"] * 100) for r in row.values() if r["false_hit"] is not None]
        if pts:
            ax.scatter(*zip(*pts), color=f"C{i}", zorder=3)
    ax.set(xlim=(0, 30), xlabel="wrong share of hits (%)", ylabel="true duplicates served (%)",
           title=f"judges on {len(y)} pairs they never saw (dots: the cuts arms serve at)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cache_core.decision.judge_eval",
                                description="Check judge artifacts on labelled pairs they never saw.")
    p.add_argument("--pairs", type=Path, required=True,
                   help="CSV / TSV (header) or JSON Lines: query, cached_query, label (as judge-train reads)")
    p.add_argument("--version", action="append", required=True, help="a judge version to check (repeat to compare)")
    p.add_argument("--dir", type=Path, help="artifact directory (default: the cache's judge_dir setting)")
    p.add_argument("--floor", type=float, default=DEFAULT_FLOOR,
                   help="the judged arm's cosine floor, its threshold (default %(default)s)")
    p.add_argument("--report", type=Path, help="write the figures as JSON here, and a PNG beside it")
    return p


def own_encoder_features(artifact: JudgeArtifact, directory: Path, pairs, encode) -> np.ndarray:
    """The pairs' features as a judge with its own tuned encoder reads them (its token pass)."""
    from cache_core.decision.judge_model import own_token_encoder
    from cache_core.decision.judge_train import featurise

    return featurise(pairs, encode, own_token_encoder(directory, artifact), encoder_cosine=True)


def main(argv: list[str] | None = None) -> int:
    from cache_core.decision.judge_feature_store import feature_store_for
    from cache_core.decision.judge_tokens import training_encoders
    from cache_core.decision.judge_train import features_of
    from cache_core.settings import get_settings

    args = _parser().parse_args(argv)
    if not -1.0 <= args.floor <= 1.0:
        _parser().error(f"--floor is a cosine, within -1 and 1; got {args.floor}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    settings = get_settings().cache
    directory = args.dir or Path(settings.judge_dir)
    try:
        artifacts = {v: JudgeArtifact.load(directory / artifact_name(v)) for v in dict.fromkeys(args.version)}
        for version, artifact in artifacts.items():
            if artifact.encoder != settings.model:
                raise JudgeLoadError(f"judge {version} reads {artifact.encoder}'s vectors; this cache encodes with "
                                     f"{settings.model} (SCACHE_CACHE__MODEL)")
        pairs = read_pairs_file(args.pairs).pairs
    except (JudgeLoadError, PairsError, ValueError, OSError) as exc:
        print(f"judge_eval: {exc}", file=sys.stderr)
        return 2
    encode, tokens = training_encoders(settings)
    X = features_of(pairs, encode, tokens, feature_store_for(settings))
    try:
        Xs = {v: own_encoder_features(a, directory, pairs, encode) if a.reads_tuned_encoder else X
              for v, a in artifacts.items()}
    except JudgeLoadError as exc:
        print(f"judge_eval: {exc}", file=sys.stderr)
        return 2
    y = np.array([p[2] for p in pairs], dtype=int)
    results = {v: evaluate(a, Xs[v], y, args.floor) for v, a in artifacts.items()}
    cosine = cosine_oracle(X, y)
    print("\n".join(table(results, cosine, y, args.floor)))
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"pairs": str(args.pairs), "rows": len(y), "duplicates": int(y.sum()),
                                           "floor": args.floor, "judges": results, "cosine_oracle": cosine},
                                          indent=1))
        drawn = plot(artifacts, Xs, y, results, args.floor, args.report.with_suffix(".png"))
        print(f"wrote {args.report}" + (f" and {args.report.with_suffix('.png')}" if drawn else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
