"""The judge the way a user gets it: the product's own commands on files, timed whole.

    python -m bench.judge_user_path [--sets mrpc stsb banking77] [--own-pairs 3000] [--public] [--seed 0]

For each public set with a train and a test split (MRPC, STS-B by default; banking77's questions
paired with their nearest neighbours, its test split ~6,800 pairs), the train split is written as a
user's export would be (Quora's columns: ``question1, question2, is_duplicate``) and the test split
likewise; then, as separate processes, exactly what README tells a user to run:

* ``judge-train --pairs train.csv --max-pairs N`` (a judge on the user's own labels only, reading
  a copy of the encoder tuned on them, the default), and the same with ``--no-tuned-encoder`` (the
  cache's encoder as it is), side by side;
* with ``--public``, once: ``judge-train --shared-data ../shared/data`` (the public sets alone;
  it has seen the other split of each set, so this is not the never-seen-kind case:
  bench.judge_unseen_kind measures that);
* ``judge-eval --pairs test.csv --version ...`` on the test split, which no judge trained on.

Prints and records, per set and target, what each judge's arm would serve (share of the
duplicates, wrong share of hits) beside the best cosine threshold on the same test pairs, and
each command's wall time; and the judge's added time per lookup of the two own-label judges,
loaded from their directory as a replica loads them (five candidates; cold: every candidate's
token vectors computed; warm: candidates seen before, only the new question encoded), measured
in alternating rounds so that the machine's load falls on both alike. Judges and files live
under $SCACHE_HOME/bench/user-path, not in the cache's judge directory. Writes
bench/results/judge_user_path.{json,md,png} (``-<sets>`` for other sets, ``-seed<N>`` for another seed).
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cache_core.decision.judge_shared_pairs import human_pairs
from cache_core.runtime import scache_home
from infra.runtime import REPO_ROOT, shared_data_dir

log = logging.getLogger("bench.judge_user_path")
RESULTS = REPO_ROOT / "bench" / "results"
SETS = ("mrpc", "stsb", "banking77")
"""The sets with a test split of pairs: MRPC's and STS-B's human labels, and banking77's questions
paired with their nearest neighbours (same intent: a duplicate), as judge_shared_pairs makes them."""


def write_quora_style(rows, path: Path) -> None:
    """(cached, query, label, source) rows as a Quora export's columns."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "question1", "question2", "is_duplicate"])
        out.writerows((i, cached, query, label) for i, (cached, query, label, _) in enumerate(rows))


def run(module: str, args: list[str]) -> float:
    """Run ``python -m module args`` as a user would; its wall time in seconds."""
    started = time.monotonic()
    log.info("python -m %s %s", module, " ".join(args))
    subprocess.run([sys.executable, "-m", module, *args], check=True, cwd=REPO_ROOT)
    return round(time.monotonic() - started, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.judge_user_path", description=__doc__.splitlines()[0])
    p.add_argument("--sets", nargs="+", choices=SETS, default=["mrpc", "stsb"])
    p.add_argument("--own-pairs", type=int, default=3000, help="judge-train --max-pairs for the user's file")
    p.add_argument("--public", action="store_true", help="also train and check a judge on the public sets alone")
    p.add_argument("--seed", type=int, default=0,
                   help="judge-train --seed (its sample of the file, folds, tuning); results of a seed other than 0 "
                        "are written as judge_user_path[-<sets>]-seed<N>.*")
    args = p.parse_args(argv)
    if args.own_pairs < 50:
        p.error(f"--own-pairs must be at least 50, got {args.own_pairs}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = scache_home() / "bench" / "user-path"
    judges = work / "judges"
    work.mkdir(parents=True, exist_ok=True)
    pairs = {split: rows for name in args.sets for split, rows in set_pairs(name).items()}
    out = {"own_pairs": args.own_pairs, "seed": args.seed, "sets": {}}
    if args.public:
        out["public_train_s"] = run("cache_core.decision.judge_train", ["--shared-data", str(shared_data_dir()),
                                                                        "--version", "userpath-public",
                                                                        "--out", str(judges)])
    for name in args.sets:
        train_csv, test_csv = work / f"{name}-train.csv", work / f"{name}-test.csv"
        write_quora_style(pairs[f"{name}-train"], train_csv)
        write_quora_style(pairs[f"{name}-test"], test_csv)
        own, untuned = f"userpath-{name}", f"userpath-{name}-cache-encoder"
        own_args = ["--pairs", str(train_csv), "--max-pairs", str(args.own_pairs), "--out", str(judges),
                    "--seed", str(args.seed)]
        train_s = run("cache_core.decision.judge_train", [*own_args, "--version", own])
        untuned_s = run("cache_core.decision.judge_train", [*own_args, "--version", untuned, "--no-tuned-encoder"])
        versions = [own, untuned] + (["userpath-public"] if args.public else [])
        report = work / f"{name}-eval.json"
        eval_s = run("cache_core.decision.judge_eval", ["--pairs", str(test_csv), "--dir", str(judges),
                                                        "--report", str(report),
                                                        *[a for v in versions for a in ("--version", v)]])
        out["sets"][name] = json.loads(report.read_text()) | {"train_s": train_s, "untuned_train_s": untuned_s,
                                                              "eval_s": eval_s, "own_version": own,
                                                              "untuned_version": untuned}
        out["sets"][name]["latency_ms"] = latency(judges, [own, untuned],
                                               [t for r in pairs[f"{name}-test"] for t in r[:2]])
    RESULTS.mkdir(exist_ok=True)
    default_sets = args.sets == p.get_default("sets")
    stem = ("judge_user_path" + ("" if default_sets else "-" + "-".join(args.sets))
            + (f"-seed{args.seed}" if args.seed else ""))
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1))
    table = markdown(out)
    (RESULTS / f"{stem}.md").write_text(table)
    plot(out, RESULTS / f"{stem}.png")
    print(table)
    return 0


def set_pairs(name: str) -> dict[str, list]:
    """``name``'s train and test rows as (cached, query, label, source)."""
    if name != "banking77":
        return human_pairs(shared_data_dir(), name)
    from cache_core.decision.judge_shared_pairs import load_pairs
    from cache_core.embedding.load import load_embedder
    from cache_core.settings import CacheSettings

    made = load_pairs(shared_data_dir(), load_embedder(CacheSettings()).encode)
    return {split: made[split] for split in ("banking77-train", "banking77-test")}


def latency(judges: Path, versions: list[str], texts: list[str], rounds: int = 4, per_round: int = 30) -> dict:
    """Per version, p50 / p99 ms of ``score_many`` with five candidates, cold (texts no lookup
    used before) and warm (the same five candidates every time)."""
    from cache_core.decision.judge_model import JudgeShelf
    from cache_core.decision.judge_tokens import token_encoder
    from cache_core.settings import CacheSettings

    settings = CacheSettings()
    shelf = JudgeShelf(judges, tokens=lambda: token_encoder(settings.model, settings.models_dir))
    scorers = {v: shelf.judge(v, 0.5) for v in versions}
    texts = list(dict.fromkeys(texts))
    per_round = min(per_round, (len(texts) - 5) // (rounds * len(versions) * 7))
    pool, fresh = texts[:5], iter(texts[5:])  # the warm candidates recur, as a popular entry's do
    times = {(v, kind): [] for v in versions for kind in ("cold", "warm")}
    for scorer in scorers.values():
        scorer.score_many("warm-up", pool, [0.8] * 5)
    for _ in range(rounds):
        for version, scorer in scorers.items():
            for _ in range(per_round):
                for kind in ("cold", "warm"):
                    query = next(fresh)
                    candidates = [next(fresh) for _ in range(5)] if kind == "cold" else pool
                    started = time.perf_counter()
                    scorer.score_many(query, candidates, [0.8] * 5)
                    times[(version, kind)].append((time.perf_counter() - started) * 1e3)
    return {f"{v} {kind}": {"p50": round(float(np.percentile(t, 50)), 2), "p99": round(float(np.percentile(t, 99)), 2)}
            for (v, kind), t in times.items()}


def markdown(out: dict) -> str:
    lines = ["# The judge through the product's commands (judge-train, judge-eval)", "",
             f"Own labels: a seeded sample of {out['own_pairs']} pairs of the set's train split (Quora's columns); "
             "checked on its test split. Cells: share of the duplicates served (wrong share of hits) at the cut a "
             "judged arm serves at, floor 0.60; cosine: the best threshold on the same test pairs (an oracle).", "",
             "| set | target | own labels, tuned encoder (default) | own labels, cache's encoder | public sets alone "
             "| cosine, best cut |", "|---|---|---|---|---|---|"]
    for name, res in out["sets"].items():
        for key, cos in res["cosine_oracle"].items():
            cells = []
            for version in (res["own_version"], res.get("untuned_version"), "userpath-public"):
                row = res["judges"].get(version, {}).get(key)
                if row is None:
                    cells.append("-")
                    continue
                wrong = "no hit" if row["false_hit"] is None else f"{row['false_hit']:.1%}"
                cells.append(f"{row['recall']:.1%} ({wrong})")
            lines.append(f"| {name} ({res['duplicates']} dup / {res['rows']}) | {float(key):.0%} | "
                         f"{cells[0]} | {cells[1]} | {cells[2]} | {cos:.1%} |")
    lines += ["", "Wall time: " + "; ".join(f"{name}: judge-train {res['train_s']} s (cache's encoder "
                                             f"{res.get('untuned_train_s', '-')} s), judge-eval {res['eval_s']} s"
                                             for name, res in out["sets"].items())
              + (f"; judge-train --shared-data {out['public_train_s']} s" if "public_train_s" in out else "") + "."]
    lines += ["", "Added time per lookup, five candidates, p50 / p99 ms (alternating rounds): " + "; ".join(
        f"{name} {label}: {t['p50']} / {t['p99']}" for name, res in out["sets"].items()
        for label, t in res.get("latency_ms", {}).items()) + "."]
    return "\n".join(lines) + "\n"


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(out["sets"]), figsize=(5 * len(out["sets"]), 4), squeeze=False)
    for ax, (name, res) in zip(axes[0], out["sets"].items()):
        keys = list(res["cosine_oracle"])
        x = range(len(keys))
        bars = {"own labels, tuned encoder": [res["judges"][res["own_version"]][k]["recall"] for k in keys],
                "own labels, cache's encoder": [res["judges"][res["untuned_version"]][k]["recall"] for k in keys],
                "cosine, best cut": [res["cosine_oracle"][k] for k in keys]}
        if "userpath-public" in res["judges"]:
            bars["public sets alone"] = [res["judges"]["userpath-public"][k]["recall"] for k in keys]
        width = 0.8 / len(bars)
        for i, (label, values) in enumerate(bars.items()):
            ax.bar([j + i * width for j in x], [v * 100 for v in values], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in x], [f"{float(k):.0%} wrong" for k in keys])
        ax.set(ylabel="true duplicates served (%)", title=f"{name}: test pairs no judge trained on")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
